"""Start-up: ``fleetsim --version`` and a 100-request ``fleetsim run``, as whole processes.

Target (issue 27): ``--version`` <= 0.15 s and the 100-request run <= 0.6 s wall on the 2-core
machine. Each command runs once to warm the bytecode and table caches, then ``--runs`` times;
prints the median wall time and the median CPU time (user + system, steadier than wall on a
shared machine). ``--compare SRC`` times another checkout's ``src`` too, interleaved run by run
with this one, so that both see the same load:

    python benchmarks/startup.py [--runs 7] [--compare /path/to/other/checkout/src]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TARGETS_S = {"--version": 0.15, "run, 100 requests": 0.6}


def commands(out_dir: str) -> dict[str, list[str]]:
    return {
        "--version": ["--version"],
        "run, 100 requests": ["run", "--num-prompts", "100", "--format", "json", "--force",
                              "--out", out_dir],
    }


def timed(src: Path, argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``python -m fleetsim ARGV`` with ``src`` first on the
    path."""
    # The warm-up run writes the bytecode caches an installed package has (pip compiles at
    # install): PYTHONDONTWRITEBYTECODE would time a compile of the package in every run.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fleetsim", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per command (median)")
    parser.add_argument("--compare", type=Path, default=None, metavar="SRC",
                        help="another checkout's src folder, timed interleaved with this one")
    args = parser.parse_args()
    sources = {"this": SRC} | ({"compare": args.compare.resolve()} if args.compare else {})
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}, FLEETSIM_PURE={os.environ.get('FLEETSIM_PURE', '')!r}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in commands(str(Path(tmp) / "results")).items():
            samples: dict[str, list[tuple[float, float]]] = {label: [] for label in sources}
            for src in sources.values():
                timed(src, argv)  # warm-up: bytecode and table caches
            for _ in range(args.runs):
                for label, src in sources.items():
                    samples[label].append(timed(src, argv))
            for label, runs in samples.items():
                wall = statistics.median(w for w, _ in runs)
                cpu = statistics.median(c for _, c in runs)
                verdict = "" if label != "this" else (
                    "  (target <= {:.2f} s: {})".format(
                        TARGETS_S[name], "met" if wall <= TARGETS_S[name] else "NOT met"))
                print(f"{name:<20} {label:<8} median wall {wall:6.3f} s   median CPU "
                      f"{cpu:6.3f} s{verdict}")
    print(f"load average after: {os.getloadavg()[0]:.1f} (wall figures mean little above "
          f"{os.cpu_count()})")


if __name__ == "__main__":
    main()
