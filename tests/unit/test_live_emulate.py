"""``fleetsim emulate``: the OpenAI API over the replica engine in real time (loopback only;
every server started here is stopped here; every wait is bounded)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from fleetsim.config import load_config
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.load import run_load
from fleetsim.live.server import ServerThread
from fleetsim.live.tokens import count_tokens
from fleetsim.run import run
from fleetsim.workloads import Workload

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"
TIMEOUT_S = 20.0


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def fast_backend():
    """One emulated backend at 20x real time for the tests that only read answers."""
    server = ServerThread(lambda: emulated_backend(speed=20.0))
    with server as url:
        yield url, server


def test_completions_and_chat_with_the_openai_client(fast_backend):
    url, _ = fast_backend
    c = client(url)
    r = c.completions.create(model=MODEL, prompt="the quick brown fox " * 50, max_tokens=12)
    # "the| quic|k| brow|n| fox" per repeat, and the last space alone
    assert r.usage.prompt_tokens == count_tokens("the quick brown fox " * 50) == 301
    assert r.usage.completion_tokens == 12 == count_tokens(r.choices[0].text)
    assert r.choices[0].finish_reason == "length"
    chat = c.chat.completions.create(model=MODEL, max_tokens=5,
                                     messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.role == "assistant"
    assert count_tokens(chat.choices[0].message.content) == 5
    assert [m.id for m in c.models.list().data] == [MODEL]


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_streams_one_event_per_token_and_usage_last(fast_backend, kind):
    url, _ = fast_backend
    c = client(url)
    opts = {"model": MODEL, "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True}}
    if kind == "chat":
        chunks = list(c.chat.completions.create(
            messages=[{"role": "user", "content": "hi"}], **opts))
        texts = [ch.choices[0].delta.content for ch in chunks if ch.choices
                 and ch.choices[0].delta.content]
    else:
        chunks = list(c.completions.create(prompt=[11, 12, 13, 14], **opts))
        texts = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
    assert len(texts) == 7
    assert chunks[-1].usage.completion_tokens == 7
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    if kind == "completions":
        assert chunks[-1].usage.prompt_tokens == 4  # token ids are counted as given


def test_without_max_tokens_the_length_is_sampled(fast_backend):
    url, _ = fast_backend
    r = client(url).completions.create(model=MODEL, prompt="tell me a story")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens >= 1


@pytest.mark.parametrize(("body", "param"), [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"prompt": "hi", "max_tokens": 3}).encode(), "model"),
    (json.dumps({"model": MODEL, "max_tokens": 3}).encode(), "prompt"),
    (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": "3"}).encode(), "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "hi", "stream": "yes"}).encode(), "stream"),
    (json.dumps({"model": MODEL, "prompt": "hi", "temperature": "hot"}).encode(),
     "temperature"),
    (json.dumps({"model": MODEL, "prompt": ["a", ""]}).encode(), "prompt[1]"),
    (json.dumps({"model": MODEL, "prompt": "hi", "n": 0}).encode(), "n"),
    (json.dumps({"model": MODEL, "prompt": ["a"] * 20, "n": 20}).encode(), "n"),
    (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 200_000}).encode(),
     "max_tokens"),
    (b'{"model": "llama-3.1-8b", "prompt": "' + b"x " * (9 * 2**20 // 2) + b'"}', None),
])
def test_bad_requests_get_400_with_an_openai_error_object(fast_backend, body, param):
    url, _ = fast_backend
    r = httpx.post(f"{url}/v1/completions", content=body, timeout=TIMEOUT_S,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_chat_message_errors_and_unknown_model(fast_backend):
    url, _ = fast_backend
    bad = {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=bad, timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    with pytest.raises(openai.NotFoundError):
        client(url).completions.create(model="gpt-9", prompt="hi", max_tokens=1)
    assert httpx.get(f"{url}/v1/nowhere", timeout=TIMEOUT_S).json()["error"]["code"] == "404"


def test_health_and_metrics(fast_backend):
    url, _ = fast_backend
    client(url).completions.create(model=MODEL, prompt="count me", max_tokens=3)
    assert httpx.get(f"{url}/health", timeout=TIMEOUT_S).json() == {"status": "ok"}
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    assert "fleetsim:kv_cache_usage_perc" in text
    assert 'fleetsim:requests_total{outcome="ok",status="200"}' in text


def test_beyond_the_bounded_queue_429_with_retry_after():
    """Two requests may be in flight; a third is refused at once."""
    with ServerThread(lambda: emulated_backend(speed=0.5, max_num_requests=2)) as url:
        c = client(url)
        streams = [c.completions.create(model=MODEL, prompt="hold on", max_tokens=2000,
                                        stream=True) for _ in range(2)]
        for s in streams:
            next(iter(s))
        with pytest.raises(openai.RateLimitError) as info:
            c.completions.create(model=MODEL, prompt="one more", max_tokens=5)
        assert info.value.response.headers["retry-after"] == "1"
        assert info.value.body["code"] == "overloaded"
        for s in streams:
            s.close()


def test_a_client_that_disconnects_cancels_its_engine_request(tmp_path):
    """The engine aborts it at once: out of the batch, its KV freed, recorded with the
    reason (not finished at its next token)."""
    record = tmp_path / "emu.jsonl"
    server = ServerThread(lambda: emulated_backend(speed=1.0, record=record))
    with server as url:
        stream = client(url).completions.create(model=MODEL, prompt="go on", max_tokens=5000,
                                                stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        stream.close()
        engine = server.app.engine
        deadline = time.monotonic() + TIMEOUT_S
        while server.call(lambda: engine.num_active) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.call(lambda: engine.num_active) == 0
        assert server.call(lambda: engine.cluster.replicas[0].kv.num_used_blocks) == 0
        [aborted] = server.call(lambda: engine._recorder.aborted)
        assert aborted.reason == "the client disconnected"
        assert 3 <= aborted.num_output_tokens < 5000
        text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
        assert 'fleetsim:requests_total{outcome="cancelled",status="499"} 1.0' in text
        # the engine stopped it early: far fewer than 5000 tokens were generated
        tokens = float(text.split("\nfleetsim:generation_tokens_total ")[1].split()[0])
        assert tokens < 1000
    [row] = [json.loads(line) for line in record.read_text().splitlines()]
    assert row["status"] == "cancelled" and row["abort_reason"] == "the client disconnected"
    assert row["output_tokens"] == aborted.num_output_tokens


def test_engine_timing_equals_fleetsim_run_on_the_recorded_trace(tmp_path):
    """The emulator's engine is fleetsim's: replaying what it served (arrivals as it saw
    them) through ``run`` gives the same TTFT, TPOT and E2E per request, to 1 us."""
    record = tmp_path / "emu.jsonl"
    rng = np.random.default_rng(7)
    n = 40
    workload = Workload(arrival_s=np.sort(rng.uniform(0, 40.0, n)),  # simulated s
                        num_prompt_tokens=rng.integers(50, 3000, n),
                        num_output_tokens=rng.integers(2, 300, n),
                        hash_ids=tuple((int(k % 3),) for k in range(n)), hash_block_tokens=512)
    speed = 40.0
    wall = Workload(arrival_s=workload.arrival_s / speed,
                    num_prompt_tokens=workload.num_prompt_tokens,
                    num_output_tokens=workload.num_output_tokens, hash_ids=workload.hash_ids,
                    hash_block_tokens=512)
    with ServerThread(lambda: emulated_backend(speed=speed, record=record)) as url:
        outcomes = asyncio.run(run_load(wall, url, model=MODEL, timeout_s=TIMEOUT_S))
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    live = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(live) == n
    assert sum(row["num_prefix_hit_tokens"] for row in live) > 0  # shared prefixes were hit
    config = load_config(None, [f'workload.trace="{record}"', "workload.hash_block_tokens=16"])
    sim = run(config).records.requests
    # Trace rows (so simulated ids) are in the emulator's arrival order; arrivals may tie
    # (a request is never placed before an earlier one's arrival), and records are in finish
    # order, so order by (arrival, id).
    order = np.lexsort((sim["request_id"], sim["arrival_s"]))
    first = sim["first_token_s"][order] - sim["arrival_s"][order]
    e2e = sim["finish_s"][order] - sim["arrival_s"][order]
    for k, row in enumerate(live):
        assert math.isclose(row["ttft_s"], first[k], abs_tol=1e-6), (k, row["ttft_s"], first[k])
        assert math.isclose(row["e2e_s"], e2e[k], abs_tol=1e-6)
        assert row["output_tokens"] == sim["num_output_tokens"][order][k]


# ---- the command: one process, real signals ---------------------------------------------
def start_cli(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``fleetsim emulate ...`` in a process of its own; returns it and its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "fleetsim.cli", "emulate", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not line or "listening on" not in line[0]:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"emulate did not start: {line} {proc.stderr.read()[-2000:]}")
    return proc, line[0].rsplit(" ", 1)[1].strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_stops_cleanly_on_a_signal(sig):
    """In-flight streams get --drain-s to finish, then end with an error event; exit 0."""
    proc, url = start_cli("--speed", "1", "--drain-s", "0.5")
    try:
        c = client(url)
        short = c.completions.create(model=MODEL, prompt="short", max_tokens=20, stream=True)
        long = c.completions.create(model=MODEL, prompt="long", max_tokens=20000, stream=True)
        next(iter(short))
        long_it = iter(long)
        next(long_it)
        proc.send_signal(sig)
        assert len([ch for ch in short if ch.choices and ch.choices[0].text]) == 19
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in long_it:
                pass
        assert proc.wait(TIMEOUT_S) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
