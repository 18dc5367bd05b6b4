"""Synthetic load scenarios and the SGLang / vLLM importers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import LoadSpec, load_sglang_dump, load_vllm_window, make_loads
from fleetsim.moe.loads import SCENARIOS, popularity

SPEC = LoadSpec(num_microbatches=5, num_layers=3, num_experts=32, num_tokens=512, top_k=4)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenarios_route_every_token_top_k_times(scenario):
    loads = make_loads(scenario, SPEC, seed=1)
    assert loads.shape == (5, 3, 32)
    assert (loads.sum(-1) == 512 * 4).all()
    assert (make_loads(scenario, SPEC, seed=1) == loads).all()


def test_popularity_is_capped_at_one_over_top_k():
    p = popularity(np.array([[10.0, 0.0, 0.0, 0.0, 0.0, 0.0]]), top_k=2)
    assert np.isclose(p.sum(), 1.0)
    assert p.max() <= 0.5 + 1e-12


def test_rl_hot_experts_move_between_microbatches():
    spec = LoadSpec(num_microbatches=6, num_layers=1, num_experts=64, num_tokens=4096, top_k=8)
    loads = make_loads("rl", spec, seed=0)
    hottest = {int(np.argmax(m[0])) for m in loads}
    assert len(hottest) > 1


def test_bad_scenario_and_spec():
    with pytest.raises(FleetsimInputError) as err:
        make_loads("bursty", SPEC, seed=0)
    assert err.value.where == "scenario"
    with pytest.raises(FleetsimInputError) as err:
        LoadSpec(top_k=300, num_experts=256)
    assert err.value.where == "top_k"


def test_sglang_stat_dump_from_dict_json_npz_npy(tmp_path):
    count = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert (load_sglang_dump({"logical_count": count, "rank": 0}) == count).all()
    (tmp_path / "d.json").write_text(json.dumps({"logical_count": count.tolist()}))
    assert (load_sglang_dump(tmp_path / "d.json") == count).all()
    np.savez(tmp_path / "d.npz", logical_count=count)
    assert (load_sglang_dump(str(tmp_path / "d.npz")) == count).all()
    np.save(tmp_path / "d.npy", count[0])
    assert load_sglang_dump(tmp_path / "d.npy").shape == (1, 3, 4)


def test_sglang_per_token_records_are_mapped_to_logical_experts():
    phy2log = np.array([[0, 1, 0], [1, 0, 1]])  # 2 layers, 3 physical slots, 2 experts
    records = [{"global_physical_count": [[1, 2, 3], [4, 5, 6]]}]
    loads = load_sglang_dump({"records": records, "last_physical_to_logical_map": phy2log})
    assert loads.tolist() == [[[4, 2], [5, 10]]]


def test_vllm_window_sums_replicas():
    window = np.ones((2, 1, 4))
    phy2log = np.array([[0, 0, 1, 2]])
    loads = load_vllm_window({"expert_load_window": window, "physical_to_logical_map": phy2log})
    assert loads.tolist() == [[[2, 1, 1]], [[2, 1, 1]]]
    assert load_vllm_window(window, phy2log, num_experts=4).shape == (2, 1, 4)


@pytest.mark.parametrize(
    ("call", "where"),
    [
        (
            lambda: load_sglang_dump({"logical_count": [[1.0, float("nan")]]}),
            "sglang_dump.logical_count",
        ),
        (lambda: load_sglang_dump({"logical_count": [[1.0, -1.0]]}), "sglang_dump.logical_count"),
        (lambda: load_sglang_dump({"other": 1}), "sglang_dump"),
        (lambda: load_sglang_dump("/no/such/file.json"), "sglang_dump"),
        (lambda: load_vllm_window(np.ones((2, 1, 4))), "physical_to_logical_map"),
        (
            lambda: load_vllm_window(np.ones((2, 1, 4)), np.zeros((1, 3))),
            "vllm_window.physical_to_logical_map",
        ),
        (
            lambda: load_vllm_window(np.ones((1, 4)), np.zeros((1, 4))),
            "vllm_window.expert_load_window",
        ),
    ],
)
def test_importers_name_the_bad_argument(call, where):
    with pytest.raises(FleetsimInputError) as err:
        call()
    assert err.value.where == where


def test_pt_without_torch_says_how_to_convert(tmp_path):
    path = tmp_path / "dump.pt"
    path.write_bytes(b"not really a torch file")
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(FleetsimInputError) as err:
            load_sglang_dump(path)
        assert "torch" in err.value.fix


def test_rl_switch_holds_the_hot_set_for_a_phase_then_switches():
    from fleetsim.moe.loads import RL_SWITCH_EVERY, make_popularity

    spec = LoadSpec(num_microbatches=2 * RL_SWITCH_EVERY, num_layers=2, num_experts=64)
    p = make_popularity("rl_switch", spec, np.random.default_rng(0))
    assert (p[: RL_SWITCH_EVERY] == p[0]).all()
    assert (p[RL_SWITCH_EVERY:] == p[RL_SWITCH_EVERY]).all()
    assert not (p[RL_SWITCH_EVERY] == p[0]).all()
