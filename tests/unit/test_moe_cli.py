"""``fleetsim moe compare`` called through ``run(args)`` as the main CLI will."""

from __future__ import annotations

import argparse
import json

import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import cli


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["moe", "compare", *argv])


SMALL = (
    "--num-gpus",
    "8",
    "--gpus-per-node",
    "4",
    "--num-experts",
    "32",
    "--microbatches",
    "3",
    "--layers",
    "2",
    "--tokens-per-gpu",
    "64",
)


def test_compare_prints_every_balancer_as_json(capsys):
    args = parse(*SMALL, "--scenario", "rl", "--json")
    assert args.handler is cli.run
    assert cli.run(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["balancer"] for r in rows] == [
        "none",
        "eplb fresh",
        "eplb prev",
        "eplb win8",
        "quota",
        "two_timescale",
    ]
    by_name = {r["balancer"]: r for r in rows}
    assert by_name["quota"]["imbalance"] < by_name["none"]["imbalance"]
    assert all(0 < r["relative_throughput"] <= 1.0 + 1e-9 for r in rows)
    assert all(r["plan_ms_per_layer"] >= 0 for r in rows)


def test_compare_table_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "imbalance.png"
    assert (
        cli.run(parse(*SMALL, "--scenario", "zipf", "--scenario", "decode", "--plot", str(plot)))
        == 0
    )
    out = capsys.readouterr().out
    assert "quota" in out
    assert "decode" in out
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (("--scenario", "bursty"), "--scenario"),
        (("--num-gpus", "0"), "--num-gpus"),
        (("--num-gpus", "12"), "--gpus-per-node"),
        (("--num-gpus", "24", "--gpus-per-node", "8"), "--num-experts"),
        (("--microbatches", "1"), "--microbatches"),
        (("--spare-slots", "-1"), "--spare-slots"),
        (("--tokens-per-gpu", "0"), "--tokens-per-gpu"),
    ],
)
def test_bad_arguments_raise_naming_the_flag(argv, where):
    with pytest.raises(FleetsimInputError) as err:
        cli.run(parse(*argv))
    assert err.value.where == where


def test_same_seed_same_results():
    import dataclasses

    from fleetsim.moe import CompareSetup, run_compare

    setup = CompareSetup(
        scenario="drift",
        num_gpus=8,
        gpus_per_node=4,
        num_experts=32,
        num_microbatches=4,
        num_layers=2,
        num_tokens_per_gpu=64,
        seed=7,
    )
    assert run_compare(setup) == run_compare(setup)
    assert run_compare(dataclasses.replace(setup, seed=8)) != run_compare(setup)
