"""Issue 13 §2/§4: the per-step CPU overhead (fixed + per sequence), vLLM V0's measured
profile, and user step models named in the config."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import build_step_model
from fleetsim.perf.cpu_overhead import VIDUR_A100_LLAMA2_7B_MS, vllm_v0_overhead
from fleetsim.run import run

LLAMA8, H100 = get_model("Llama-3.1-8B"), get_gpu("h100")
FAST = ["workload.max_requests=40"]


def test_per_sequence_overhead_adds_per_sequence_exactly():
    base = build_step_model(LLAMA8, H100, 1, step_overhead_per_seq_s=0.0)
    more = build_step_model(LLAMA8, H100, 1, step_overhead_per_seq_s=1e-4)
    chunks = [(300, 0), (128, 512), (64, 2000)]
    for chunk, n, kv in ((chunks, 5, 5000), ((), 32, 32 * 900), ([(8000, 0)], 0, 0)):
        delta = more.step_time_s(chunk, n, kv) - base.step_time_s(chunk, n, kv)
        assert delta == pytest.approx(1e-4 * (n + len(chunk)), rel=1e-9)
        parts = more.breakdown_s(chunk, n, kv)
        assert sum(parts.values()) == pytest.approx(more.step_time_s(chunk, n, kv), rel=1e-12)


def test_per_sequence_overhead_keeps_fast_forward_bit_identical():
    sm = build_step_model(LLAMA8, H100, 1, step_overhead_s=0.7e-3, step_overhead_per_seq_s=3e-5)
    kv = np.array([0, 17, 5000, 123_457], dtype=np.int64)
    for n in (1, 7, 64, 300):
        vec = sm.decode_step_times_s(n, kv)
        base, per_kv, extra = sm.decode_terms_s(n)
        for i, k in enumerate(kv.tolist()):
            assert vec[i] == sm.step_time_s((), n, k)
            assert (base + per_kv * k) + extra == sm.step_time_s((), n, k)


def test_default_overhead_is_unchanged_by_the_new_term():
    """The per-sequence term defaults to 0 and leaves every default step time as it was."""
    sm = build_step_model(LLAMA8, H100, 1)
    assert sm.step_overhead_per_seq_s == 0.0 and sm.step_overhead_s == 1.5e-3
    assert sm.step_time_s((), 1, 100) == 1.5e-3 + sm._tok.at(1) + sm._seq.at(1) + (
        sm._dec_a.at(1)) + sm._dec_c.at(1) * 100


def test_vllm_v0_overhead_follows_vidurs_measurements():
    """The fixed + per-sequence line reproduces Vidur's profile (less the LM head the step
    model prices) within 0.5 ms at every measured batch, and grows with the batch."""
    for tp, rows in VIDUR_A100_LLAMA2_7B_MS.items():
        fixed_s, per_seq_s = vllm_v0_overhead(tp)
        sm = build_step_model(get_model("Llama-2-7B"), get_gpu("a100"), tp)
        assert 0.5e-3 < fixed_s < 2e-3 and 50e-6 < per_seq_s < 200e-6
        for b, *phases_ms in rows:
            measured_s = sum(phases_ms) * 1e-3 - sm.per_sequence_s(int(b))
            assert abs(fixed_s + per_seq_s * b - measured_s) < 0.5e-3, (tp, b)
    assert vllm_v0_overhead(8) == vllm_v0_overhead(4)


def test_engine_keys_reach_the_step_model():
    slow = run(load_config(None, [*FAST, "engine.step_overhead_per_seq_s=2e-4"]))
    fast = run(load_config(None, FAST))
    assert slow.summary["tpot_s"]["mean"] > fast.summary["tpot_s"]["mean"] + 2e-4
    assert "per sequence" in slow.summary["perf_sources"]["other"]


class ConstantStep:
    """A user step model: every step takes ``seconds``."""

    def __init__(self, *, model, gpu, tp, seconds):
        self.seconds, self.sources = seconds, {"all": f"constant {seconds} s ({model.name})"}

    def step_time_s(self, prefill_chunks, num_decode, decode_kv_tokens):
        return self.seconds

    def decode_step_times_s(self, num_decode, decode_kv_tokens):
        return np.full(len(decode_kv_tokens), self.seconds)


class NotAStepModel:
    def __init__(self, **_):
        pass


def test_user_step_model_by_qualified_name():
    name = f"{__name__}:ConstantStep"
    res = run(load_config(None, [*FAST, f"engine.step_model.name={name}",
                                 "engine.step_model.args.seconds=0.02"]))
    tpot = res.summary["tpot_s"]
    assert tpot["p50"] == pytest.approx(0.02) and tpot["max"] == pytest.approx(0.02)
    assert res.summary["perf_sources"] == {"all": "constant 0.02 s (Llama-3.1-8B)"}


@pytest.mark.parametrize(("sets", "needle"), [
    (["engine.step_model.name=no.such.module:X"], "engine.step_model.name"),
    ([f"engine.step_model.name={__name__}:NotAStepModel"], "no step_time_s"),
    ([f"engine.step_model.name={__name__}:ConstantStep"], "engine.step_model"),  # no seconds
    (["engine.step_model.args.x=1"], "engine.step_model.args"),
    (["engine.step_overhead_per_seq_s=0.5"], "engine.step_overhead_per_seq_s"),
    (["engine.step_overhead_s=-1"], "engine.step_overhead_s"),
    ([f"engine.step_model.name={__name__}:ConstantStep", "engine.step_model.args.seconds=1",
      "engine.step_overhead_s=0.001"], "apply to the built-in step model"),
])
def test_bad_step_model_settings_are_one_line_and_exit_2(tmp_path, capsys, sets, needle):
    argv = ["run", "--out", str(tmp_path / "o")]
    for s in [*FAST, *sets]:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_build_step_model_rejects_bad_per_sequence_overhead():
    with pytest.raises(FleetsimInputError, match="step_overhead_per_seq_s"):
        build_step_model(LLAMA8, H100, 1, step_overhead_per_seq_s=-1e-6)


def test_kernel_time_scale_scales_every_kernel_term_and_not_the_overhead():
    one = build_step_model(LLAMA8, H100, 1, step_overhead_s=1e-3, step_overhead_per_seq_s=2e-5)
    two = build_step_model(LLAMA8, H100, 1, step_overhead_s=1e-3, step_overhead_per_seq_s=2e-5,
                           kernel_time_scale=1.7)
    for chunk, n, kv in (([(300, 0), (128, 512)], 5, 5000), ((), 48, 48 * 900)):
        cpu = 1e-3 + 2e-5 * (n + len(chunk))
        assert two.step_time_s(chunk, n, kv) - cpu == pytest.approx(
            1.7 * (one.step_time_s(chunk, n, kv) - cpu), rel=1e-9)
        assert sum(two.breakdown_s(chunk, n, kv).values()) == pytest.approx(
            two.step_time_s(chunk, n, kv), rel=1e-12)
    kv = np.array([3, 4000, 77_777], dtype=np.int64)
    for n in (1, 33):
        assert two.decode_step_times_s(n, kv).tolist() == [
            two.step_time_s((), n, int(k)) for k in kv]
    assert "kernel_time_scale" in two.sources and "kernel_time_scale" not in one.sources
