"""The README's examples run as written: every `.venv/bin/fleetsim` command of its "Using it"
block, from a copy of the repository's layout (``examples/`` and ``.venv``, nothing beside it),
and its TOML example is ``examples/exp.toml`` verbatim and sane.

``make run`` and ``make test`` lines are not executed here (``make test`` runs this test), and
``repro all --quick`` runs over two entries (see ``REPRO_ALL_ENTRIES``)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _block(heading: str, lang: str) -> str:
    section = README[README.index(heading):]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"no {lang} block under {heading}"
    return m.group(1)


COMMANDS = [line for line in _block("## Using it", "sh").splitlines()
            if line.startswith(".venv/bin/fleetsim")]
# `report results/sweep` reads what the sweep wrote, `calibrate results/bench.json` what the
# benchmark-style run wrote: run each pair as one case.
CASES = []
for cmd in COMMANDS:
    if " report results/sweep" in cmd or " calibrate results/bench.json" in cmd:
        CASES[-1] = CASES[-1] + [cmd]
    else:
        CASES.append([cmd])


# `repro all --quick` runs every entry's quick slice, as test_repro.py's per-entry test does
# (with what `repro all` then does with each entry's result): here it runs as written over two
# quick entries, so what this tests is the command and the all-runner's plumbing (its parser,
# the pool of worker processes, the board, the page), not every simulation a second time.
# The registry is cut in every process of the run by a sitecustomize module on PYTHONPATH
# (for this one command it stands in for any other sitecustomize).
REPRO_ALL_ENTRIES = ("agent-xpu", "areal-tik")
REPRO_ALL_SUBSET = f"""import fleetsim.repro
fleetsim.repro.REPRODUCTIONS = {{n: fleetsim.repro.REPRODUCTIONS[n] for n in {REPRO_ALL_ENTRIES}}}
"""


# `repro NAME --quick` is also test_repro.py's per-entry test of NAME: the comparison the command
# computed is pickled beside its results (a sitecustomize that only watches), and the test
# process's quick runs (conftest.QuickRuns) take the run over, so the per-entry test that
# follows in this process reads it instead of running FastServe's slice a second time.
# (The command's own process takes the path out of the environment: its helper processes
# neither see it nor import anything more.)
KEEP_COMPARISON = """import os
_path = os.environ.pop("FLEETSIM_TEST_COMPARISON", None)
if _path:
    import pickle
    import fleetsim.repro.frame as frame
    _run_reproduction = frame.run_reproduction
    def run_reproduction(*args, **kwargs):
        comparison, ctx = _run_reproduction(*args, **kwargs)
        with open(_path, "wb") as f:
            pickle.dump(comparison, f)
        return comparison, ctx
    frame.run_reproduction = run_reproduction
"""


def _quick_repro(cmd: str) -> str | None:
    """NAME of a `repro NAME --quick` command (None for any other, `repro all` included)."""
    m = re.search(r" repro (\S+) --quick", cmd)
    return m.group(1) if m and m.group(1) != "all" else None


def _env(cmd: str, tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "80"}
    shims = {"repro_all_subset": REPRO_ALL_SUBSET if " repro all " in cmd else None,
             "keep_comparison": KEEP_COMPARISON if _quick_repro(cmd) else None}
    for folder, text in shims.items():
        if text is not None:
            shim = tmp_path / folder
            shim.mkdir(exist_ok=True)
            (shim / "sitecustomize.py").write_text(text)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(shim), env.get("PYTHONPATH")) if p)
    if _quick_repro(cmd):
        env["FLEETSIM_TEST_COMPARISON"] = str(tmp_path / "comparison.pickle")
    return env


@pytest.fixture
def sandbox(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("examples", ".venv"):
        (repo / name).symlink_to(ROOT / name)
    return repo


def test_the_readme_lists_the_commands():
    assert len(COMMANDS) >= 14
    assert any("examples/exp.toml" in c for c in COMMANDS)
    assert any("examples/sweep.toml" in c for c in COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("commands", CASES, ids=[c[0].split("#")[0][18:60] for c in CASES])
def test_readme_command_runs_as_written(sandbox, commands, tmp_path, quick_run):
    for cmd in commands:
        proc = subprocess.run(["bash", "-c", cmd], cwd=sandbox, capture_output=True,
                              text=True, timeout=300, env=_env(cmd, tmp_path))
        assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr
        if "--json" in cmd:
            json.loads(proc.stdout)
        if name := _quick_repro(cmd):  # the default folder, as `repro NAME` names it
            out = sandbox / "results" / "repro" / name
            quick_run.add(name, json.loads((out / "repro.json").read_text()), out,
                          pickle.loads((tmp_path / "comparison.pickle").read_bytes()))
        if " repro all " in cmd:  # one board of the entries run (the default folder)
            board = json.loads((sandbox / "results/repro/all/scoreboard.json").read_text())
            assert [d["name"] for d in board["entries"]] == list(REPRO_ALL_ENTRIES)
            assert all(f"figures/{n}.png" in (sandbox / "results/repro/all/scoreboard.html"
                                              ).read_text() for n in REPRO_ALL_ENTRIES)
    if "--out results/" in commands[0] and " sweep " not in commands[0]:
        out = sandbox / commands[0].split("--out ")[1].split()[0]
        assert (out / "summary.json").exists()


def test_readme_toml_is_examples_exp_toml():
    assert _block("A config file sets any field", "toml") == (ROOT / "examples" / "exp.toml"
                                                              ).read_text()


def test_the_example_config_is_sane():
    """Saved verbatim and run, the README's example is not overloaded: no warning, every
    request meets the SLO at the trace's own rate."""
    from fleetsim.config import load_config
    from fleetsim.run import run

    data = tomllib.loads(_block("A config file sets any field", "toml"))
    assert data["workload"]["trace"].startswith("embedded:")
    s = run(load_config(ROOT / "examples" / "exp.toml")).summary
    assert "warning" not in s["overload"]
    assert s["slo"]["attainment"] > 0.99 and s["num_preemptions"] == 0
