"""Hostile HTTP input to the live servers (issue 26): fuzzed JSON bodies, raw bytes and
headers sent to ``fleetsim emulate`` and to a gateway in front of it. Every answer is a
client error or a success in the OpenAI error shape, never a 5xx or a dropped connection, and
the servers still serve a plain request afterwards (loopback only; every server started here
is stopped here; the request count and every wait are bounded)."""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetsim.live.emulate import emulated_backend
from fleetsim.live.gateway import Gateway
from fleetsim.live.server import ServerThread

MODEL = "llama-3.1-8b"
PATHS = ("/v1/completions", "/v1/chat/completions")
KEYS = ("model", "prompt", "messages", "max_tokens", "stream", "n", "temperature", "stop",
        "max_completion_tokens", "ignore_eos", "stream_options", "min_tokens")

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
# Bodies near the schema reach the validators; arbitrary values reach the parser.
bodies = st.one_of(
    st.fixed_dictionaries({}, optional={k: json_value for k in KEYS}),
    st.fixed_dictionaries({"model": st.just(MODEL)},
                          optional={k: json_value for k in KEYS if k != "model"}),
    json_value)
# Printable ASCII; no leading or trailing blank (the client itself refuses to send one).
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                      max_size=60).map(str.strip)
headers = st.dictionaries(st.sampled_from(["x-request-id", "content-type", "accept",
                                           "authorization", "x-fleetsim-anything"]),
                          header_text, max_size=3)


@pytest.fixture(scope="module")
def servers():
    with ExitStack() as stack:
        backend = ServerThread(lambda: emulated_backend(speed=50.0))
        backend_url = stack.enter_context(backend)
        gateway = ServerThread(lambda: Gateway([backend_url], router="round_robin"))
        gateway_url = stack.enter_context(gateway)
        with httpx.Client(timeout=20.0) as client:
            yield client, (backend_url, gateway_url)


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(PATHS), extra=headers, to_gateway=st.booleans())
def test_fuzzed_json_bodies_get_a_client_error_or_an_answer(servers, body, path, extra,
                                                            to_gateway):
    client, urls = servers
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = max(1, min(body["max_tokens"], 8))  # bounded work per example
    body = {**body, "stream": False} if isinstance(body, dict) else body
    content = json.dumps(body).encode()
    hdrs = {**extra, "content-type": "application/json"}
    _check(client.post(urls[to_gateway] + path, content=content, headers=hdrs))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), path=st.sampled_from(PATHS), to_gateway=st.booleans())
def test_raw_bytes_are_a_client_error(servers, raw, path, to_gateway):
    client, urls = servers
    response = client.post(urls[to_gateway] + path, content=raw,
                           headers={"content-type": "application/json"})
    _check(response)


def test_the_servers_still_serve_after_the_fuzzing(servers):
    client, urls = servers
    for url in urls:
        r = client.post(url + "/v1/completions",
                        json={"model": MODEL, "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
