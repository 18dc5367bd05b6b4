"""The OpenAI API as both servers speak it: request validation, error objects, responses.

Bad requests get HTTP 400 and OpenAI's error object
``{"error": {"message", "type", "param", "code"}}``; overload gets 429 with ``Retry-After``.
A request names one prompt (``n = 1``); fields this emulation does not use (temperature,
top_p, stop, ...) are checked for their types and otherwise ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse

from fleetsim.live.tokens import Tokenize, tokenize

MAX_CHOICES = 256
"""Most completions one request may ask for (prompts x ``n``): each is an engine request."""
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
"""Largest request body accepted (8 MiB: about two million tokens of text)."""
ROLES = ("system", "user", "assistant", "tool", "developer")
# Optional fields and the JSON types they must have (None is allowed for each).
_NUMBER = (int, float)
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "temperature": _NUMBER, "top_p": _NUMBER, "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER, "seed": (int,), "user": (str,), "ignore_eos": (bool,),
    "min_tokens": (int,), "stop": (str, list), "logprobs": (bool, int), "echo": (bool,),
}


class ApiError(Exception):
    """An error to send as OpenAI's error object with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def overloaded(what: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(429, f"{what} is at capacity; retry after {retry_after_s} s",
                    kind="rate_limit_error", code="overloaded",
                    headers={"Retry-After": str(retry_after_s)})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion request."""

    kind: str
    """completions | chat"""
    body: dict[str, Any]
    """The JSON object as sent."""
    model: str
    prompt_tokens: list[str] | list[int]
    """The prompt as tokens (by the counting rule or the server's tokenizer), or the ids the
    client sent."""
    max_tokens: int | None
    stream: bool
    include_usage: bool
    prompts: tuple[list[str] | list[int], ...] = ()
    """Every prompt of a batched completions request (``prompt`` as a list of prompts, as
    vLLM accepts it); ``(prompt_tokens,)`` for one."""
    n: int = 1
    """Completions per prompt."""

    @property
    def num_prompt_tokens(self) -> int:
        """Over all prompts, each counted once however large ``n`` (vLLM's usage)."""
        return sum(len(p) for p in self.prompts) if self.prompts else len(self.prompt_tokens)

    @property
    def num_choices(self) -> int:
        """Choices of the answer: prompt ``p``'s ``j``-th completion has index ``p * n + j``
        (vLLM's order)."""
        return max(1, len(self.prompts)) * self.n


REQUEST_ID_HEADER = "x-request-id"
"""The request id vLLM's server takes from ``X-Request-Id`` and echoes (its
``--enable-request-id-headers``); the gateway forwards it, so one id names a request in every
trace of the loop (``compare --engine`` matches by it)."""
MAX_REQUEST_ID_CHARS = 256


def request_id_of(request: HttpRequest) -> str:
    """The client's ``X-Request-Id`` when it is printable ASCII of at most 256 characters,
    else a new random id (uuid4, as vLLM makes them)."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    if 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


async def read_json_body(request: HttpRequest, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, at most ``max_bytes`` (else 400)."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(400, f"request body exceeds {max_bytes} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise too_big
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"malformed JSON body: {err}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return data


def parse_request(kind: str, data: dict[str, Any],
                  tokenizer: Tokenize = tokenize) -> ParsedRequest:
    """Validate a completions or chat body (400 naming the field on any problem); a text
    prompt is split by ``tokenizer``."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "is required and must be a non-empty string")
    for name, types in OPTIONAL_FIELDS.items():
        value = data.get(name)
        if value is not None and (not isinstance(value, types) or
                                  (isinstance(value, bool) and bool not in types)):
            raise _invalid(name, f"must be of type {' or '.join(_type_name(t) for t in types)}")
    n = data.get("n")
    if n is None:
        n = 1
    if type(n) is not int or not 1 <= n <= MAX_CHOICES:
        raise _invalid("n", f"must be an integer in 1..{MAX_CHOICES}")
    prompts = ([_chat_prompt(data.get("messages"), tokenizer)] if kind == "chat"
               else _prompts(data.get("prompt"), tokenizer))
    if len(prompts) * n > MAX_CHOICES:
        raise _invalid("n", f"times the {len(prompts)} prompts asks for {len(prompts) * n} "
                       f"completions; at most {MAX_CHOICES} per request")
    max_tokens = data.get("max_tokens")
    if kind == "chat" and data.get("max_completion_tokens") is not None:
        max_tokens = data["max_completion_tokens"]
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise _invalid("max_tokens", "must be an integer >= 1")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _invalid("stream", "must be a boolean")
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _invalid("stream_options", "must be an object")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _invalid("stream_options.include_usage", "must be a boolean")
    return ParsedRequest(kind, data, model, prompts[0], max_tokens, stream, include_usage,
                         tuple(prompts), n)


def _prompts(prompt: Any, tokenizer: Tokenize) -> list[list[str] | list[int]]:
    """One prompt (a string, token ids) or a batch of them (a list of strings or of lists
    of token ids), as vLLM's completions endpoint takes them."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        out = []
        for i, p in enumerate(prompt):
            try:
                out.append(_prompt(p, tokenizer))
            except ApiError as err:
                raise _invalid(f"prompt[{i}]", err.message.split(" ", 1)[1]) from None
        return out
    return [_prompt(prompt, tokenizer)]


def _prompt(prompt: Any, tokenizer: Tokenize) -> list[str] | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise _invalid("prompt", "must not be empty")
        return tokenizer(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if any(not 0 <= t < 2**31 for t in prompt):
            raise _invalid("prompt", "token ids must be in [0, 2**31)")
        return prompt
    if prompt is None:
        raise _invalid("prompt", "is required")
    raise _invalid("prompt", "must be a non-empty string or a non-empty list of token ids")


def _chat_prompt(messages: Any, tokenizer: Tokenize) -> list[str] | list[int]:
    """The conversation as one prompt: each message as ``<|role|>\\ncontent\\n``, then the
    assistant's turn (a generic chat template)."""
    if messages is None:
        raise _invalid("messages", "is required")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "must be a non-empty list of messages")
    parts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _invalid(f"messages[{i}]", "must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise _invalid(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
        parts.append(f"<|{role}|>\n{_content_text(content, i)}\n")
    parts.append("<|assistant|>\n")
    return tokenizer("".join(parts))


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise _invalid(f"messages[{i}].content[{j}]",
                               "must be {\"type\": \"text\", \"text\": string}")
            texts.append(part["text"])
        return "".join(texts)
    raise _invalid(f"messages[{i}].content", "must be a string or a list of text parts")


def _invalid(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param} {what}", param=param, code="invalid_value")


def _type_name(t: type) -> str:
    return {int: "integer", float: "number", str: "string", bool: "boolean",
            list: "array"}.get(t, t.__name__)


# ---- responses -------------------------------------------------------------------------
def new_id(kind: str, request_id: str | None = None) -> str:
    """A response id, from the request's id as vLLM makes it (``cmpl-<X-Request-Id>``)."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + (request_id or uuid.uuid4().hex[:24])


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_output,
            "total_tokens": num_prompt + num_output}


def completion_body(req: ParsedRequest, rid: str, choices: list[tuple[str, str]],
                    num_output: int) -> dict[str, Any]:
    """The non-streaming response; ``choices``: (text, finish reason) by index."""
    base = {"id": rid, "created": int(time.time()), "model": req.model,
            "usage": usage(req.num_prompt_tokens, num_output)}
    if req.kind == "chat":
        return {**base, "object": "chat.completion", "choices": [
            {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": reason} for i, (text, reason) in enumerate(choices)]}
    return {**base, "object": "text_completion", "choices": [
        {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
        for i, (text, reason) in enumerate(choices)]}


def chunk_body(req: ParsedRequest, rid: str, created: int, text: str | None,
               finish_reason: str | None = None, *, first: bool = False,
               index: int = 0) -> dict[str, Any]:
    """One streamed chunk of choice ``index`` (``text`` None: the closing chunk with
    ``finish_reason``)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model,
            "choices": [choice]}


def usage_chunk(req: ParsedRequest, rid: str, created: int, num_output: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [],
            "usage": usage(req.num_prompt_tokens, num_output)}


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"
