"""Issue 13 §2: vLLM v0 / Sarathi-Serve's watermark admission (``watermark``) against vLLM v1's
chunk admission (``token_budget``)."""

from __future__ import annotations

import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.policies import BATCH_POLICIES, WatermarkPlanner
from fleetsim.run import run

TWO_LONG = ["hardware.gpu='h100'", "engine.num_kv_blocks=100", "engine.max_batched_tokens=512",
            "engine.debug=true", "workload.trace='synthetic'", "workload.num_requests=2",
            "workload.arrival='at_once'", "workload.prompt_tokens={kind='fixed',value=1000}",
            "workload.output_tokens={kind='fixed',value=300}"]
OVERLOADED = ["model='llama-3.1-8b'", "hardware.gpu='a100'", "engine.num_kv_blocks=1500",
              "engine.debug=true", "workload.trace='synthetic'", "workload.num_requests=120",
              "workload.rate_per_s=8.0",
              "workload.prompt_tokens={kind='uniform',low=500,high=3000}",
              "workload.output_tokens={kind='uniform',low=100,high=600}"]


def _run(sets, policy, *extra):
    return run(load_config(None, [*sets, f"policy.batching.name='{policy}'", *extra])).summary


def test_registered_next_to_token_budget():
    assert BATCH_POLICIES["watermark"] is WatermarkPlanner
    assert WatermarkPlanner().watermark == 0.01  # vLLM v0's default


def test_reservation_stops_the_thrash_of_two_long_requests():
    """100 blocks hold one 1,300-token request (82 blocks) but not two. Chunk admission lets
    the second start, then both grow and preempt each other; the watermark rule admits the
    second only when the first's whole KV is released."""
    chunk = _run(TWO_LONG, "token_budget")
    mark = _run(TWO_LONG, "watermark")
    assert chunk["num_finished"] == mark["num_finished"] == 2
    assert chunk["num_preemptions"] > 10 and chunk["num_recomputed_tokens"] > 10_000
    assert mark["num_preemptions"] == 0 and mark["num_recomputed_tokens"] == 0


def test_full_input_gate_of_current_vllm_also_stops_it():
    """token_budget's reserve_full_isl (vLLM's scheduler_reserve_full_isl): the second prompt
    waits until its whole input fits, though only chunks are taken."""
    gate = _run(TWO_LONG, "token_budget", "policy.batching.args.reserve_full_isl=true")
    assert gate["num_finished"] == 2 and gate["num_preemptions"] == 0


def test_overloaded_replica_preempts_and_recomputes_less_under_the_watermark():
    chunk = _run(OVERLOADED, "token_budget")
    mark = _run(OVERLOADED, "watermark")
    assert chunk["num_finished"] == mark["num_finished"] == 120
    assert mark["num_preemptions"] < chunk["num_preemptions"]
    assert mark["num_recomputed_tokens"] < 0.8 * chunk["num_recomputed_tokens"]


def test_whole_prompts_without_chunking_and_fast_forward_equal():
    sets = [*OVERLOADED[:-3], "workload.num_requests=40", "workload.rate_per_s=8.0",
            "workload.prompt_tokens={kind='uniform',low=500,high=3000}",
            "workload.output_tokens={kind='uniform',low=100,high=600}"]
    on = _run(sets, "watermark", "policy.batching.args.enable_chunked_prefill=false")
    off = _run(sets, "watermark", "policy.batching.args.enable_chunked_prefill=false",
               "engine.fast_forward=false")
    assert on["num_finished"] == 40
    assert on["e2e_s"] == off["e2e_s"] and on["num_steps"] == off["num_steps"]


@pytest.mark.parametrize("bad", ["-0.1", "1.0"])
def test_bad_watermark_is_one_line_and_exit_2(tmp_path, capsys, bad):
    code = main(["run", "--out", str(tmp_path / "o"), "--set", "workload.max_requests=5",
                 "--set", "policy.batching.name=watermark",
                 "--set", f"policy.batching.args.watermark={bad}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "watermark" in err and len(err.splitlines()) == 1
