"""Digest of the cluster benchmark's results, to check a speed-up changed nothing.

Runs ``cluster_scale.py``'s configuration and prints one SHA-256 per recorded column (every
finished request's row, the step timeline) and of the summary (less the engine line), so two
checkouts or two builds compare with ``diff``:

    PYTHONPATH=/other/checkout/src python benchmarks/cluster_scale_digest.py --requests 100000 > a
    PYTHONPATH=src python benchmarks/cluster_scale_digest.py --requests 100000 > b
    diff a b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_scale import scale_config  # noqa: E402

from fleetsim.run import run  # noqa: E402


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--rate-per-replica", type=float, default=2.0)
    args = parser.parse_args()
    result = run(scale_config(args.requests, args.replicas, args.rate_per_replica))
    records = result.records
    for name, column in sorted(records.requests.items()):
        print(f"requests.{name:24s} {column.dtype} {len(column):9d} {digest(column)}")
    for name, column in sorted(records.timeline.items()):
        print(f"timeline.{name:24s} {column.dtype} {len(column):9d} {digest(column)}")
    summary = {k: v for k, v in result.summary.items() if k != "engine_build"}
    text = json.dumps(summary, sort_keys=True, default=str)
    print(f"summary                           {hashlib.sha256(text.encode()).hexdigest()[:16]}")
    print(f"num_steps {records.num_steps}  busy_s {sum(records.busy_s_by_replica.values())!r}")


if __name__ == "__main__":
    main()
