"""The agentic generation source: an RL job whose rollouts are multi-turn trajectory batches
(``rl.generation.source = "agentic"``) runs end to end from config, its step time holds the
rollout (tool waits lengthen it), every sample is generated, scored and trained once, the
first step's rollout is ``run_agentic_rollout``'s, same seed same job, and bad values are
one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.rl import rl_config_from_dict, run_rl
from fleetsim.rl.agentic_rollout import run_agentic_rollout
from fleetsim.rl.config import GENERATION_SOURCES
from fleetsim.rl.results import samples_table
from fleetsim.rl.sources import GENERATION_SOURCES as REGISTERED
from fleetsim.rl.sources import rollout_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_agentic.toml"
SMALL = {"num_steps": 2, "actor": "qwen3-8b", "num_prompts_per_step": 4,
         "samples_per_prompt": 4, "max_response_tokens": 4096,
         "pools": [{"name": "all", "gpu": "h100", "num_gpus": 2}],
         "generation": {"source": "agentic", "engine": {"enable_prefix_caching": True}}}


def agentic(*, agentic_opts=None, **kw):
    data = {**SMALL, **kw}
    data["generation"] = {**SMALL["generation"], "agentic": agentic_opts or {}}
    return rl_config_from_dict(data)


def gen_s(result, k=0):
    return result.summary["steps"][k]["stages_s"]["generation"]


def test_every_source_in_the_config_is_registered():
    assert set(REGISTERED) == set(GENERATION_SOURCES)


def test_the_example_runs_from_the_cli(tmp_path, capsys):
    out = tmp_path / "rl"
    assert main(["rl", "run", str(EXAMPLE), "--set", "num_steps=1",
                 "--set", "num_prompts_per_step=2", "--set", "samples_per_prompt=2",
                 "--set", "generation.agentic.anneal_steps=20", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generation"]["source"] == "agentic"
    assert summary["config"]["generation"]["source"] == "agentic"
    rollout = summary["generation"]["rollout_by_step"][0]
    # The step's generation stage is the rollout: its last trajectory's finish.
    assert summary["steps"][0]["stages_s"]["generation"] == pytest.approx(rollout["rollout_s"])
    assert "generation" in capsys.readouterr().out


def test_tool_waits_lengthen_the_step():
    """The same trajectories (same draws: only the tool's median differs), three turns each,
    with two 20 s tool waits or two 1 ms ones: the waits are in the step's generation stage
    and so in its step time; a source that ignored the turns would see neither."""
    opts = {"turn_shares": [0.0, 0.0, 1.0], "tool_sigma": 0.0}
    slow = run_rl(agentic(agentic_opts={**opts, "tool_median_s": 20.0}, num_steps=1))
    fast = run_rl(agentic(agentic_opts={**opts, "tool_median_s": 0.001}, num_steps=1))
    a, b = slow.job.steps[0].batch, fast.job.steps[0].batch
    assert np.array_equal(a.response_tokens, b.response_tokens)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert gen_s(slow) >= 40.0
    assert gen_s(slow) > gen_s(fast) + 30.0
    assert slow.summary["mean_step_time_s"] > fast.summary["mean_step_time_s"] + 30.0
    # a trajectory's training sequence is its whole context: its turns' outputs and the tool
    # results between them, more than the tokens generated
    gen = slow.summary["generation"]["rollout_by_step"][0]["num_generated_tokens"]
    assert int(a.response_tokens.sum()) > gen


def test_multi_turn_is_slower_than_one_turn_of_the_same_total():
    """One turn of every trajectory's total length (no tools, no re-prefill) generates the
    same tokens faster than the turns with waits between them: the source runs the turns."""
    multi = run_rl(agentic(agentic_opts={"turn_shares": [0.0, 0.0, 1.0], "tool_sigma": 0.0,
                                         "tool_median_s": 2.0}, num_steps=1))
    single = run_rl(rl_config_from_dict({
        **SMALL, "num_steps": 1, "generation": {"source": "single_turn"},
        "lengths": {"kind": "fixed", "value": int(multi.summary["generation"][
            "rollout_by_step"][0]["num_generated_tokens"] // 16)}}))
    assert gen_s(multi) > gen_s(single)


def test_first_step_is_the_agentic_rollout_of_the_jobs_config():
    cfg = agentic(agentic_opts={"placement": "heddle", "scheduling": "progressive_priority",
                                "migration": True})
    job = run_rl(cfg)
    alone = run_agentic_rollout(rollout_config(cfg)).summary
    first = job.summary["generation"]["rollout_by_step"][0]
    assert first["rollout_s"] == alone["rollout_s"]
    assert first["num_generated_tokens"] == alone["num_generated_tokens"]
    assert gen_s(job, 0) == pytest.approx(alone["rollout_s"])
    # the next step draws a new batch
    assert job.summary["generation"]["rollout_by_step"][1] != first


@pytest.mark.parametrize("pools", [
    [{"name": "all", "gpu": "h100", "num_gpus": 2}],
    [{"name": "gen", "gpu": "h100", "num_gpus": 2, "stages": ["generation"]},
     {"name": "train", "gpu": "h100", "num_gpus": 2, "stages": ["inference", "training"]}],
])
def test_every_trajectory_is_generated_scored_and_trained_once(pools):
    system = {"streaming": True} if len(pools) > 1 else {}
    r = run_rl(agentic(pools=pools, system=system, ppo_mini_batches=2))
    t = samples_table(r.job)
    assert len(t["step"]) == 2 * 16
    for col in ("generated", "scored", "trained"):
        assert (t[col] == 1).all()
    assert np.isfinite(t["finish_s"]).all()
    # colocated: training starts once the last trajectory has finished; streaming: the
    # trainer hears each group's finish at its time and trains the first ones meanwhile
    for k, rec in enumerate(r.job.steps):
        train = min(row.start_s for row in r.rows if row.step == k and row.stage == "actor_train")
        if len(pools) == 1:
            assert train >= float(rec.finish_s.max())
        elif k == 0:
            assert train < float(rec.finish_s.max())


def test_resource_manager_sizes_each_step(tmp_path):
    cfg = agentic(agentic_opts={"placement": "heddle", "scheduling": "progressive_priority",
                                "resource_manager": True, "anneal_steps": 30},
                  pools=[{"name": "all", "gpu": "h100", "num_gpus": 4}])
    r = run_rl(cfg)
    splits = r.summary["generation"]["split_by_step"]
    assert len(splits) == 2 and all(sum(s) == 4 for s in splits)
    gens = [row for row in r.rows if row.stage == "generation" and row.step == 0]
    assert sum(row.num_gpus for row in gens) <= 4


def test_same_seed_same_job_other_seed_other_job():
    cfg = agentic(agentic_opts={"placement": "heddle", "scheduling": "progressive_priority"})
    a, b = run_rl(cfg).summary, run_rl(cfg).summary
    assert a == b
    c = run_rl(agentic(agentic_opts={"placement": "heddle",
                                     "scheduling": "progressive_priority"}, seed=1)).summary
    assert c["steps"] != a["steps"]


@pytest.mark.parametrize(("overrides", "field"), [
    (["generation.source=\"multi\""], "source"),
    (["generation.agentic.placement=\"nearest\""], "placement"),
    (["generation.agentic.migration=true"], "migration"),
    (["generation.agentic.resource_manager=true", "generation.agentic.placement=\"sticky\""],
     "resource_manager"),
    (["generation.agentic.split=[2,2]", "generation.agentic.placement=\"heddle\""], "split"),
    (["generation.agentic.preemption_mode=\"swap\""], "swap_space_gib"),
    (["generation.agentic.turn_shares=[0.5]"], "turn_shares"),
    (["generation.agentic.tool_median_s=-1"], "tool_median_s"),
    (["generation.agentic.max_context_tokens=1000000"], "max_context_tokens"),
    (["system.dispatch=\"skewness_aware\""], "system.dispatch"),
    (["system.generation_rounds=2"], "generation_rounds"),
    (["lengths.kind=\"fixed\""], "lengths.kind"),
    (["generation.tp=3"], "generation.tp"),
])
def test_bad_agentic_input_is_one_line_naming_the_field(overrides, field, capsys, tmp_path):
    argv = ["rl", "run", "--out", str(tmp_path / "out"), "--set", "actor=\"qwen3-8b\"",
            "--set", "generation.source=\"agentic\"",
            "--set", "pools=[{name=\"p\",gpu=\"h100\",num_gpus=2}]"]
    for o in overrides:
        argv += ["--set", o]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err and "fleetsim: error:" in err
