"""RLHFuse's baselines as they run (issue 22): DeepSpeed-Chat's padded static generation, its
ZeRO-3 parameter gathers and hybrid-engine gathers, its efficiency from its own published step
time; chat-length responses; each fusion's ablation. Every test fails with its mechanism off."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import roofline
from fleetsim.perf.training import BF16_BYTES, ForwardModel, Layout, PassModel
from fleetsim.rl import rl_config_from_dict, run_rl
from fleetsim.rl.lengths import sample_step, sharegpt_rows

PPO = {"num_steps": 1, "algorithm": "ppo", "actor": "llama-13b", "critic": "llama-13b",
       "num_prompts_per_step": 32, "samples_per_prompt": 1, "ppo_mini_batches": 2,
       "max_response_tokens": 1024, "lengths": {"kind": "sharegpt", "prompt_tokens": 256},
       "pools": [{"name": "all", "gpu": "h800", "num_gpus": 16}], "generation": {"tp": 8},
       "training": {"tp": 1, "pp": 1, "micro_batch_tokens": 2560},
       "inference": {"tp": 1, "pp": 1, "micro_batch_tokens": 2560}}


def ppo(system=None, zero3=False):
    par = {"tp": 1, "pp": 1, "micro_batch_tokens": 2560, "zero3": zero3}
    return run_rl(rl_config_from_dict({**PPO, "training": par, "inference": par,
                                       "system": {"name": "x", **(system or {})}}))


# ---- padded static generation (HF generate, synced_gpus) ----------------------------------
def test_padded_rounds_compute_every_sample_to_the_rounds_longest():
    padded = ppo({"generation_rounds": 2, "pad_to_longest": True})
    plain = ppo({"generation_rounds": 2})
    job, ref = padded.job, plain.job
    raw = ref.steps[0].batch.response_tokens
    resp = job.steps[0].batch.response_tokens
    ids = job.steps[0].request_id
    for half in (np.argsort(ids)[:16], np.argsort(ids)[16:]):
        # every sample of a round runs to the round's longest answer, and finishes with it
        assert (resp[half] == raw[half].max()).all()
        assert np.ptp(job.steps[0].finish_s[half]) == pytest.approx(0.0, abs=1e-9)
    assert np.ptp(ref.steps[0].finish_s) > 0
    s, p = padded.summary["steps"][0]["stages_s"], plain.summary["steps"][0]["stages_s"]
    assert s["generation"] > p["generation"]
    assert s["actor_train"] > p["actor_train"]  # training runs over the padded sequences


# ---- ZeRO-3 ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fwd13b():
    return ForwardModel(get_model("llama-13b"), get_gpu("h800"), 1)


def test_zero3_gathers_the_parameters_once_per_forward_and_once_per_backward(fwd13b):
    lay = Layout(dp=64, micro_batch_tokens=512, zero3=True)
    model = PassModel(fwd13b, lay, train=True)
    gpu = get_gpu("h800")
    expected = (63 / 64) * get_model("llama-13b").num_params * BF16_BYTES / (
        gpu.network_bw_bytes_per_s * roofline.ALLREDUCE_BW_EFF)
    assert model.param_gather_s() == pytest.approx(expected)
    # one 512-token sample per rank: far less compute than a 26 GB gather, so its forward
    # takes one gather and its backward a gather and the gradients' reduce-scatter
    r = model.run([512] * 64, optimizer_step=False, reduce_grads=False)
    assert r.time_s == pytest.approx(3 * expected)
    assert model.run([512] * 64, optimizer_step=False).time_s == pytest.approx(r.time_s)
    plain = PassModel(fwd13b, Layout(dp=64, micro_batch_tokens=512), train=True)
    assert plain.run([512] * 64, optimizer_step=False, reduce_grads=False).time_s < r.time_s
    # a forward-only pass gathers once
    inf = PassModel(fwd13b, lay, train=False).run([512] * 64)
    assert inf.time_s == pytest.approx(expected)


def test_zero3_reduces_gradients_inside_the_backward_and_needs_no_pipeline(fwd13b):
    assert PassModel(fwd13b, Layout(dp=8, zero3=True), train=True).grad_reduce_s() == 0.0
    assert PassModel(fwd13b, Layout(dp=8), train=True).grad_reduce_s() > 0
    assert PassModel(fwd13b, Layout(dp=1, zero3=True), train=True).param_gather_s() == 0.0
    with pytest.raises(Exception, match="zero3"):
        rl_config_from_dict({**PPO, "training": {"tp": 1, "pp": 2, "zero3": True}})


def test_the_hybrid_engine_gathers_zero3_weights_before_every_round():
    one = ppo({"generation_rounds": 1}, zero3=True).summary["steps"][0]["stages_s"]
    two = ppo({"generation_rounds": 2}, zero3=True).summary["steps"][0]["stages_s"]
    assert two["weight_sync"] == pytest.approx(2 * one["weight_sync"])
    assert one["weight_sync"] > 0


# ---- chat-length responses ----------------------------------------------------------------
def test_sharegpt_lengths_resample_shareGPTs_answers_capped():
    cfg = rl_config_from_dict({**PPO, "num_prompts_per_step": 4096,
                               "max_response_tokens": 2048})
    batch = sample_step(cfg, np.random.default_rng(0))
    _, answers = sharegpt_rows()
    expect = np.minimum(answers, 2048).mean()
    assert batch.response_tokens.mean() == pytest.approx(expect, rel=0.05)
    assert (batch.prompt_tokens == 256).all() and batch.response_tokens.max() <= 2048
    assert batch.response_tokens.mean() > 100  # not the 15-58 tokens of scaled DAPO lengths


# ---- the entry ----------------------------------------------------------------------------
def test_deepspeed_chats_efficiency_comes_from_its_published_table_2_step():
    from fleetsim.repro import rlhfuse

    modelled, published = rlhfuse.ds_chat_published_run("opt-13b")
    # 1.25 h per 264,292-sample epoch, a 1,024-sample step
    assert published == pytest.approx(1.25 * 3600 / 264_292 * 1024)
    assert modelled > 0


def test_the_entry_runs_deepspeed_chat_as_deepspeed_chat_runs_and_ablates_each_fusion():
    from fleetsim.repro import rlhfuse

    runs = rlhfuse.systems(1024, 32, 128, rlhfuse.QUICK_PAIR)
    ds = rl_config_from_dict(runs["deepspeed-chat"])
    assert ds.training.zero3 and ds.inference_layout.zero3
    assert ds.training.tp == ds.training.pp == 1 and ds.generation.tp == 8
    assert ds.system.pad_to_longest and ds.system.generation_rounds >= 1
    assert ds.lengths.kind == "sharegpt"
    full = runs["rlhfuse"]["system"]
    assert runs["rlhfuse-no-inter"]["system"] == {
        k: v for k, v in full.items() if k != "tail_migration_fraction"} | {
        "name": "rlhfuse-no-inter"}
    assert runs["rlhfuse-no-intra"]["system"] == {
        k: v for k, v in full.items() if k != "fuse_training"} | {"name": "rlhfuse-no-intra"}
