"""Prompt tokens: a real tokenizer when given, else the counting rule; prefix hashes and
synthetic prompts.

A real tokenizer is a Hugging Face ``tokenizer.json`` on disk (``--tokenizer PATH``, the file
or the model folder that holds it), read by the ``tokenizers`` library; nothing is downloaded.
It counts as vLLM does for a completions prompt (special tokens such as BOS included). Without
one, the rule (documented in docs/live.md): a token is a run of one to four word characters, or
one other non-space character, each with at most one leading space; any other whitespace run
is one token. English text averages about four characters per token, close to the BPE
tokenizers of Llama and GPT models. A prompt given as token ids (``prompt: [int, ...]``, as
vLLM accepts) is counted exactly.

Prefix hashes are chained over whole blocks of ``block_tokens`` tokens (vLLM's automatic
prefix caching: a block's hash covers every token before it), as signed 64-bit ints.
"""

from __future__ import annotations

import hashlib
import re
import struct
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

TOKEN_RE = re.compile(r" ?\w{1,4}| ?[^\w\s]|\s+")
DEFAULT_HASH_BLOCK_TOKENS = 16
"""Tokens per prefix-hash block: vLLM's KV block size."""
FILLER_WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "on",
                "with", "be", "at", "by", "this", "had", "not", "are", "but", "from", "or",
                "have", "an", "they", "its", "one", "you", "were", "all", "we")
"""Output text of the emulated backend: each word (with its leading space) is one token."""
VOCAB_LOW, VOCAB_HIGH = 1000, 30000
"""Range of synthetic token ids (inside every Llama-family vocabulary)."""

Tokens = Sequence[str] | Sequence[int]
Tokenize = Callable[[str], "list[str] | list[int]"]
"""Text -> its tokens (strings by the rule, ids by a real tokenizer)."""


def tokenize(text: str) -> list[str]:
    """``text`` split by the counting rule above."""
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def load_tokenizer(path: str | None) -> Tokenize:
    """The tokenizer of ``path`` (a ``tokenizer.json`` or a folder holding one), or the rule
    when ``path`` is None. Bad input: ``FleetsimInputError`` naming ``--tokenizer``."""
    if path is None:
        return tokenize
    from fleetsim.errors import FleetsimInputError

    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise FleetsimInputError("--tokenizer", path, "no such file; give a tokenizer.json "
                                 "(or the model folder holding one), or leave the flag out "
                                 "for the documented counting rule")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise FleetsimInputError("--tokenizer", path, "needs the tokenizers package (pip "
                                 "install tokenizers), or leave the flag out for the "
                                 "documented counting rule") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # the library raises a bare Exception on a bad file
        raise FleetsimInputError("--tokenizer", path, f"not a tokenizer.json the tokenizers "
                                 f"library reads ({str(err)[:80]})") from None

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=True).ids)

    return encode


def prefix_hashes(tokens: Tokens, block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS) -> tuple[int, ...]:
    """Chained hashes of the whole ``block_tokens`` blocks of ``tokens`` (strings or ids)."""
    out: list[int] = []
    prev = b""
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = tokens[start:start + block_tokens]
        if block and isinstance(block[0], str):
            data = "\0".join(block).encode()  # type: ignore[arg-type]
        else:
            data = array("q", block).tobytes()  # type: ignore[arg-type]
        digest = hashlib.blake2b(prev + data, digest_size=8).digest()
        out.append(struct.unpack("<q", digest)[0])
        prev = digest
    return tuple(out)


def output_text(index: int) -> str:
    """The text of output token ``index`` (one token by the rule)."""
    return " " + FILLER_WORDS[index % len(FILLER_WORDS)]


def synthetic_prompt_ids(num_tokens: int, hash_ids: Sequence[int], hash_block_tokens: int,
                         seed: int) -> list[int]:
    """Token ids for a trace row: block ``j`` of ``hash_ids`` becomes the same
    ``hash_block_tokens`` ids wherever it appears (so rows that share hash ids share a real
    prefix); the rest comes from ``seed`` (unique to the row)."""
    ids: list[int] = []
    for h in hash_ids:
        if len(ids) >= num_tokens:
            break
        rng = np.random.default_rng(h & 0xFFFF_FFFF_FFFF_FFFF)
        ids.extend(rng.integers(VOCAB_LOW, VOCAB_HIGH, hash_block_tokens).tolist())
    ids = ids[:num_tokens]
    if len(ids) < num_tokens:
        rng = np.random.default_rng([seed, 0x5EED])
        ids.extend(rng.integers(VOCAB_LOW, VOCAB_HIGH, num_tokens - len(ids)).tolist())
    return ids


def synthetic_prompt_text(num_tokens: int, seed: int) -> str:
    """A text of exactly ``num_tokens`` tokens by the rule (for chat requests), unique to
    ``seed``."""
    rng = np.random.default_rng([seed, 0x7E47])
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = rng.choice(letters, size=(num_tokens, 4))
    return "".join(" " + bytes(w).decode() for w in words)
