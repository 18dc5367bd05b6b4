"""``cluster.soc``: an SoC's NPU and iGPU as pools of the one engine, their steps jobs on the
shared DDR. Golden tests against the figures of the retired SoC loop (``soc/engine.py``,
recorded in ``data/soc_engine_reference.json`` before it was deleted) on cases both ran,
fast-forward equal to stepping, and bad input as one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost
from fleetsim.perf.soc_calibration import lunar_lake
from fleetsim.run import build_pools, run
from fleetsim.serving.shared_steps import SharedStepModel
from fleetsim.workloads.workload import Workload

MODEL = "Llama-3.2-3B"
PROMPT, OUTPUT = 300, 100
TIMES_S = (0.0, 0.5, 0.55, 0.6, 4.0, 4.05, 9.0)


def _config(pools, *, max_running=8, max_batched_tokens=PROMPT, fast_forward=True,
            engine_extra=False, **extra):
    return config_from_dict({
        "model": MODEL, "seed": 0,
        "cluster": {"pools": pools, "soc": {}, "link": {"latency_s": 0.0}},
        "engine": {"max_running": max_running, "max_batched_tokens": max_batched_tokens,
                   "fast_forward": fast_forward, **({"track_itl": True} if engine_extra else {})},
        **extra})


def _workload(times=TIMES_S):
    n = len(times)
    return Workload(arrival_s=np.array(times, dtype=np.float64),
                    num_prompt_tokens=np.full(n, PROMPT, dtype=np.int64),
                    num_output_tokens=np.full(n, OUTPUT, dtype=np.int64))


def _engine_times(result):
    r = result.records.requests
    order = np.argsort(r["request_id"])
    return r["first_token_s"][order], r["finish_s"][order]


REFERENCE = json.loads((Path(__file__).parent / "data" / "soc_engine_reference.json")
                       .read_text())


def _soc_engine_times(case):
    """The retired SoC loop's (first token, finish) times of ``TIMES_S``'s requests: FCFS one
    at a time on the iGPU (``igpu_fcfs``), or whole prompts on the NPU one at a time and one
    decode step of every decoding request on the iGPU (``prefill_npu_decode_igpu``)."""
    ref = REFERENCE[case]
    return np.array(ref["first_token_s"]), np.array(ref["finish_s"])


def test_pools_step_on_the_shared_ddr():
    config = _config([{"name": "p", "gpu": "npu", "role": "prefill"},
                      {"name": "d", "gpu": "igpu", "role": "decode"}])
    setups, infos = build_pools(config, get_model(MODEL))
    models = [s.step_model for s in setups]
    assert all(isinstance(m, SharedStepModel) and m.resource == "ddr" for m in models)
    soc = lunar_lake()
    assert models[0].capacity_per_s == soc.achievable_bw_bytes_per_s
    # each accelerator draws at most its own measured share of the DDR
    assert models[0].max_rate == soc.npu.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s)
    assert models[1].max_rate == soc.igpu.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s)
    assert [i["gpu"] for i in infos] == ["Core Ultra 7 258V npu", "Core Ultra 7 258V igpu"]
    # the two pools split what the weights leave of the 32 GB
    cost = ModelCost(get_model(MODEL), 4.5)
    one = setups[0].num_kv_blocks * 16 * cost.kv_bytes_per_token
    assert 0.3 * 32e9 < one < 0.5 * 32e9


def test_a_step_costs_what_the_soc_engine_charged():
    cost = ModelCost(get_model(MODEL), 4.5)
    assert cost.step([(256, 512)], 0, 0) == cost.prefill(256, 512)
    # a decode's context is its computed tokens plus the one it feeds in
    assert cost.step((), 3, 300 + 40 + 7) == cost.decode([301, 41, 8])
    mixed = cost.step([(256, 0)], 2, 600)
    alone = cost.prefill(256, 0).bytes + cost.decode([301, 301]).bytes - cost.weight_bytes
    assert mixed.bytes == pytest.approx(alone, rel=1e-12)


def test_igpu_fcfs_equals_the_soc_engine():
    """One request at a time on the iGPU (the igpu-only baseline): request by request."""
    config = _config([{"name": "igpu", "gpu": "igpu"}], max_running=1,
                     max_batched_tokens=2048)
    first, finish = _engine_times(run(config, workload=_workload()))
    old_first, old_finish = _soc_engine_times("igpu_fcfs")
    np.testing.assert_allclose(first, old_first, rtol=1e-9)
    np.testing.assert_allclose(finish, old_finish, rtol=1e-9)
    assert finish[-1] > finish[-2] + 1.0  # queued requests waited (the case is not trivial)


def test_prefill_on_npu_decode_on_igpu_shares_the_ddr_as_the_soc_engine():
    """Prefills on the NPU while the iGPU decodes: both slow on the shared DDR, exactly as the
    SoC engine's contention model has it."""
    pools = [{"name": "p", "gpu": "npu", "role": "prefill"},
             {"name": "d", "gpu": "igpu", "role": "decode"}]
    first, finish = _engine_times(run(_config(pools), workload=_workload()))
    old_first, old_finish = _soc_engine_times("prefill_npu_decode_igpu")
    np.testing.assert_allclose(first, old_first, rtol=1e-9)
    np.testing.assert_allclose(finish, old_finish, rtol=1e-9)


def test_a_prefill_on_the_npu_slows_the_igpu_decode():
    """The asymmetric contention (Agent.xpu's profiling): a compute-bound NPU prefill draws
    little DDR yet slows the memory-bound iGPU decode running beside it."""
    pools = [{"name": "p", "gpu": "npu", "role": "prefill"},
             {"name": "d", "gpu": "igpu", "role": "decode"}]

    def itl_max_of_first(times):
        config = _config(pools, engine_extra=True)
        r = run(config, workload=_workload(times)).records.requests
        return float(r["itl_max_s"][np.argsort(r["request_id"])][0])

    alone = itl_max_of_first((0.0, 60.0))
    beside = itl_max_of_first((0.0, 0.5))
    assert beside > 1.05 * alone


@pytest.mark.parametrize("pools", [
    [{"name": "p", "gpu": "npu", "role": "prefill"}, {"name": "d", "gpu": "igpu",
                                                       "role": "decode"}],
    [{"name": "a", "gpu": "npu"}, {"name": "b", "gpu": "igpu"}],
])
def test_fast_forward_equals_stepping(pools):
    extra = {"cluster": {"pools": pools, "soc": {}, "router": {"name": "round_robin"},
                         "link": {"latency_s": 0.0}}}
    runs = []
    for ff in (True, False):
        config = _config(pools, fast_forward=ff, max_batched_tokens=256, **extra)
        runs.append(_engine_times(run(config, workload=_workload())))
    for a, b in zip(runs[0], runs[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def _cli(tmp_path, capsys, toml: str) -> tuple[int, str]:
    path = tmp_path / "c.toml"
    path.write_text(f'model = "{MODEL}"\n' + toml)
    code = main(["run", str(path), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("toml", "needle"), [
    ('[hardware]\ngpu = "H100"\n[cluster]\nsoc = {}\n', "hardware.gpu"),
    ('[hardware]\ngpu = "igpu"\nnum_replicas = 2\n[cluster]\nsoc = {}\n', "num_replicas"),
    ('[cluster]\nsoc = {}\npools = [{name = "a", gpu = "npu"}, {name = "b", gpu = "npu"}]\n',
     "cluster.pools (b).gpu"),
    ('[hardware]\ngpu = "igpu"\n[cluster]\nsoc = {device = "m4"}\n', "cluster.soc.device"),
    ('[hardware]\ngpu = "igpu"\n[cluster]\nsoc = {bits_per_weight = 0}\n', "bits_per_weight"),
    ('quantization = "fp8"\n[hardware]\ngpu = "igpu"\n[cluster]\nsoc = {}\n', "quantization"),
    ('[hardware]\ngpu = "igpu"\n[cluster]\nsoc = {cores = 2}\n', "cores"),
    ('[policy]\nbatching = {name = "serve_best", args = {max_serving = 0}}\n', "max_serving"),
    ('[policy]\nbatching = {name = "serve_best", args = {ordering = "lifo"}}\n', "lifo"),
])
def test_bad_soc_input_is_one_line_exit_2(tmp_path, capsys, toml, needle):
    code, err = _cli(tmp_path, capsys, toml)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("accelerator", ["npu", "igpu"])
def test_a_decode_window_is_priced_as_its_steps_bit_for_bit(accelerator):
    """Fast-forward prices a decode window vectorized; each step must equal the scalar
    price exactly, or windows and stepping would drift apart."""
    from fleetsim.soc_pools import soc_step_model
    model = soc_step_model(lunar_lake(), ModelCost(get_model(MODEL), 4.5), accelerator)
    kv = np.array([0, 1, 7, 300, 4096, 65_000, 2_000_000], dtype=np.int64)
    for n in (1, 3, 64):
        window = model.decode_step_times_s(n, kv)
        steps = [model.step_time_s((), n, int(k)) for k in kv]
        assert window.tolist() == steps


@pytest.mark.parametrize(("order", "ordering", "pause"), [
    ("fcfs", "fcfs", False), ("reactive_next", "priority", False),
    ("reactive_first", "priority", True)])
def test_agent_traffic_on_the_engine_equals_the_soc_engine(order, ordering, pause):
    """Agent.xpu's traffic (Poisson reactive requests, closed-loop proactive flows, trace
    lengths) served by the iGPU-only baselines (FCFS, a priority queue, priority with paused
    requests): the engine gives the SoC engine's figures."""
    from fleetsim.repro.agent_xpu import IGPU, AgentXpuSetup, OnEngine, simulate, summarize
    setup = AgentXpuSetup(duration_s=240.0, num_proactive_flows=3, seed=3)
    new = summarize(simulate(setup, 6.0, OnEngine(IGPU, ordering=ordering, pause=pause)))
    old = dict(REFERENCE[f"agent_traffic_igpu_{order}"])
    assert new.pop("busy_share")["igpu"] == pytest.approx(old.pop("busy_share")["igpu"])
    assert new["num_reactive"] > 10 and new["proactive_per_min"] > 0
    assert new == pytest.approx(old, rel=1e-9)


def test_one_pool_is_priced_as_a_step_alone_on_the_ddr():
    """A one-pool SoC cluster never shares the bus: it skips the sharing machinery and
    prices every step as the shared model prices a step run alone."""
    from fleetsim.soc_pools import AloneOnDdr
    setups, _ = build_pools(_config([{"name": "igpu", "gpu": "igpu"}]), get_model(MODEL))
    model = setups[0].step_model
    assert isinstance(model, AloneOnDdr) and not isinstance(model, SharedStepModel)
    shared = model.shared
    for args in (([(256, 0)], 0, 0), ((), 4, 3000), ([(100, 50)], 2, 700)):
        assert model.step_time_s(*args) == shared.step_time_s(*args)
        private_s, work = shared.demand(*args)[:2]
        assert model.step_time_s(*args) >= max(private_s, work / shared.capacity_per_s)


def test_tensor_split_on_the_engine_equals_the_soc_engine():
    """The static-partition baseline: one replica on npu+igpu, every prefill split at its
    best NPU share (the halves sharing the DDR), decode where its share puts it."""
    from fleetsim.repro.agent_xpu import SPLIT, AgentXpuSetup, OnEngine, simulate, summarize
    setup = AgentXpuSetup(duration_s=240.0, num_proactive_flows=3, seed=5)
    new = summarize(simulate(setup, 6.0, OnEngine(SPLIT)))
    old = dict(REFERENCE["agent_traffic_static_partition"])
    new.pop("busy_share"), old.pop("busy_share")
    assert new["num_reactive"] > 10
    assert new == pytest.approx(old, rel=1e-9)


def test_a_tensor_split_is_the_only_pool():
    config = _config([{"name": "a", "gpu": "npu+igpu"}, {"name": "b", "gpu": "igpu"}])
    with pytest.raises(FleetsimInputError, match="only pool"):
        build_pools(config, get_model(MODEL))
    setups, _ = build_pools(_config([{"name": "a", "gpu": "npu+igpu"}]), get_model(MODEL))
    split = setups[0].step_model
    assert 0 < split.prefill_npu_share < 1 and split.decode_npu_share == 0.0
    # a prefill split over both beats either accelerator alone
    igpu, _ = build_pools(_config([{"name": "a", "gpu": "igpu"}]), get_model(MODEL))
    assert split.step_time_s([(1024, 0)], 0, 0) < igpu[0].step_model.step_time_s(
        [(1024, 0)], 0, 0)


def test_the_documented_example_runs(tmp_path):
    from pathlib import Path
    example = Path(__file__).resolve().parents[2] / "examples" / "soc.toml"
    assert main(["run", str(example), "--out", str(tmp_path / "out"),
                 "--set", "workload.num_requests=10"]) == 0


@pytest.mark.parametrize("accelerator", ["igpu", "npu"])
def test_short_soc_windows_priced_step_by_step_equal_the_vectorized_path(accelerator):
    """An SoC decode window of at most ``SCALAR_WINDOW_STEPS`` steps is priced one
    ``step_time_s`` at a time (``scalar_windows``): the same end times, bit for bit, as the
    vectorized ``decode_step_times_s`` and its cumulative sum, finishers included; a split
    that does not declare it keeps the vectorized path."""
    from fleetsim.serving.kv_cache import KVCache
    from fleetsim.serving.window import SCALAR_WINDOW_STEPS, DecodeWindows
    from fleetsim.soc_pools import soc_step_model

    soc = lunar_lake()
    cost = ModelCost(get_model("Llama-3.2-3B"), 4.5)
    model = soc_step_model(soc, cost, accelerator)
    assert model.scalar_windows
    windows = DecodeWindows(KVCache(1000, 16), model, None)
    rng = np.random.default_rng(5)
    for k in (1, 2, 29, SCALAR_WINDOW_STEPS):
        n = int(rng.integers(1, 9))
        kv = int(rng.integers(0, 4000)) * n
        finishes = sorted((int(rng.integers(1, k + 1)), int(rng.integers(1, 500)))
                          for _ in range(int(rng.integers(0, n))))
        scalar_s: list[float] = []
        scalar = windows._ends_numpy(1.5, n, kv, k, finishes, scalar_s)
        windows._scalar_windows = False
        vector_s: list[float] = []
        vector = windows._ends_numpy(1.5, n, kv, k, finishes, vector_s)
        windows._scalar_windows = True
        assert len(scalar) == k
        assert scalar == vector and scalar_s == vector_s
        assert all(type(t) is float for t in scalar)
    plain = DecodeWindows(KVCache(1000, 16), SharedStepModel(
        lambda chunks, n, kv: (0.001 * n, 1e6 + kv, 1.0), "r", 1e9), None)
    assert not plain._scalar_windows
