"""Async scheduling (vLLM >= 0.14's default): the per-step CPU cost overlaps the GPU's work,
leaving a short gap between steps unless the CPU is the slower side."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import build_step_model
from fleetsim.perf.step_model import ASYNC_STEP_GAP_S
from fleetsim.run import run

LLAMA8, H100 = get_model("Llama-3.1-8B"), get_gpu("h100")
FAST = ["workload.max_requests=60"]
STEPS = (([(300, 0), (128, 512)], 5, 5000), ((), 1, 512), ((), 64, 64 * 900),
         ([(8000, 0)], 0, 0))


def test_gpu_bound_steps_pay_the_gap_instead_of_the_cpu_cost():
    """A step whose kernels outlast the CPU work costs kernels + gap: the sync step minus its
    CPU cost plus the gap, for any CPU cost below the kernels."""
    for fixed, per_seq in ((1.5e-3, 0.0), (1e-3, 2e-5)):
        sync = build_step_model(LLAMA8, H100, 1, step_overhead_s=fixed,
                                step_overhead_per_seq_s=per_seq)
        asyn = build_step_model(LLAMA8, H100, 1, step_overhead_s=fixed,
                                step_overhead_per_seq_s=per_seq, async_scheduling=True)
        for chunk, n, kv in STEPS:
            cpu = fixed + per_seq * (n + len(chunk))
            kernels = sync.step_time_s(chunk, n, kv) - cpu
            assert kernels > cpu  # an 8B model's step on an H100 takes > 5 ms
            assert asyn.step_time_s(chunk, n, kv) == pytest.approx(
                kernels + ASYNC_STEP_GAP_S, rel=1e-12)
            assert sum(asyn.breakdown_s(chunk, n, kv).values()) == pytest.approx(
                asyn.step_time_s(chunk, n, kv), rel=1e-12)


def test_cpu_bound_steps_wait_for_the_cpu():
    """When the CPU work outlasts the kernels (here 50 ms a step), the step is the CPU's
    (plus the decode KV reads, which the affine decode form keeps outside the overlap)."""
    asyn = build_step_model(LLAMA8, H100, 1, step_overhead_s=0.05, async_scheduling=True)
    sync = build_step_model(LLAMA8, H100, 1, step_overhead_s=0.05)
    for chunk, n, kv in STEPS[:3]:
        t = asyn.step_time_s(chunk, n, kv)
        kv_part = asyn._dec_c.at(n) * kv
        assert t == pytest.approx(0.05 + kv_part, rel=1e-12)
        assert max(0.05, sync.step_time_s(chunk, n, kv) - 0.05) <= t < sync.step_time_s(
            chunk, n, kv)


def test_async_keeps_fast_forward_bit_identical():
    sm = build_step_model(LLAMA8, H100, 1, step_overhead_s=4e-3, step_overhead_per_seq_s=3e-5,
                          async_scheduling=True)
    kv = np.array([0, 17, 5000, 123_457, 2_000_000], dtype=np.int64)
    for n in (1, 7, 64, 300):
        vec = sm.decode_step_times_s(n, kv)
        base, per_kv, extra = sm.decode_terms_s(n)
        for i, k in enumerate(kv.tolist()):
            assert vec[i] == sm.step_time_s((), n, k)
            assert (base + per_kv * k) + extra == sm.step_time_s((), n, k)


def test_engine_key_shortens_low_batch_decode_and_is_deterministic():
    """A lightly loaded replica: async scheduling saves about the CPU cost less the gap on
    every decode step (1.5 - 0.16 ms), and the same seed gives the same results."""
    sync = run(load_config(None, FAST))
    asyn = run(load_config(None, [*FAST, "engine.async_scheduling=true"]))
    again = run(load_config(None, [*FAST, "engine.async_scheduling=true"]))
    saved = sync.summary["tpot_s"]["mean"] - asyn.summary["tpot_s"]["mean"]
    assert saved == pytest.approx(1.5e-3 - ASYNC_STEP_GAP_S, rel=0.1)
    assert asyn.summary == again.summary
    stepped = run(load_config(None, [*FAST, "engine.async_scheduling=true",
                                     "engine.fast_forward=false"]))
    assert stepped.summary["tpot_s"] == asyn.summary["tpot_s"]
    assert stepped.summary["ttft_s"] == asyn.summary["ttft_s"]
    assert "async scheduling" in asyn.summary["perf_sources"]["other"]
    gap = run(load_config(None, [*FAST, "engine.async_scheduling=true",
                                 "engine.async_step_gap_s=0.0005"]))
    assert gap.summary["tpot_s"]["mean"] > asyn.summary["tpot_s"]["mean"] + 2e-4


@pytest.mark.parametrize(("sets", "needle"), [
    (["engine.async_step_gap_s=-1"], "engine.async_step_gap_s"),
    (["engine.async_scheduling=maybe"], "engine.async_scheduling"),
    (["engine.step_model.name=tests.unit.test_step_overhead:ConstantStep",
      "engine.step_model.args.seconds=1", "engine.async_scheduling=true"],
     "apply to the built-in step model"),
])
def test_bad_async_settings_are_one_line_and_exit_2(tmp_path, capsys, sets, needle):
    argv = ["run", "--out", str(tmp_path / "o")]
    for s in [*FAST, *sets]:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_perf_cli_prices_a_step_with_async_scheduling(capsys):
    import json

    argv = ["perf", "--model", "llama-3.1-8b", "--gpu", "h100", "--decode-batch", "4",
            "--context", "512", "--format", "json"]
    assert main(argv) == 0
    sync = json.loads(capsys.readouterr().out)
    assert main([*argv, "--async-scheduling"]) == 0
    asyn = json.loads(capsys.readouterr().out)
    assert sync["total_s"] - asyn["total_s"] == pytest.approx(1.5e-3 - ASYNC_STEP_GAP_S,
                                                              rel=1e-9)
    assert "async scheduling" in asyn["ops"]["other"]["source"]
