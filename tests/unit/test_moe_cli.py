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
        "eplb",
        "eplb_hier",
        "eplb_stale k=1",
        "eplb_stale k=4",
        "eplb_stale k=16",
        "eplb_hier_stale k=1",
        "quota",
        "quota_stale k=1",
        "two_timescale",
    ]
    by_name = {r["balancer"]: r for r in rows}
    assert by_name["quota"]["imbalance"] < by_name["none"]["imbalance"]
    assert all(0 < r["relative_throughput"] <= 1.0 + 1e-9 for r in rows)
    assert all(r["plan_ms_per_layer"] >= 0 for r in rows)
    # Every row says what it plans from; exact-load plans cannot be prefetched.
    assert by_name["eplb"]["sees"] == "exact current load (oracle)"
    assert by_name["quota"]["sees"] == "exact current load"
    assert by_name["eplb_stale k=4"]["sees"] == "mean of last 4 steps"
    assert by_name["quota_stale k=1"]["sees"] == "previous step"
    assert {by_name[n]["prefetchable"] for n in ("eplb", "quota")} == {"no"}
    assert {by_name[n]["prefetchable"] for n in ("eplb_stale k=1", "quota_stale k=1")} == {"yes"}
    for r in rows:
        total = r["intra_bytes_per_layer"] + r["inter_bytes_per_layer"]
        assert r["moved_bytes_per_layer"] == pytest.approx(total)
    assert by_name["eplb"]["inter_bytes_per_layer"] > 0
    assert by_name["two_timescale"]["inter_bytes_per_layer"] == 0  # 3 microbatches, 1 batch


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


def test_hierarchical_baseline_with_one_group_per_node_says_so():
    from fleetsim.moe import CompareSetup, run_compare

    setup = CompareSetup(
        scenario="zipf",
        num_gpus=8,
        gpus_per_node=1,  # 8 nodes, 8 groups: each node pinned to one group
        num_experts=32,
        num_microbatches=2,
        num_layers=1,
        num_tokens_per_gpu=64,
    )
    balancers = (("hier", "eplb", {"num_groups": 8}), ("global", "eplb", {}))
    hier, flat = run_compare(setup, balancers=balancers)
    assert "cannot balance across nodes" in hier.note
    assert flat.note == ""


def test_compare_figure_states_its_setup_and_draws_the_tables_numbers():
    pytest.importorskip("matplotlib")
    from fleetsim.moe.compare import CompareSetup, run_compare
    from fleetsim.moe.compare_figure import algorithm, compare_figure

    setups = [CompareSetup(scenario=s, num_gpus=8, gpus_per_node=4, num_experts=32,
                           num_microbatches=3, num_layers=2, num_tokens_per_gpu=64)
              for s in ("zipf", "decode")]
    rows = [r for s in setups for r in run_compare(s)]
    fig = compare_figure(rows, setups)
    title = fig.get_suptitle()
    for text in ("32 experts, top-8", "EP over 8 GPUs (2 nodes of 4)", "1 spare slot(s)/GPU",
                 "NVLink 450 GB/s", "3 microbatches", "× 2 layers", "seed 0"):
        assert text in title
    axes = fig.get_axes()
    assert len(axes) == 4  # per scenario: imbalance over time, throughput bars
    for ax, scenario in ((axes[1], "zipf"), (axes[3], "decode")):
        mine = [r for r in rows if r.scenario == scenario]
        assert [round(p.get_width(), 9) for p in ax.patches] == [
            round(100 * r.relative_throughput, 9) for r in mine]
        assert [t.get_text() for t in ax.get_yticklabels()] == [r.balancer for r in mine]
    lines = {line.get_label(): line for line in axes[0].get_lines()}
    assert list(lines["eplb_stale k=4"].get_ydata()) == list(
        next(r for r in rows if r.balancer == "eplb_stale k=4").imbalance_by_microbatch)
    assert lines["eplb_stale k=4"].get_color() == lines["eplb"].get_color()
    assert lines["eplb_stale k=4"].get_linestyle() == "--"
    assert lines["eplb"].get_linestyle() == "-"
    assert algorithm("eplb_hier_stale k=1") == "eplb_hier"


def test_all_is_the_stress_scenarios_and_a_measured_preset_runs_by_name(capsys):
    from fleetsim.moe.compare import STRESS_SCENARIOS
    assert cli._scenarios(None) == list(STRESS_SCENARIOS) == cli._scenarios(["all"])
    assert "ou" not in STRESS_SCENARIOS  # uncalibrated (uniform) on its own
    args = parse(*SMALL, "--tokens-per-gpu", "512", "--scenario", "ultraep-qwen3-235b-train",
                 "--json")
    assert cli.run(args) == 0
    rows = {r["balancer"]: r for r in json.loads(capsys.readouterr().out)}
    assert {r["scenario"] for r in rows.values()} == {"ultraep-qwen3-235b-train"}
    # the calibrated skew is there for the static placement and the exact-load planner fixes it
    assert rows["none"]["imbalance"] > 1.3 > rows["quota"]["imbalance"]
