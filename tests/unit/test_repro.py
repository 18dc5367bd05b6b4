"""``fleetsim repro``: every registered reproduction runs quick, in the shared schema, in
the direction of its recorded full run, and writes its files; ``repro all`` gathers one
scoreboard; the docs' table is the recorded one; bad input is one line and exit 2."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest

import fleetsim.repro
from fleetsim.cli import main
from fleetsim.repro import REPRODUCTIONS
from fleetsim.repro.cli import EntryResult, _write_board
from fleetsim.repro.frame import Comparison, attribution_note, is_bound, to_document
from fleetsim.repro.scoreboard import RERECORD, docs_table, scoreboard, table_rows, with_table

DOCUMENT_KEYS = {"name", "paper", "claim", "setup", "system", "baselines", "baseline",
                 "metric", "headline_metric", "headline", "ratio_definition", "paper_ratio",
                 "paper_ratio_source", "paper_best", "ratio", "ratio_is_bound", "attribution",
                 "loads", "results", "quick", "notes", "wall_s", "overrides",
                 "paper_setting"}
ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "scoreboard.json"
DOCS = ROOT / "docs" / "reproductions.md"


def _recorded() -> dict[str, dict]:
    return {doc["name"]: doc for doc in json.loads(RECORD.read_text())["entries"]}


def test_list_names_every_reproduction(capsys):
    assert main(["repro", "list"]) == 0
    out = capsys.readouterr().out
    for key, repro in REPRODUCTIONS.items():
        assert key in out and repro.paper.id in out
    assert main(["repro", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {item["name"] for item in listing} == set(REPRODUCTIONS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_every_reproduction_runs_quick_in_the_shared_schema(name, tmp_path, quick_run):
    """``repro NAME --quick`` and, from the same runs, what ``repro all`` does with the entry
    after its worker ran it (the README's ``repro all --quick`` runs only two entries:
    tests/unit/test_readme.py). The command runs once per test process (``quick_run``):
    an entry's own tests read the same runs."""
    run = quick_run(name)
    doc, out = run.document, run.out
    repro = REPRODUCTIONS[name]
    assert set(doc) == DOCUMENT_KEYS
    assert doc["name"] == name and doc["quick"] is True
    assert doc["metric"]["direction"] in ("lower", "higher")
    assert doc["paper_ratio"] == repro.paper_ratio
    assert doc["paper_ratio"] is None or doc["paper_ratio"] >= 1
    assert doc["paper_best"] is None or doc["paper_best"] >= 1
    assert doc["paper_ratio_source"]
    assert set(doc["attribution"]) <= set(doc["results"]) - {repro.system, repro.baseline}
    assert any(n.startswith("attribution") for n in doc["notes"])
    assert isinstance(doc["ratio_is_bound"], bool)
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
    _check_as_repro_all_does(name, doc, run.comparison, tmp_path / "board")
    # The quick slice measures something: its ratio is on the same side of 1 as the full
    # run's recorded in docs/scoreboard.json.
    full = _recorded()[name]["ratio"]
    assert full is not None and doc["ratio"] is not None, (
        f"{name}: no ratio (quick {doc['ratio']}, recorded full {full})")
    assert (doc["ratio"] - 1) * (full - 1) > 0, (
        f"{name}: quick ratio {doc['ratio']:.3f} is not on the side of 1 of the recorded full "
        f"run's {full:.3f}; if the full run changed, {RERECORD}")


def _check_as_repro_all_does(name: str, doc: dict, comparison: Comparison, out: Path) -> None:
    """``repro all``'s part for one entry (``run_entry`` then ``cmd_all``): the document and
    the comparison come back from a worker process (pickled), and the board, its page and
    the entry's figure are written from what came back."""
    sent = EntryResult(name, to_document(REPRODUCTIONS[name], comparison, quick=True),
                       comparison)
    back = pickle.loads(pickle.dumps(sent))
    assert back.comparison == comparison
    assert json.loads(json.dumps({**back.document, "wall_s": doc["wall_s"]})) == doc
    _write_board(out, scoreboard([back.document]), [back])
    board = json.loads((out / "scoreboard.json").read_text())
    assert board == json.loads(json.dumps(scoreboard([back.document])))
    assert (out / "figures" / f"{name}.png").stat().st_size > 10_000
    assert f"figures/{name}.png" in (out / "scoreboard.html").read_text()


def test_the_record_is_a_full_run_of_every_entry_as_registered():
    """docs/scoreboard.json holds one full-run document per registered entry, in today's
    schema, with today's published values (edit an entry's record: re-record)."""
    recorded = _recorded()
    assert set(recorded) == set(REPRODUCTIONS), RERECORD
    for name, doc in recorded.items():
        repro = REPRODUCTIONS[name]
        assert set(doc) == DOCUMENT_KEYS, f"{name}: the document's keys changed; {RERECORD}"
        assert doc["quick"] is False
        assert (doc["paper_ratio"], doc["paper_ratio_source"], doc["paper_best"]) == (
            repro.paper_ratio, repro.paper_ratio_source, repro.paper_best), (
            f"{name}: the published values changed since the record; {RERECORD}")
        assert set(doc["results"]) == {repro.system, *repro.baselines}, RERECORD


def test_the_docs_table_is_the_recorded_scoreboard():
    board = json.loads(RECORD.read_text())
    assert docs_table(DOCS.read_text()) == table_rows(board), (
        f"docs/reproductions.md's table differs from docs/scoreboard.json: {RERECORD}")


def test_the_table_is_regenerated_in_place():
    board = {"entries": [{"name": "x", "system": "a", "baseline": "b", "paper_ratio": None,
                          "paper_best": 2.0, "ratio": 1.5, "ratio_is_bound": True,
                          "attribution": {"a-minus": 1.2}}]}
    docs = DOCS.read_text()
    start = docs.index("<!-- scoreboard table")
    text = with_table("head\n" + docs[start:docs.index("\n", docs.index("<!-- end of", start))]
                      + "\ntail", board)
    assert docs_table(text) == table_rows(board)
    assert "| `x` (a vs b) | not recoverable | 2.00x | 1.50x (a bound) | a-minus 1.20x |" in text
    assert text.startswith("head") and text.endswith("tail")


def test_attribution_note_gives_each_mechanisms_share_on_a_log_scale():
    """System 4x, the ablation 2x against the same baseline: the removed mechanism carries
    half the gain (log 2 of log 4); no ablation run: the note says so."""
    repro = REPRODUCTIONS["fastserve"]
    note = attribution_note(repro, Comparison(results={}, ratio=4.0,
                                              attribution={"fcfs": 2.0}))
    assert "fcfs 2.00x (the removed mechanism carries 50%)" in note
    note = attribution_note(repro, Comparison(results={}, ratio=4.0, attribution={"fcfs": 2.0},
                                              attribution_reference=2.0))
    assert "carries 0%" in note
    assert "none measured" in attribution_note(repro, Comparison(results={}, ratio=1.5))
    assert math.isclose(1.0 - math.log(2.0) / math.log(4.0), 0.5)


def test_a_ratio_is_a_bound_when_a_crossing_is_at_the_top_load():
    assert is_bound(6.0, 3.5, 6.0)
    assert not is_bound(6.0, 3.5, 1.8)
    assert not is_bound(6.0, None, 1.8)  # no crossing at all: no ratio, not a bound


@pytest.mark.slow
def test_repro_all_runs_entries_in_worker_processes(tmp_path, capsys, monkeypatch, quick_run):
    """Two entries over a pool of two processes: one scoreboard whose documents are the
    entries' own (the same results as each run alone: ``repro NAME --quick``, once per test
    process), the page, the figures, the record."""
    names = ("agent-xpu", "areal-tik")
    monkeypatch.setattr(fleetsim.repro, "REPRODUCTIONS", {n: REPRODUCTIONS[n] for n in names})
    out, record = tmp_path / "board", tmp_path / "rec.json"
    assert main(["repro", "all", "--quick", "--json", "--workers", "2", "--out", str(out)]) == 0
    board = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in board["entries"]] == list(names)
    for doc in board["entries"]:
        alone = quick_run(doc["name"]).document
        assert alone["results"] == doc["results"] and alone["ratio"] == doc["ratio"]
        assert (out / "figures" / f"{doc['name']}.png").stat().st_size > 10_000
    assert json.loads((out / "scoreboard.json").read_text()) == board
    page = (out / "scoreboard.html").read_text()
    assert all(f"figures/{n}.png" in page for n in names)
    assert not record.exists()
    assert main(["repro", "all", "--workers", "1", "--out", str(out), "--set",
                 "no_such_key=1", "--record", str(record)]) == 1  # every entry fails
    assert not record.exists()  # a failed run records nothing


@pytest.mark.slow
def test_overrides_reach_every_run(tmp_path, capsys, quick_run):
    # areal-tik: the quickest reproduction whose configs go through repro/frame.py's
    # overrides (about 1.5 s; FastServe's, used before, takes 8); without them, the run of
    # `repro areal-tik --quick` the per-entry test reads
    first = quick_run("areal-tik").document["results"]
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
    (["repro", "all", "--quick", "--record", "board.json"], "records full runs only"),
    (["repro", "all", "--workers", "0"], "--workers"),
    (["repro", "fastserve", "--quick", "--workers", "0"], "--workers"),
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


@pytest.mark.slow
@pytest.mark.wiring  # Ray: run once, on the compiled build (pyproject.toml)
def test_repro_all_on_ray_matches_the_process_pool(tmp_path, capsys, monkeypatch):
    """--ray local runs the entries as Ray tasks (the sweep's runner) with the same results."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'fleetsim[ray]')")
    # areal-tik: the quickest entry (about 1.5 s quick; relibra, used before, takes 4 to 7), run
    # twice here; what is tested is the runner, the same for every entry.
    names = ("areal-tik",)
    monkeypatch.setattr(fleetsim.repro, "REPRODUCTIONS", {n: REPRODUCTIONS[n] for n in names})
    boards = []
    for flags in (["--ray", "local", "--workers", "1"], ["--workers", "1"]):
        assert main(["repro", "all", "--quick", "--json", "--out",
                     str(tmp_path / flags[0].strip("-")), *flags]) == 0
        boards.append(json.loads(capsys.readouterr().out))
    ray_board, local_board = boards
    assert [d["results"] for d in ray_board["entries"]] == [
        d["results"] for d in local_board["entries"]]
