"""The repository stands alone (issue 24): a clone in an empty folder runs and tests with
nothing beside it. No file names a path outside the repository, the embedded data are the
bytes their README says they are, and a test that reads beside the repository fails."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Built by parts so that this file does not name them itself.
SIBLING = re.compile("|".join((re.escape("../" + "shared"), re.escape("/work/" + "shared"),
                                r'"\.\."\s*/\s*"' + "shared" + '"')))
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".sh", ".json", ".csv", ".html",
                 ".yml", ".yaml", ""}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # a copy without .git (.ci/run's)
        skip = {".venv", "build", "results", ".git", ".pytest_cache", ".hypothesis"}
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)]
    return [ROOT / n for n in names if Path(n).suffix in TEXT_SUFFIXES]


def test_no_file_names_a_folder_beside_the_repository():
    offenders = []
    for path in _tracked_files():
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SIBLING.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not offenders, ("these name a folder a user's clone does not have; cite the public "
                           "source instead:\n" + "\n".join(offenders[:20]))


def _stated_checksums(names: list[str]) -> dict[str, str]:
    """file -> the SHA-256 data/README.md gives for the embedded copy: the one right after
    the file's name ("`name` SHA-256 `...`"), else the last one of the section whose heading
    names the file (earlier ones there are the original file's)."""
    readme = resources.files("fleetsim").joinpath("data", "README.md").read_text()
    stated = {}
    for name in names:
        named = re.search(rf"`{re.escape(name)}`\s+SHA-256\s+`([0-9a-f]{{64}})`", readme)
        if named:
            stated[name] = named.group(1)
            continue
        for section in re.split(r"^## ", readme, flags=re.M)[1:]:
            heading = section.splitlines()[0]
            sums = re.findall(r"SHA-256\s+`([0-9a-f]{64})`", section)
            if f"`{name}`" in heading and sums:
                stated[name] = sums[-1]
    return stated


def test_every_embedded_data_file_is_the_bytes_its_readme_states():
    data = resources.files("fleetsim").joinpath("data")
    files = sorted(p.name for p in data.iterdir()
                   if p.name.endswith((".csv", ".jsonl")))
    stated = _stated_checksums(files)
    assert sorted(stated) == files, "each embedded data file needs a section with its SHA-256"
    for name in files:
        digest = hashlib.sha256(data.joinpath(name).read_bytes()).hexdigest()
        assert digest == stated[name], f"{name} differs from the copy data/README.md describes"


def test_reading_beside_the_repository_fails_the_test(touched_outside):
    """The audit hook in conftest.py records a read beside the repository (the guard that
    makes every test fail on such a path), and not one inside it or in the temp folder."""
    beside = ROOT.parent / ("sibling-of-" + ROOT.name) / "trace.jsonl"
    with pytest.raises(OSError):
        open(beside)  # noqa: SIM115 (the open itself is what is audited)
    with open(ROOT / "pyproject.toml") as inside:
        inside.read(1)
    os.listdir(ROOT)
    if ROOT.parent == Path(ROOT.anchor):
        pytest.skip("the repository sits at the file system's root: nothing is beside it")
    assert touched_outside() == [str(beside)]
