"""Time this checkout against another one on the same benchmarks, interleaved, in one run.

Both checkouts are run by this interpreter, each with its own sources first on the path (so
each uses its own compiled engine when its ``build/native`` matches its sources; the engine
each ran is printed). Runs alternate base/this so machine noise hits both alike; the medians
and their ratio are printed. A claim such as "no more than 10% slower than before" is
checked with it:

    git worktree add --detach /tmp/base HEAD~5
    (cd /tmp/base && PYTHONPATH=src python tools/build_native.py)   # optional: its engine
    python benchmarks/compare_revisions.py /tmp/base --rounds 3 --cluster-requests 1000000
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
WALL = re.compile(r"wall time\s+([0-9.]+) s")
ENGINE = re.compile(r"^engine\s+(.+)$", re.MULTILINE)


def timed(checkout: Path, script: str, args: list[str]) -> tuple[float, str]:
    """Wall seconds a benchmark script reports for ``checkout``, and the engine it used."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    done = subprocess.run([sys.executable, str(HERE / "benchmarks" / script), *args],
                          capture_output=True, text=True, env=env, check=True)
    wall = WALL.search(done.stdout)
    engine = ENGINE.search(done.stdout)
    if wall is None:
        raise SystemExit(f"{script} printed no wall time:\n{done.stdout}{done.stderr}")
    return float(wall.group(1)), engine.group(1).strip() if engine else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the other checkout (its root folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cluster-requests", type=int, default=200_000,
                        help="requests of the cluster benchmark (0 skips it)")
    args = parser.parse_args()
    benches = [("azure replay", "azure_conv_replay.py", ["--no-compare"])]
    if args.cluster_requests:
        benches.append((f"cluster {args.cluster_requests:,} req", "cluster_scale.py",
                        ["--requests", str(args.cluster_requests)]))
    for label, script, script_args in benches:
        times: dict[str, list[float]] = {"base": [], "this": []}
        engines = {}
        for _ in range(args.rounds):
            for name, checkout in (("base", args.base.resolve()), ("this", HERE)):
                wall, engines[name] = timed(checkout, script, script_args)
                times[name].append(wall)
        base, this = statistics.median(times["base"]), statistics.median(times["this"])
        print(f"{label:24s} base {base:7.2f} s  this {this:7.2f} s  this/base {this / base:.3f}"
              f"  (runs: base {times['base']}, this {times['this']}; engines: "
              f"base {engines['base']}, this {engines['this']})")


if __name__ == "__main__":
    main()
