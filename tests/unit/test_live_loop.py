"""Record -> run -> compare on ordinary traffic: rejected requests, two backends, request ids
through every hop, traces that carry their own block size, the lag of a starved loop, and a
``load --out`` that an interruption leaves as it was."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import ExitStack

import httpx
import pytest

from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError
from fleetsim.live.compare import frontend_overhead
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.gateway import Gateway
from fleetsim.live.lag import LagMonitor
from fleetsim.live.server import ServerThread
from fleetsim.workloads import load_trace

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_record_run_compare_with_rejected_requests_and_two_backends(tmp_path, capsys):
    trace, out = tmp_path / "gw.jsonl", tmp_path / "load.jsonl"
    engines = [tmp_path / "emu0.jsonl", tmp_path / "emu1.jsonl"]
    with ExitStack() as stack:
        backends = [stack.enter_context(ServerThread(
            lambda p=p: emulated_backend(speed=20.0, record=p))) for p in engines]
        url = stack.enter_context(ServerThread(lambda: Gateway(backends, record=trace)))
        # Rejected by a backend: 400 (far beyond the context), 404 (no such model).
        for body, status in (({"model": MODEL, "prompt": "x", "max_tokens": 10**7}, 400),
                             ({"model": "nope", "prompt": "x", "max_tokens": 3}, 404)):
            r = httpx.post(f"{url}/v1/completions", json=body,
                           headers={"X-Request-Id": f"bad-{status}"}, timeout=20.0)
            assert r.status_code == status, r.text
            assert r.headers["x-request-id"] == f"bad-{status}"
            assert r.headers["x-fleetsim-backend"] in backends
        assert main(["load", "embedded:azure_conv_2023", "--url", url, "--max-requests", "20",
                     "--rate-scale", "20", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    recorded = rows(trace)
    assert len(recorded) == 22
    rejected = [r for r in recorded if r["request_id"].startswith("bad-")]
    assert [(r["status"], r["served"], r["output_tokens"]) for r in rejected] == [
        ("http_400", False, 0), ("http_404", False, 0)]
    assert all(r["served"] and r["hash_block_tokens"] == 16 and r["lag_s"] >= 0
               for r in recorded if r not in rejected)
    # Served tokens, not the asked max_tokens, and one id per request through every hop.
    measured = {r["request_id"]: r for r in rows(out)}
    assert len(measured) == 20
    for r in recorded:
        if r["served"]:
            assert measured[r["request_id"]]["output_tokens"] == r["output_tokens"]
    engine_ids = {r["request_id"] for p in engines for r in rows(p)}
    assert set(measured) <= engine_ids and all(rows(p) for p in engines)

    # Replayed with no --set workload.hash_block_tokens: the trace says 16.
    sim = tmp_path / "sim"
    assert main(["run", "--set", f'workload.trace="{trace}"', "--set",
                 "hardware.num_replicas=2", "--out", str(sim), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["num_requests"] == 20 and summary["num_unserved_skipped"] == 2
    assert "skipped 2 row(s) of the trace that no server served" in captured.err

    assert main(["compare", str(trace), str(sim), "--json", "--engine", str(engines[0]),
                 "--engine", str(engines[1])]) == 0
    cmp = json.loads(capsys.readouterr().out)
    fe = cmp["frontend_overhead_s"]
    assert fe["matched_by"] == "request_id" and fe["matched_share"] >= 0.95
    assert fe["num_matched"] == 20
    assert cmp["lag_s"]["live"]["num_rows"] == 22 and set(cmp["lag_s"]) == {
        "live", "engine 1", "engine 2"}


def test_compare_advice_comes_from_matched_pairs_only(tmp_path):
    """Ids decide the pairs: rows in another order, or unmatched ones with wild TTFTs,
    change nothing."""
    def write(path, items):
        path.write_text("".join(json.dumps({"arrival_s": i, "prompt_tokens": 10,
                                            "output_tokens": 5, "ttft_s": ttft,
                                            "request_id": rid, "status": "ok"}) + "\n"
                                for i, (rid, ttft) in enumerate(items)))

    live, engine = tmp_path / "live.jsonl", tmp_path / "emu.jsonl"
    write(live, [("a", 0.110), ("b", 0.220), ("c", 0.330), ("x", 9.0)])
    write(engine, [("c", 0.300), ("a", 0.100), ("b", 0.200), ("y", 0.001)])
    fe = frontend_overhead(live, engine)
    assert fe["num_matched"] == 3 and fe["num_live"] == 4 and fe["matched_share"] == 0.75
    assert fe["mean"] == pytest.approx(0.02)


def test_compare_warns_on_lag_and_on_few_matches(tmp_path, capsys):
    sim = tmp_path / "sim"
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.1, "prompt_tokens": 20,
                                         "output_tokens": 4, "ttft_s": 0.05, "tpot_s": 0.01,
                                         "e2e_s": 0.08, "status": "ok", "request_id": str(i),
                                         "lag_s": 0.3 if i == 2 else 0.001}) + "\n"
                             for i in range(5)))
    engine = tmp_path / "emu.jsonl"
    engine.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 4,
                                  "ttft_s": 0.04, "request_id": "0"}) + "\n")
    assert main(["run", "--set", f'workload.trace="{trace}"', "--out", str(sim),
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(trace), str(sim), "--engine", str(engine)]) == 0
    captured = capsys.readouterr()
    assert "event-loop lag of the live trace's writer" in captured.out
    assert "300.0 ms behind real time (1 of 5 requests over 50.0 ms)" in captured.err
    assert "only 1 of 5 live requests matched" in captured.err


def test_the_lag_monitor_sees_a_blocked_loop_and_warns_once():
    said: list[str] = []

    async def scenario() -> LagMonitor:
        lag = LagMonitor("test", warn_s=0.05, interval_s=0.01, say=said.append)
        lag.start()
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        time.sleep(0.2)  # a CPU-bound stretch: the loop cannot wake anything meanwhile
        assert lag.lag_since(t0) >= 0.15  # the overdue wake-up counts before it runs
        time.sleep(0.2)
        await asyncio.sleep(0.05)
        lag.stop()
        return lag

    lag = asyncio.run(scenario())
    assert lag.max_lag_s >= 0.35
    assert len(said) == 1 and "behind real time (threshold 50 ms)" in said[0]


def test_a_served_flag_and_an_own_block_size_in_the_loader(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"arrival_s":0,"prompt_tokens":32,"output_tokens":4,"hash_ids":[1,2],'
        '"hash_block_tokens":16}\n'
        '{"arrival_s":1,"prompt_tokens":32,"output_tokens":0,"hash_ids":[1,3],'
        '"hash_block_tokens":16,"served":false}\n'
        '{"arrival_s":2,"prompt_tokens":48,"output_tokens":2,"hash_ids":[1,2,4],'
        '"hash_block_tokens":16}\n')
    w = load_trace(path)
    assert len(w) == 2 and w.num_unserved_skipped == 1 and w.hash_block_tokens == 16
    assert load_trace(path, hash_block_tokens=16).hash_block_tokens == 16
    with pytest.raises(FleetsimInputError, match="says its hash_ids cover 16 tokens"):
        load_trace(path, hash_block_tokens=32)
    path.write_text(path.read_text().replace('[1,2,4],"hash_block_tokens":16',
                                             '[1,2,4],"hash_block_tokens":8'))
    with pytest.raises(FleetsimInputError, match="line 3: hash_block_tokens"):
        load_trace(path)


def test_an_interrupted_load_leaves_the_earlier_out_file(tmp_path, monkeypatch):
    import fleetsim.live.load as load_module

    out = tmp_path / "measured.jsonl"
    out.write_text("earlier results\n")

    async def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(load_module, "run_load", interrupted)
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        assert main(["load", "embedded:azure_conv_2023", "--url", url, "--max-requests", "2",
                     "--out", str(out)]) == 130
    assert out.read_text() == "earlier results\n"
    assert [p.name for p in tmp_path.iterdir()] == ["measured.jsonl"]
