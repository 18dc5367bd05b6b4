"""The RL job: stage accounting, no overlap on colocated GPUs, sample conservation, generation
equal to a plain serving run, the training-side cost model, and one-line input errors."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.core.simulator import Simulator
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.perf.training import ForwardModel, Layout, PassModel, pack
from fleetsim.rl import rl_config_from_dict, run_rl
from fleetsim.rl.process import Kernel, Timeout
from fleetsim.rl.results import samples_table

SMALL = {"num_steps": 2, "actor": "llama-3.1-8b", "num_prompts_per_step": 16,
         "samples_per_prompt": 4, "max_response_tokens": 2048,
         "pools": [{"name": "all", "gpu": "h100", "num_gpus": 2}]}


def small(**kw):
    return rl_config_from_dict({**SMALL, **kw})


def disaggregated(**system):
    return small(pools=[{"name": "gen", "gpu": "h100", "num_gpus": 2, "stages": ["generation"]},
                        {"name": "train", "gpu": "h100", "num_gpus": 2,
                         "stages": ["inference", "training"]}],
                 num_steps=3, system={"name": "x", **system})


@pytest.fixture(scope="module")
def colocated_run():
    return run_rl(small())


def test_colocated_stage_times_add_up_to_the_step_time(colocated_run):
    steps = colocated_run.summary["steps"]
    assert len(steps) == 2
    for s in steps:
        assert set(s["stages_s"]) == {"weight_sync", "generation", "old_logprob", "reference",
                                      "actor_train"}
        assert sum(s["stages_s"].values()) == pytest.approx(s["time_s"], rel=1e-9)
        assert all(v > 0 for v in s["stages_s"].values())


def test_colocated_stages_never_overlap_on_the_same_gpus(colocated_run):
    rows = colocated_run.rows
    pool_wide = [r for r in rows if r.stage != "generation"]
    gen = [r for r in rows if r.stage == "generation"]
    assert gen and pool_wide
    # Pool-wide stages occupy every GPU: disjoint from each other and from every generation
    # lane; a generation lane is one replica's GPUs.
    everything = sorted(pool_wide + gen, key=lambda r: r.start_s)
    for a in pool_wide:
        for b in everything:
            if a is not b:
                assert a.end_s <= b.start_s + 1e-12 or b.end_s <= a.start_s + 1e-12, (a, b)


def test_colocated_samples_generated_scored_trained_once(colocated_run):
    t = samples_table(colocated_run.job)
    assert len(t["step"]) == 2 * 16 * 4
    assert (t["generated"] == 1).all() and (t["scored"] == 1).all()
    assert (t["trained"] == 1).all()
    assert (t["gen_version"] == t["step"]).all()  # on-policy: generated with the newest
    assert (t["trained_at_step"] == t["step"]).all()


def test_async_samples_trained_once_with_staleness_at_most_one():
    result = run_rl(disaggregated(streaming=True, staleness=1))
    t = samples_table(result.job)
    assert (t["generated"] == 1).all() and (t["scored"] == 1).all()
    assert (t["trained"] == 1).all()
    staleness = t["trained_at_step"] - t["gen_version"]
    assert staleness.min() >= 0 and staleness.max() <= 1
    assert staleness.max() == 1  # generation really ran ahead of training
    gen = [r for r in result.rows if r.stage == "generation" and r.step == 1]
    train = [r for r in result.rows if r.stage == "actor_train" and r.step == 0]
    assert min(r.start_s for r in gen) < max(r.end_s for r in train)  # overlapped


def test_sync_disaggregated_is_on_policy_and_streaming_is_not_slower():
    plain = run_rl(disaggregated(streaming=False))
    stream = run_rl(disaggregated(streaming=True))
    for result in (plain, stream):
        t = samples_table(result.job)
        assert (t["gen_version"] == t["step"]).all() and (t["trained"] == 1).all()
    assert stream.summary["makespan_s"] <= plain.summary["makespan_s"]


def test_generation_matches_a_plain_fleetsim_run(colocated_run, tmp_path):
    from fleetsim.config import config_from_dict
    from fleetsim.run import run
    from fleetsim.workloads import Workload
    from fleetsim.workloads.loaders import save_generic_csv

    job = colocated_run.job
    rec = job.steps[0]
    b = rec.batch
    trace = tmp_path / "batch.csv"
    save_generic_csv(Workload(arrival_s=np.zeros(b.num_samples), num_prompt_tokens=b.prompt_tokens,
                              num_output_tokens=b.response_tokens), trace)
    eng = job.cfg.generation.engine
    plain = run(config_from_dict({
        "model": "llama-3.1-8b",
        "cluster": {"pools": [{"name": "all", "gpu": "h100", "num_replicas": 2, "tp": 1}]},
        "engine": {"max_running": eng.max_running,
                   "gpu_memory_utilization": eng.gpu_memory_utilization,
                   "enable_prefix_caching": eng.enable_prefix_caching},
        "workload": {"trace": str(trace)}}))
    req = plain.records.requests
    plain_finish = np.empty(b.num_samples)
    plain_finish[req["request_id"]] = req["finish_s"]
    ours = rec.finish_s - rec.gen_start_s
    assert np.allclose(ours, plain_finish, rtol=1e-9, atol=1e-9)
    assert plain.summary["num_finished"] == b.num_samples


def test_process_kernel_orders_timeouts_and_all_of():
    sim = Simulator()
    kernel = Kernel(sim)
    log = []
    a, b = kernel.event(), kernel.event()

    def waiter():
        yield kernel.all_of([a, b])
        log.append(("both", sim.now_s))

    def firer(ev, delay, name):
        yield Timeout(delay)
        log.append((name, sim.now_s))
        ev.succeed()

    kernel.start(waiter())
    kernel.start(firer(a, 2.0, "a"))
    kernel.start(firer(b, 1.0, "b"))
    sim.run()
    assert log == [("b", 1.0), ("a", 2.0), ("both", 2.0)]


# ---- the training-side cost model -------------------------------------------------------
@pytest.fixture(scope="module")
def fwd8b():
    from fleetsim.models import get_model

    return ForwardModel(get_model("llama-3.1-8b"), get_gpu("h100"), 1)


def test_1f1b_bubble_is_p_minus_1_over_p_minus_1_plus_m(fwd8b):
    """Inference over m equal micro-batches on p stages: (m + p - 1) stage times."""
    p, m = 4, 12
    model = PassModel(fwd8b, Layout(pp=p, micro_batch_tokens=4096), train=False)
    r = model.run([4096] * m)
    assert r.num_micro_batches == m
    assert r.bubble_s / (r.compute_s + r.bubble_s) == pytest.approx((p - 1) / (p - 1 + m))


def test_backward_and_recomputation_costs(fwd8b):
    seqs = [2048] * 8
    times = {}
    for mode in ("none", "selective", "full"):
        lay = Layout(micro_batch_tokens=4096, recompute=mode)
        times[mode] = PassModel(fwd8b, lay, train=True).run(seqs, optimizer_step=False).time_s
    fwd = PassModel(fwd8b, Layout(micro_batch_tokens=4096), train=False).run(seqs).time_s
    assert times["none"] == pytest.approx(3 * fwd, rel=1e-9)  # tp=1: no TP all-reduce
    assert times["none"] < times["selective"] < times["full"] == pytest.approx(4 * fwd)


def _forward_one_at_a_time(fwd, seq_lens):
    """``ForwardModel.forward`` as it was before it was vectorised: one micro-batch, its
    head looked up on a 0-d value."""
    num_tokens = sum(seq_lens)
    if num_tokens <= 0:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    comm = fwd._comm(num_tokens)
    per_token = sum(f(num_tokens) for f in fwd._per_token) + comm
    moe = float(fwd._per_token[1](num_tokens))
    attention = fwd.attention_scale * float(fwd._attn(np.asarray(seq_lens, np.float64)).sum())
    head = float(fwd._head(np.float64(num_tokens))) if fwd.lm_head else 0.0
    return (per_token + attention, attention, head, comm, moe)


@pytest.mark.parametrize(("model", "tp", "head", "scale"), [
    ("llama-3.1-8b", 2, True, 1.0), ("mixtral-8x7b", 4, False, 1.3)])
def test_forward_many_is_one_micro_batch_at_a_time_bit_for_bit(model, tp, head, scale):
    """The vectorised, memoised forward gives every micro-batch's times exactly as timing it
    alone did: short and long sequences, beyond the attention grid (2**21 tokens), empty."""
    from fleetsim.models import get_model

    rng = np.random.default_rng(7)
    mbs = [rng.integers(1, 40_000, rng.integers(1, 30)).tolist() for _ in range(60)]
    mbs += [[3_000_000], [2_500_000, 7], [], [0, 0], [1], mbs[3], mbs[3][::-1]]
    fresh = ForwardModel(get_model(model), get_gpu("h100"), tp, lm_head=head,
                         attention_scale=scale)
    want = [_forward_one_at_a_time(fresh, mb) for mb in mbs]
    got = fresh.forward_many(mbs)  # all at once, repeats included
    assert [(t.layers_s, t.attention_s, t.head_s, t.comm_s, t.moe_s) for t in got] == want
    # the memo answers what was timed in another grouping with the same values
    again = ForwardModel(get_model(model), get_gpu("h100"), tp, lm_head=head,
                         attention_scale=scale)
    parts = [again.forward(mb) for mb in mbs[::-1]][::-1]
    assert parts == got and again.forward_many(mbs) == got


def test_forward_memo_forgets_past_its_bound_and_gives_the_same_times(fwd8b, monkeypatch):
    import fleetsim.perf.training as training

    mbs = [[100 * k + 1, 7] for k in range(30)]
    want = fwd8b.forward_many(mbs)
    monkeypatch.setattr(training, "FORWARD_MEMO_MAX", 8)
    fresh = ForwardModel(fwd8b.model, fwd8b.gpu, fwd8b.tp)
    assert fresh.forward_many(mbs[:6]) == want[:6]
    assert fresh.forward_many(mbs[3:9]) == want[3:9]  # three remembered, then cleared
    assert len(fresh._memo) == 6
    assert fresh.forward_many(mbs) == want


def test_pack_respects_the_token_budget():
    bins = pack([5000, 3000, 3000, 2000, 9000, 100], 8192)
    assert sorted(s for b in bins for s in b) == [100, 2000, 3000, 3000, 5000, 9000]
    assert all(sum(b) <= 8192 or len(b) == 1 for b in bins)


@pytest.mark.parametrize("n", [5, 64, 65, 700])
def test_pack_is_first_fit_decreasing_at_every_size(n):
    """Searching only the bins that can still take the shortest sequence packs as first fit
    over every bin does (over-budget sequences, exact fits, hundreds of bins)."""
    rng = np.random.default_rng(n)
    seqs = rng.integers(0, 12_000, n).tolist() + [20_000, 9_000]  # one over the budget

    bins, room = [], []
    for s in sorted(seqs, reverse=True):
        i = next((i for i, r in enumerate(room) if s <= r), None)
        if i is None:
            bins.append([s])
            room.append(8192 - s)
        else:
            bins[i].append(s)
            room[i] -= s
    assert pack(seqs, 8192) == bins


# ---- bad input: one line, the field, the fix, exit 2 ------------------------------------
@pytest.mark.parametrize(("overrides", "field"), [
    (["samples_per_prompt=0"], "samples_per_prompt"),
    (["system.staleness=-1"], "staleness"),
    (["actor=\"qwen2.5-32b\"", "pools=[{name=\"p\",gpu=\"h100\",num_gpus=1}]"],
     "pools[0]"),
    (["training.tp=4", "training.pp=4", "pools=[{name=\"p\",gpu=\"h100\",num_gpus=8}]"],
     "rl.training.pp"),
    (["pools=[{name=\"p\",gpu=\"h100\",num_gpus=0}]"], "num_gpus"),
    # RLHFuse's fusions (tests/unit/test_rl_fusion.py)
    (["system.tail_migration_fraction=1.5"], "tail_migration_fraction"),
    (["system.fuse_training=true"], "fuse_training"),
    (["system.generation_rounds=0"], "generation_rounds"),
    (["system.fusion_iterations=-1"], "fusion_iterations"),
    (["system.tail_migration_fraction=0.2",
      "pools=[{name=\"g\",num_gpus=2,stages=[\"generation\"]},"
      "{name=\"t\",num_gpus=2,stages=[\"inference\",\"training\"]}]"],
     "tail_migration_fraction"),
])
def test_bad_input_is_one_line_naming_the_field(overrides, field, capsys, tmp_path):
    argv = ["rl", "run", "--out", str(tmp_path / "out")]
    for o in overrides:
        argv += ["--set", o]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err and "fleetsim: error:" in err


def test_stage_missing_from_every_pool_is_an_input_error():
    with pytest.raises(FleetsimInputError, match="training"):
        small(pools=[{"name": "g", "num_gpus": 2, "stages": ["generation", "inference"]}])


def test_cli_writes_summary_timeline_and_gantt(tmp_path, capsys):
    out = tmp_path / "rl"
    assert main(["rl", "run", "--set", "num_steps=1", "--set", "num_prompts_per_step=4",
                 "--set", "samples_per_prompt=2", "--set", "actor=\"llama-3.1-8b\"",
                 "--set", "pools=[{name=\"p\",gpu=\"h100\",num_gpus=2}]",
                 "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"summary.json", "timeline.csv", "config.json",
                                               "gantt.png"}
    text = capsys.readouterr().out
    assert "samples/s" in text and "GPU utilisation" in text


def test_the_rl_papers_models_are_in_the_catalog(capsys):
    from fleetsim.models import get_model

    assert main(["models", "--json"]) == 0
    listed = capsys.readouterr().out
    for name in ("Qwen2.5-7B", "Qwen2.5-14B", "Qwen2.5-32B", "LLaMA-13B", "LLaMA-33B",
                 "LLaMA-65B"):
        assert name in listed
    # huggyllama/llama-30b config.json: 60 layers, 6656 hidden, 52 heads (the paper's 33B)
    spec = get_model("huggyllama/llama-30b")
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (60, 6656, 52)
    assert get_model("qwen2.5-7b") is get_model("Qwen/Qwen2.5-7B")
