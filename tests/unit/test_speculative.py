"""Speculative decoding: settings, the emission schedule, the engine's tokens, KV and times, the
verify/draft step model, and the CLI's refusals."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from tests.conftest import make_workload, simulate

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.speculative import (
    PUBLISHED_ACCEPTANCE,
    SpeculativeConfig,
    chain_tau,
    position_rates,
    tokens_per_step,
    vllm_speculative_json,
)
from fleetsim.perf import build_step_model
from fleetsim.perf.speculative import SpeculativeStepModel
from fleetsim.run import run, speculative_emission
from fleetsim.serving.speculative import Emission


def spec(**kw) -> SpeculativeConfig:
    kw.setdefault("method", "eagle3")
    kw.setdefault("num_speculative_tokens", 3)
    return SpeculativeConfig(**kw)


# ---- settings ------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "needle"), [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
    ({"num_speculative_tokens": -2}, "num_speculative_tokens must be >= 1"),
    ({"method": "medusa"}, "method must be one of"),
    ({"acceptance": 0.0}, "acceptance must be in (0, 1]"),
    ({"acceptance": 1.2}, "acceptance must be in (0, 1]"),
    ({"acceptance": (0.9, 0.8)}, "give one, or one per draft position (3)"),
    ({"acceptance": (0.9, 1.5, 0.2)}, "acceptance must be in (0, 1]"),
    ({"mean_accepted_tokens": 4.5}, "mean_accepted_tokens must be in [1"),
    ({"mean_accepted_tokens": 0.5}, "mean_accepted_tokens must be in [1"),
    ({"acceptance": 0.8, "mean_accepted_tokens": 2.0}, "not both"),
    ({"method": "ngram"}, "ngram has no published acceptance"),
])
def test_bad_settings_are_refused(kw, needle):
    with pytest.raises(ValueError, match="engine.speculative") as err:
        spec(**kw)
    assert needle in str(err.value)


def test_published_defaults_give_back_the_published_mean_length():
    """Each default rate reproduces the measured mean acceptance length at the k it was
    measured at (the geometric chain through that one point)."""
    for method, (tau, k, _) in PUBLISHED_ACCEPTANCE.items():
        cfg = spec(method=method, num_speculative_tokens=k)
        assert float(tokens_per_step(cfg)) == pytest.approx(tau, abs=1e-6)
    # DeepSeek-V3's MTP: 85-90% second-token acceptance -> 1.875 tokens per step at k = 1.
    assert position_rates(spec(method="mtp", num_speculative_tokens=1)) == (
        pytest.approx(0.875),)
    # More draft tokens never emit fewer, and never more than k + 1.
    taus = [float(tokens_per_step(spec(num_speculative_tokens=k))) for k in range(1, 9)]
    assert taus == sorted(taus) and all(t <= k + 1 for k, t in enumerate(taus, 1))


def test_acceptance_forms():
    assert float(tokens_per_step(spec(acceptance=0.5))) == pytest.approx(1.875)
    assert float(tokens_per_step(spec(acceptance=(0.5, 1.0, 0.0001)))) == pytest.approx(
        1 + 0.5 + 0.5 + 0.00005, abs=1e-6)
    assert float(tokens_per_step(spec(mean_accepted_tokens=2.5))) == 2.5
    assert chain_tau((1.0,) * 4) == 5.0


def test_vllm_flag_json():
    assert vllm_speculative_json(spec(draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")) == (
        '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
        '"num_speculative_tokens": 3}')
    assert vllm_speculative_json(spec(method="mtp", num_speculative_tokens=1)) == (
        '{"method": "mtp", "num_speculative_tokens": 1}')


# ---- the emission schedule -----------------------------------------------------------------
@pytest.mark.parametrize("tau", [Fraction(1), Fraction(3, 2), Fraction(2353, 1000),
                                 Fraction(4), Fraction(7, 3)])
def test_schedule_emits_floor_n_tau_after_n_steps(tau):
    e = Emission(tau.numerator, tau.denominator, 3, draft_kv=True)
    d = 0
    for n in range(1, 300):
        step = e.next_tokens(d)
        assert math.floor(tau) <= step <= math.ceil(tau)
        d += step
        assert d == math.floor(n * tau)


def test_lookahead_slots_follow_vllm():
    """EAGLE-family drafters keep k slots of their own beyond the k verified ones; n-gram
    none."""
    assert speculative_emission(spec(num_speculative_tokens=4)).num_lookahead_tokens == 8
    ngram = spec(method="ngram", num_speculative_tokens=4, acceptance=0.5)
    assert speculative_emission(ngram).num_lookahead_tokens == 4
    assert speculative_emission(None) is None


# ---- the engine ----------------------------------------------------------------------------
def test_decode_steps_emit_the_scheduled_tokens():
    """One request, 1 s steps: the prefill step emits the first token, then each decode step
    two (tau = 2), so 19 more tokens take 10 steps, the last emitting one."""
    w = make_workload([0.0], [10], [20])
    plain, _ = simulate(w, debug=True)
    fast, replica = simulate(w, debug=True, speculative=Emission(2, 1, 3, draft_kv=True))
    assert plain.requests["finish_s"][0] == 20.0
    assert fast.requests["finish_s"][0] == 11.0
    assert fast.requests["num_output_tokens"][0] == 20
    assert fast.num_steps == 11
    assert fast.timeline["num_tokens"].sum() == 10 + 19  # tokens kept: prompt, then outputs
    assert replica.kv.num_used_blocks == 0


def test_tpot_and_itl_reflect_tokens_per_step():
    """tau = 1.5 with 1 s steps: TPOT is the step time over the tokens per step, and the
    pooled ITL has one gap per step (a chunk of tokens arrives together, as vllm bench serve
    records it)."""
    w = make_workload([0.0], [10], [31])
    rec, _ = simulate(w, speculative=Emission(3, 2, 2, draft_kv=False))
    r = rec.requests
    # 30 tokens after the first at floor(n * 1.5): 20 decode steps
    assert r["finish_s"][0] == 21.0
    assert (r["finish_s"][0] - r["first_token_s"][0]) / 30 == pytest.approx(20 / 30)
    assert rec.itl_counts.sum() == 20
    assert set(rec.itl_gaps_s.tolist()) == {1.0}


def test_speculating_requests_hold_their_lookahead_blocks():
    """Block size 4, k = 3 with draft KV: a decoding request holds blocks for its tokens plus
    1 + 6 slots (the verified position and 2k lookahead)."""
    w = make_workload([0.0], [8], [3])
    _, replica = simulate(w, block_size=4, until_s=1.5, speculative=Emission(1, 1, 3, True))
    (r,) = replica.running
    assert r.num_computed_tokens == 8 and r.num_lookahead_tokens == 6
    assert r.num_private_blocks == -(-(8 + 1 + 6) // 4)
    _, plain = simulate(w, block_size=4, until_s=1.5)
    assert plain.running[0].num_private_blocks == -(-(8 + 1) // 4)


# ---- the step model ------------------------------------------------------------------------
LLAMA = get_model("llama-3.1-8b")
H100 = get_gpu("h100-sxm")


def _model(cfg):
    return SpeculativeStepModel(build_step_model(LLAMA, H100, 1), LLAMA, cfg)


def test_step_model_prices_verify_and_draft():
    base = build_step_model(LLAMA, H100, 1)
    eagle = _model(spec(num_speculative_tokens=3))
    eagle7 = _model(spec(num_speculative_tokens=7))
    ngram = _model(spec(method="ngram", num_speculative_tokens=3, acceptance=0.5))
    for n, kv in [(1, 500), (32, 32 * 1000), (256, 256 * 2000)]:
        plain = base.step_time_s((), n, kv)
        assert plain < ngram.step_time_s((), n, kv) < eagle.step_time_s((), n, kv)
        assert eagle.step_time_s((), n, kv) < eagle7.step_time_s((), n, kv)
        # verifying 4 positions per sequence costs what 4n tokens of GEMMs cost, not 4 times
        # the step: the weights are read once
        assert ngram.step_time_s((), n, kv) < 4 * plain
    # prefill-only steps are not speculated
    assert eagle.step_time_s([(512, 0)], 0, 0) == base.step_time_s([(512, 0)], 0, 0)
    assert "speculative" in eagle.sources


def test_other_step_models_are_refused():
    from fleetsim.errors import FleetsimInputError
    from fleetsim.perf.base import ConstantStepModel
    with pytest.raises(FleetsimInputError, match="built-in table step model"):
        SpeculativeStepModel(ConstantStepModel(0.01), LLAMA, spec())


# ---- end to end ----------------------------------------------------------------------------
def _config(*sets):
    return load_config(None, ["model=llama-3.1-8b", "hardware.gpu=h100-sxm",
                              "workload.trace='synthetic'", "workload.arrival='at_once'",
                              "workload.num_requests=12",
                              "workload.prompt_tokens={kind='fixed', value=200}",
                              "workload.output_tokens={kind='fixed', value=100}",
                              "workload.max_concurrency=1", *sets])


def test_run_speeds_up_batch_one_decoding():
    base = run(_config()).summary
    fast = run(_config("engine.speculative.method=eagle3",
                       "engine.speculative.num_speculative_tokens=3")).summary
    assert fast["tpot_s"]["mean"] < 0.7 * base["tpot_s"]["mean"]
    assert fast["num_finished"] == base["num_finished"]


@pytest.mark.parametrize(("sets", "needle"), [
    (["engine.speculative.method=eagle3", "engine.speculative.num_speculative_tokens=0"],
     "num_speculative_tokens must be >= 1"),
    (["engine.speculative.method=lookahead", "engine.speculative.num_speculative_tokens=2"],
     "method must be one of"),
    (["engine.speculative.method=mtp", "engine.speculative.num_speculative_tokens=2",
      "engine.speculative.acceptance=1.5"], "acceptance must be in (0, 1]"),
    (["engine.speculative.method=eagle", "engine.speculative.num_speculative_tokens=2",
      "hardware.dp_attention=2", "model=mixtral-8x7b", "hardware.gpu=h200"],
     "not priced with dp_attention: the wide-EP model prices a rank's decode at one position"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, sets, needle):
    argv = ["run", "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


# ---- plan: the speculative on/off axis and the vllm serve lines ----------------------------
def test_plan_tries_each_shape_with_and_without_speculation():
    from fleetsim.search.deploy import vllm_serve_commands
    from fleetsim.search.plan import enumerate_shapes

    on = spec(draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    plain = enumerate_shapes(["h100"], [1], 2)
    both = enumerate_shapes(["h100"], [1], 2, speculative=(None, on))
    assert len(both) == 2 * len(plain)
    assert [s.name for s in both] == [s.name for s in plain] + [
        f"{s.name} eagle3 k3" for s in plain]
    config = _config()
    off_cfg, on_cfg = both[0].apply(config), both[len(plain)].apply(config)
    assert off_cfg.engine.speculative is None and on_cfg.engine.speculative == on
    assert both[0].family() != both[len(plain)].family()
    (line,) = vllm_serve_commands(on_cfg, both[len(plain)].pools)
    assert ("--speculative-config '{\"method\": \"eagle3\", \"model\": "
            "\"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B\", \"num_speculative_tokens\": 3}'") in line
    (line,) = vllm_serve_commands(off_cfg, both[0].pools)
    assert "--speculative-config" not in line


@pytest.mark.parametrize(("flag", "needle"), [
    ("eagle3", "write METHOD:K"),
    ("eagle3:0", "num_speculative_tokens must be >= 1"),
    ("medusa:2", "method must be one of"),
    ("ngram:3", "ngram has no published acceptance"),
])
def test_plan_refuses_bad_speculative_flags(capsys, flag, needle):
    code = main(["plan", "--gpus", "h100", "--max-gpus", "1", "--speculative", flag])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
