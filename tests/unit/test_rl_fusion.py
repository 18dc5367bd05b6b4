"""RLHFuse in the RL job: tail migration with inference on the freed GPUs, the fused
actor/critic training, DeepSpeed-Chat's static rounds: stage times add up, samples are
conserved, overlapped passes sit on freed GPUs only, and bad input is one line with exit 2."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.rl import rl_config_from_dict, run_rl
from fleetsim.rl.results import samples_table

PPO = {"num_steps": 2, "algorithm": "ppo", "actor": "llama-13b", "critic": "llama-13b",
       "num_prompts_per_step": 64, "samples_per_prompt": 1, "ppo_mini_batches": 2,
       "max_response_tokens": 1024,
       "lengths": {"kind": "polytrace", "run": "dapo-qwen2.5-32b", "scale": 0.05},
       "pools": [{"name": "all", "gpu": "h800", "num_gpus": 16}], "generation": {"tp": 2},
       "training": {"tp": 4, "pp": 4, "micro_batch_tokens": 2048},
       "inference": {"tp": 2, "pp": 1}}


def ppo(**system):
    return run_rl(rl_config_from_dict({**PPO, "system": {"name": "x", **system}}))


@pytest.fixture(scope="module")
def fused():
    return ppo(tail_migration_fraction=0.2, fuse_training=True, fusion_iterations=300)


@pytest.fixture(scope="module")
def plain():
    return ppo()


def test_stage_times_add_up_with_both_fusions(fused):
    for s in fused.summary["steps"]:
        assert "actor_critic_train" in s["stages_s"] and "actor_train" not in s["stages_s"]
        assert sum(s["stages_s"].values()) == pytest.approx(s["time_s"], rel=1e-9)
        assert s["overlapped_inference_s"] > 0


def test_samples_generated_scored_trained_once_with_fusion(fused):
    t = samples_table(fused.job)
    assert len(t["step"]) == 2 * 64
    assert (t["generated"] == 1).all() and (t["scored"] == 1).all()
    assert (t["trained"] == 1).all() and (t["trained_at_step"] == t["step"]).all()


def test_tail_moves_and_overlapped_passes_run_on_the_freed_gpus_only(fused):
    migrations = fused.summary["fusion"]["tail_migrations"]
    assert len(migrations) == 2
    rows = fused.rows
    for m in migrations:
        k = m["step"]
        assert m["num_moved"] > 0 and m["freed_gpus"] > 0
        assert m["num_left"] == int(np.ceil(0.2 * 64))
        gen = [r for r in rows if r.step == k and r.stage == "generation"]
        over = [r for r in rows if r.step == k and r.stage == "overlapped_inference"]
        assert over and all(r.num_gpus == m["freed_gpus"] for r in over)
        # The freed replicas stop generating before the overlapped passes start; the kept ones
        # generate on, overlapping them.
        freed_end = sorted(r.end_s for r in gen)[:m["freed_gpus"] // 2]
        assert max(freed_end) <= min(r.start_s for r in over) + 1e-12
        assert max(r.end_s for r in gen) > min(r.start_s for r in over)
        # Pool-wide stages never overlap generation or the overlapped passes.
        wide = [r for r in rows if r.step == k and r.stage not in (
            "generation", "overlapped_inference")]
        for a in wide:
            for b in gen + over:
                assert a.end_s <= b.start_s + 1e-12 or b.end_s <= a.start_s + 1e-12


def test_fusion_is_never_slower_than_plain(fused, plain):
    def train(result):
        return [sum(v for k, v in s["stages_s"].items() if "train" in k)
                for s in result.summary["steps"]]
    assert all(f <= p + 1e-9 for f, p in zip(train(fused), train(plain), strict=True))
    searches = fused.summary["fusion"]["fused_training_searches"]
    assert searches and all(s["fused_s"] <= s["sequential_1f1b_s"] + 1e-9 for s in searches)


def test_static_rounds_start_when_the_previous_round_has_finished():
    result = ppo(generation_rounds=2)
    t = samples_table(result.job)
    assert (t["generated"] == 1).all() and (t["trained"] == 1).all()
    req = result.job.gen.recorder.records().requests
    ids = np.asarray(req["request_id"])
    arrival, finish = np.empty(ids.max() + 1), np.empty(ids.max() + 1)
    arrival[ids], finish[ids] = req["arrival_s"], req["finish_s"]
    for k in range(2):
        ids = np.sort(result.job.steps[k].request_id)
        first, second = ids[:32], ids[32:]
        assert arrival[second].min() == pytest.approx(finish[first].max())


def test_fused_job_is_deterministic(fused):
    again = ppo(tail_migration_fraction=0.2, fuse_training=True, fusion_iterations=300)
    assert again.summary == fused.summary
