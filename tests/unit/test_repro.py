"""``fleetsim repro``: every registered reproduction runs quick, in the shared schema, and
writes its files; bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from fleetsim.cli import main
from fleetsim.repro import REPRODUCTIONS

DOCUMENT_KEYS = {"name", "paper", "claim", "setup", "system", "baselines", "baseline",
                 "metric", "headline_metric", "headline", "ratio_definition", "paper_ratio",
                 "ratio", "loads", "results", "quick", "notes", "wall_s", "overrides",
                 "paper_setting"}


def test_list_names_every_reproduction(capsys):
    assert main(["repro", "list"]) == 0
    out = capsys.readouterr().out
    for key, repro in REPRODUCTIONS.items():
        assert key in out and repro.paper.id in out
    assert main(["repro", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {item["name"] for item in listing} == set(REPRODUCTIONS)


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_every_reproduction_runs_quick_in_the_shared_schema(name, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["repro", name, "--quick", "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    repro = REPRODUCTIONS[name]
    assert set(doc) == DOCUMENT_KEYS
    assert doc["name"] == name and doc["quick"] is True
    assert doc["metric"]["direction"] in ("lower", "higher")
    assert doc["paper_ratio"] == repro.paper_ratio >= 1
    assert set(doc["results"]) == {repro.system, *repro.baselines}
    for by_load in doc["results"].values():
        assert len(by_load) == len(repro.loads.quick_values)
    assert doc["ratio"] is None or doc["ratio"] > 0
    assert json.loads((out / "repro.json").read_text())["results"] == doc["results"]
    for policy in doc["results"]:
        runs = list((out / "runs" / policy).iterdir())
        assert len(runs) == len(repro.loads.quick_values)
        # requests.csv too, where the runs serve requests (not an MoE pass model's)
        assert all((r / "summary.json").exists() and (r / "config.json").exists()
                   for r in runs)
    assert (out / "figure.png").stat().st_size > 10_000


def test_overrides_reach_every_run(tmp_path, capsys):
    # areal-tik: the quickest reproduction whose configs go through repro/frame.py's
    # overrides (about 1.5 s; FastServe's, used before, takes 8)
    main(["repro", "areal-tik", "--quick", "--json", "--out", str(tmp_path / "a")])
    first = json.loads(capsys.readouterr().out)["results"]
    main(["repro", "areal-tik", "--quick", "--json", "--out", str(tmp_path / "b"),
          "--set", "seed=7"])
    other = json.loads(capsys.readouterr().out)["results"]
    assert first != other
    configs = sorted((tmp_path / "b" / "runs").glob("*/*/config.json"))
    assert len(configs) == len(first) * len(REPRODUCTIONS["areal-tik"].loads.quick_values)
    assert all(json.loads(c.read_text())["seed"] == 7 for c in configs)


@pytest.mark.parametrize(("argv", "needle"), [
    (["repro", "nosuchpaper"], "known reproductions: agent-xpu, areal-tik, autellix"),
    (["repro", "fastserve", "--quick", "--set", "seed"], "dotted.key=value"),
    (["run", "--set", "policy.batching.name=fastserve",
      "--set", "policy.batching.args.base_quantum_s=0"], "base_quantum_s must be > 0"),
    (["run", "--set", "engine.swap_space_gib=-1"], "swap_space_gib"),
    (["run", "--set", "engine.host_link_bw_bytes_per_s=0"], "host_link_bw_bytes_per_s"),
    (["run", "--set", "policy.batching.args.preemption_mode=swap"], "swap_space_gib"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "x")] if argv[0] == "run" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
