"""``fleetsim gateway`` over emulated backends: routing, pass-through, failures, a soak
(loopback only; every server started here is stopped here; every wait is bounded)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import numpy as np
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fleetsim.cli import main
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.gateway import Gateway
from fleetsim.live.load import report, run_load
from fleetsim.live.server import LiveApp, ServerThread
from fleetsim.policies.routing import ROUTERS
from fleetsim.workloads import Workload

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"
TIMEOUT_S = 20.0


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S)


def backends(stack: ExitStack, *speeds: float) -> list[ServerThread]:
    servers = [ServerThread(lambda s=s: emulated_backend(speed=s)) for s in speeds]
    for server in servers:
        stack.enter_context(server)
    return servers


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_router_serves_streams_and_whole_answers(router, tmp_path):
    with ExitStack() as stack:
        b = backends(stack, 50.0, 50.0)
        gw = ServerThread(lambda: Gateway([s.url for s in b], router=router,
                                          record=tmp_path / "gw.jsonl"))
        url = stack.enter_context(gw)
        c = client(url)
        for i in range(4):
            r = c.completions.create(model=MODEL, prompt=f"request {i} " * 20, max_tokens=4)
            assert r.usage.completion_tokens == 4
            chunks = list(c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=6,
                stream=True, stream_options={"include_usage": True}))
            assert chunks[-1].usage.completion_tokens == 6
            assert sum(bool(ch.choices and ch.choices[0].delta.content) for ch in chunks) == 6
        assert [m.id for m in c.models.list().data] == [MODEL]
        assert gw.call(lambda: gw.app.num_in_flight) == 0
        assert all(gw.call(lambda v=v: v.load_tokens) == 0 for v in gw.app.backends)
    recorded = rows(tmp_path / "gw.jsonl")
    assert len(recorded) == 8 and all(r["status"] == "ok" for r in recorded)
    streamed = [r for r in recorded if r["endpoint"] == "chat"]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 and r["output_tokens"] == 6 for r in streamed)
    if router == "round_robin":
        assert len({r["backend"] for r in recorded}) == 2


def test_prefix_affinity_keeps_a_shared_prefix_on_one_backend(tmp_path):
    """Two conversations with long distinct prefixes: each stays on one backend."""
    with ExitStack() as stack:
        b = backends(stack, 50.0, 50.0)
        gw = ServerThread(lambda: Gateway([s.url for s in b], router="prefix_affinity",
                                          record=tmp_path / "gw.jsonl"))
        c = client(stack.enter_context(gw))
        heads = {"a": list(range(1000, 1600)), "b": list(range(5000, 5600))}
        for turn in range(4):
            for head in heads.values():
                c.completions.create(model=MODEL, prompt=head + [7] * (turn + 1), max_tokens=2)
    recorded = rows(tmp_path / "gw.jsonl")
    by_head = {}
    for r, name in zip(recorded, ["a", "b"] * 4, strict=True):
        by_head.setdefault(name, set()).add(r["backend"])
    assert all(len(v) == 1 for v in by_head.values()), by_head


def test_least_loaded_moves_load_away_from_a_slow_backend(tmp_path):
    """A backend 50x slower keeps its requests longer, so it is given fewer."""
    with ExitStack() as stack:
        slow, fast = backends(stack, 1.0, 50.0)
        gw = ServerThread(lambda: Gateway([slow.url, fast.url], router="least_loaded",
                                          record=tmp_path / "gw.jsonl"))
        c = client(stack.enter_context(gw))

        def one(i: int) -> int:
            time.sleep(0.01 * i)
            return c.completions.create(model=MODEL, prompt=f"q{i}", max_tokens=30
                                        ).usage.completion_tokens

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(40))) == [30] * 40
    counts = {}
    for r in rows(tmp_path / "gw.jsonl"):
        counts[r["backend"]] = counts.get(r["backend"], 0) + 1
    # round robin would split 20/20; a loaded 2-core machine still gives the fast one ~2x
    assert counts.get(fast.url, 0) >= 1.5 * counts.get(slow.url, 0), counts


class Failing(LiveApp):
    """A backend that answers 500 to everything and counts the requests."""

    def __init__(self) -> None:
        self.num_hits = 0

        async def fail(request):
            self.num_hits += 1
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)

        self.asgi = Starlette(routes=[Route("/v1/completions", fail, methods=["POST"]),
                                      Route("/v1/chat/completions", fail, methods=["POST"])])


def test_a_backend_answering_500_is_retried_elsewhere_and_ejected(tmp_path):
    with ExitStack() as stack:
        (good,) = backends(stack, 50.0)
        bad = ServerThread(Failing)
        stack.enter_context(bad)
        gw = ServerThread(lambda: Gateway([bad.url, good.url], router="round_robin"))
        c = client(stack.enter_context(gw))
        for i in range(30):
            assert c.completions.create(model=MODEL, prompt=f"x{i}", max_tokens=2
                                        ).usage.completion_tokens == 2
        # ejected for 0.5 s, 1 s, 2 s ... after each failure: a handful of hits, not 15
        assert 1 <= bad.app.num_hits <= 5
        assert "fleetsim:retries_total" in httpx.get(f"{gw.url}/metrics").text


def test_all_backends_down_is_a_clean_502():
    with ExitStack() as stack:
        bad = ServerThread(Failing)
        stack.enter_context(bad)
        gw = ServerThread(lambda: Gateway([bad.url, "http://127.0.0.1:9"], max_attempts=3))
        c = client(stack.enter_context(gw))
        with pytest.raises(openai.APIStatusError) as info:
            c.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.status_code == 502
        assert info.value.body["code"] == "bad_gateway"


def test_bad_input_400_and_overload_429_at_the_gateway():
    with ExitStack() as stack:
        (b,) = backends(stack, 0.5)
        gw = ServerThread(lambda: Gateway([b.url], max_in_flight=1, max_body_bytes=4096))
        url = stack.enter_context(gw)
        for body in (b"{oops", json.dumps({"model": MODEL, "prompt": 3}).encode(),
                     json.dumps({"model": MODEL, "prompt": "x " * 5000}).encode()):
            r = httpx.post(f"{url}/v1/completions", content=body, timeout=TIMEOUT_S)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        c = client(url)
        stream = c.completions.create(model=MODEL, prompt="hold", max_tokens=3000, stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            c.completions.create(model=MODEL, prompt="more", max_tokens=2)
        assert info.value.response.headers["retry-after"] == "1"
        stream.close()


def test_a_client_disconnect_cancels_the_backend_request():
    with ExitStack() as stack:
        (b,) = backends(stack, 1.0)
        gw = ServerThread(lambda: Gateway([b.url]))
        c = client(stack.enter_context(gw))
        stream = c.completions.create(model=MODEL, prompt="long", max_tokens=5000, stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        stream.close()
        engine = b.app.engine
        deadline = time.monotonic() + TIMEOUT_S
        while b.call(lambda: engine.num_active) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.call(lambda: engine.num_active) == 0
        assert gw.call(lambda: gw.app.num_in_flight) == 0
        metrics = httpx.get(f"{b.url}/metrics", timeout=TIMEOUT_S).text
        assert 'fleetsim:requests_total{outcome="cancelled",status="499"} 1.0' in metrics


def start_emulate_process() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "fleetsim.cli", "emulate", "--speed", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not line or "listening on" not in line[0]:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"emulate did not start: {line}")
    return proc, line[0].rsplit(" ", 1)[1].strip()


@pytest.mark.slow
def test_a_backend_killed_mid_stream(tmp_path):
    """Streams on the killed backend end with an error event; requests sent after the kill
    are retried on the other backend; every request gets exactly one outcome."""
    proc, doomed = start_emulate_process()
    try:
        with ExitStack() as stack:
            (alive,) = backends(stack, 2.0)
            gw = ServerThread(lambda: Gateway([doomed, alive.url], router="round_robin",
                                              record=tmp_path / "gw.jsonl"))
            c = client(stack.enter_context(gw))
            outcomes: dict[int, str] = {}
            streams = [c.completions.create(model=MODEL, prompt=f"s{i}", max_tokens=400,
                                            stream=True) for i in range(4)]
            iters = [iter(s) for s in streams]
            for it in iters:
                next(it)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            for i, it in enumerate(iters):
                try:
                    n = 1 + sum(1 for ch in it if ch.choices and ch.choices[0].text)
                    outcomes[i] = "ok" if n == 400 else f"short {n}"
                except openai.APIError as err:
                    outcomes[i] = "error" if "mid-stream" in str(err) else f"other {err}"
            assert sorted(outcomes.values()) == ["error", "error", "ok", "ok"], outcomes
            for i in range(6):  # round robin would send half of these to the dead one
                r = c.completions.create(model=MODEL, prompt=f"after {i}", max_tokens=3)
                assert r.usage.completion_tokens == 3
            assert gw.call(lambda: gw.app.num_in_flight) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    recorded = rows(tmp_path / "gw.jsonl")
    assert len(recorded) == 10
    assert [r["status"] for r in recorded].count("error") == 2


def test_recorded_traffic_replays_in_the_simulator_and_compares(tmp_path, capsys):
    trace = tmp_path / "gw.jsonl"
    with ExitStack() as stack:
        b = backends(stack, 20.0, 20.0)
        gw = ServerThread(lambda: Gateway([s.url for s in b], record=trace))
        url = stack.enter_context(gw)
        assert main(["load", "embedded:azure_conv_2023", "--url", url, "--max-requests", "12",
                     "--rate-scale", "20", "--out", str(tmp_path / "load.jsonl"),
                     "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
    assert result["completed"] == 12 and result["failed"] == 0
    assert {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms",
            "request_throughput", "output_throughput"} <= set(result)
    assert len(rows(trace)) == 12
    out = tmp_path / "sim"
    assert main(["run", "--set", f'workload.trace="{trace}"', "--set",
                 "workload.hash_block_tokens=16", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(trace), str(out), "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    assert cmp["num_live"] == cmp["num_predicted"] == 12
    assert cmp["ttft_s"]["live"]["mean"] > 0 and cmp["tpot_s"]["predicted"]["p50"] > 0
    assert main(["compare", str(tmp_path / "load.jsonl"), str(out)]) == 0
    assert "TTFT" in capsys.readouterr().out


def test_a_request_whose_body_is_still_arriving_keeps_its_place_in_the_trace(tmp_path):
    """The first request's body arrives slowly; a second one is read, served and recorded
    meanwhile. The trace lists both by arrival (a replay refuses arrivals out of order): the
    first one's place is taken when it arrives, not once its body is read. A request refused
    at the door leaves no row and holds nothing back."""
    trace = tmp_path / "gw.jsonl"
    second_done = threading.Event()

    def slow_body():
        yield json.dumps({"model": MODEL, "prompt": "first"})[:-1].encode()
        second_done.wait(TIMEOUT_S)
        yield b', "max_tokens": 2}'

    with ExitStack() as stack:
        (b,) = backends(stack, 20.0)
        gw = ServerThread(lambda: Gateway([b.url], record=trace))
        url = stack.enter_context(gw)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, f"{url}/v1/completions", content=slow_body(),
                                timeout=TIMEOUT_S)
            time.sleep(0.3)  # (ordering only: the gateway has the first one's headers)
            refused = httpx.post(f"{url}/v1/completions", content=b"{oops", timeout=TIMEOUT_S)
            second = httpx.post(f"{url}/v1/completions", timeout=TIMEOUT_S,
                                json={"model": MODEL, "prompt": "second", "max_tokens": 2})
            second_done.set()
            assert refused.status_code == 400
            assert second.status_code == 200 and first.result().status_code == 200
    recorded = rows(trace)
    assert [r["prompt_tokens"] > 0 for r in recorded] == [True, True]
    arrivals = [r["arrival_s"] for r in recorded]
    assert arrivals[0] < arrivals[1]


@pytest.mark.slow
def test_soak_through_the_gateway_memory_flat():
    """2,000 requests through a gateway and two emulated backends: none lost, no error, and
    the resident memory of the process that holds all three does not grow."""
    rng = np.random.default_rng(3)

    def workload(n: int) -> Workload:
        return Workload(arrival_s=np.sort(rng.uniform(0, n / 400, n)),
                        num_prompt_tokens=rng.integers(16, 200, n),
                        num_output_tokens=rng.integers(1, 5, n))

    def rss_bytes() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    with ExitStack() as stack:
        b = backends(stack, 200.0, 200.0)
        gw = ServerThread(lambda: Gateway([s.url for s in b], router="power_of_two"))
        url = stack.enter_context(gw)
        results = []
        for batch in (500, 750, 750):
            t0 = time.monotonic()
            # A generous per-request bound: on a starved machine a request can queue for more
            # than TIMEOUT_S, which is not what this test is about (lost requests, memory).
            outcomes = asyncio.run(run_load(workload(batch), url, model=MODEL,
                                            max_concurrency=64, timeout_s=6 * TIMEOUT_S))
            results.append((report(outcomes, time.monotonic() - t0), rss_bytes()))
        assert gw.call(lambda: gw.app.num_in_flight) == 0
        assert all(s.call(lambda s=s: s.app.engine.num_active) == 0 for s in b)
    assert [r["completed"] for r, _ in results] == [500, 750, 750]
    assert all(r["failed"] == 0 for r, _ in results), [r["errors"] for r, _ in results]
    (_, warm), (_, mid), (_, end) = results
    assert end - mid < 8 * 2**20, (warm, mid, end)  # flat after warm-up (< 8 MiB)
