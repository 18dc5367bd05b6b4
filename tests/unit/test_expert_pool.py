"""``cluster.expert_pool``: the prefill and decode pools of an MoE model share one expert pool
from ``fleetsim run`` (ExpertPlex on the engine), and its bad input is one line, exit 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict, load_config
from fleetsim.models import get_model
from fleetsim.run import build_pools, run
from fleetsim.serving.shared_steps import SharedStepModel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "expert_pool.toml"


def _config(num_gpus=16, **pool_kw):
    return config_from_dict({
        "model": "qwen3-235b",
        "cluster": {"router": {"name": "least_loaded"},
                    "pools": [{"name": "prefill", "gpu": "H200", "tp": 8, "role": "prefill"},
                              {"name": "decode", "gpu": "H200", "tp": 8, "role": "decode"}],
                    "expert_pool": {"num_gpus": num_gpus, **pool_kw}},
        "engine": {"max_batched_tokens": 17408, "max_running": 1024},
        "workload": {"trace": None, "arrival": "poisson", "rate_per_s": 40.0,
                     "num_requests": 120,
                     "prompt_tokens": {"kind": "fixed", "value": 600},
                     "output_tokens": {"kind": "fixed", "value": 60}},
    })


def test_both_phases_step_on_one_shared_pool():
    config = _config()
    setups, infos = build_pools(config, get_model("qwen3-235b"))
    models = [s.step_model for s in setups]
    assert all(isinstance(m, SharedStepModel) for m in models)
    assert {m.resource for m in models} == {"expert_pool"}
    # one SM policy for both phases (decode's share is prefill's complement)
    assert models[0].splitter.allocator is models[1].splitter.allocator
    assert all(i["expert_pool_gpus"] == 16 for i in infos)
    # attention GPUs hold no experts: far more KV than a full model copy leaves
    plain = build_pools(config_from_dict({**config_dict_without_pool()}),
                        get_model("qwen3-235b"))[0]
    assert setups[0].num_kv_blocks > 2 * plain[0].num_kv_blocks


def config_dict_without_pool():
    return {"model": "qwen3-235b",
            "cluster": {"pools": [{"name": "prefill", "gpu": "H200", "tp": 8,
                                   "role": "prefill"},
                                  {"name": "decode", "gpu": "H200", "tp": 8,
                                   "role": "decode"}]}}


def test_a_smaller_pool_slows_decode_and_every_request_finishes():
    big = run(_config(16)).summary
    small = run(_config(8)).summary
    assert big["num_finished"] == small["num_finished"] == 120
    # 8 experts per GPU read twice the weights of 16 per decode step's layer
    assert small["tpot_s"]["mean"] > big["tpot_s"]["mean"]


def test_the_documented_example_runs(tmp_path):
    assert main(["run", str(EXAMPLE), "--out", str(tmp_path / "out"),
                 "--set", "workload.num_requests=40"]) == 0


@pytest.mark.parametrize(("setting", "needle"), [
    ("cluster.expert_pool.num_gpus=3", "cluster.expert_pool.num_gpus: got 3"),
    ("cluster.expert_pool.num_gpus=0", "num_gpus must be an integer >= 1"),
    ("cluster.expert_pool.num_gpus=2", "do not fit"),
    ("cluster.expert_pool.decode_sms=500", "decode_sms: got 500"),
    ("cluster.expert_pool.decode_sms=1", "decode_sms must be an integer >= sm_cluster"),
    ("cluster.expert_pool.gpu=nosuch", "cluster.expert_pool.gpu"),
    ("model=llama-3.1-8b", "needs an MoE model"),
])
def test_bad_expert_pool_input_is_one_line_and_exit_2(setting, needle, tmp_path, capsys):
    assert main(["run", str(EXAMPLE), "--out", str(tmp_path / "out"), "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_the_example_fast_forwards_as_it_steps():
    """ExpertPlex's decode split sets the pool's SM allocation from the batch it prices, and
    the prefill's next split reads it. A decode window priced without that side effect must
    keep one batch (no window through a finish) and price its first step through the split:
    then fast-forward equals stepping, request by request and in the binned timeline. (A
    window through a finish left the allocation at the larger batch: one request's first
    token 21 us late, one bin's busy share off in the 5th digit.)"""
    config = load_config(EXAMPLE)
    out = [run(dataclasses.replace(config, engine=dataclasses.replace(config.engine,
                                                                       fast_forward=ff)))
           for ff in (True, False)]
    fast, slow = out
    for col, values in slow.records.requests.items():
        assert np.array_equal(values, fast.records.requests[col], equal_nan=True), col
    for key in ("kv_used_fraction", "busy_fraction", "mean_running", "mean_waiting"):
        assert fast.summary["timeline"][key] == pytest.approx(
            slow.summary["timeline"][key], rel=1e-12, abs=1e-15), key
    assert fast.records.num_steps == slow.records.num_steps
