"""Run DeepSeek's EPLB (``eplb.py``, github.com/deepseek-ai/EPLB, MIT) on fixed inputs and write
its outputs as a test fixture for ``fleetsim.moe.rebalance_experts``.

Only inputs and outputs are written, never EPLB's code. Needs torch (any CPU build) and the
path of ``eplb.py``, kept outside this repository:

    git --git-dir=<mirror of deepseek-ai/EPLB> show HEAD:eplb.py > /tmp/eplb/eplb.py
    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchenv/bin/python tools/eplb_fixture.py /tmp/eplb/eplb.py

Each case is run twice: as published, and with its ``sort(descending=True)`` made stable.
torch's default CPU sort is not stable for rows longer than 16 items, so on large layers with
equal loads the published output depends on how torch orders ties; the stable run is the
output with a defined tie order (the one fleetsim follows). ``tie_order_defined`` records
whether both runs agree.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "eplb_reference.json.gz"


def _cases() -> list[dict[str, object]]:
    """(name, weight, num_replicas, num_groups, num_nodes, num_gpus): ties, layers longer than
    16 items, hierarchical and global policies, several layouts. Seeded, so reruns agree."""
    rng = np.random.default_rng(20261201)
    readme = [
        [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
        [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
    ]

    def multinomial(layers: int, experts: int, tokens: int) -> list[list[int]]:
        p = rng.dirichlet(np.full(experts, 0.5), size=layers)
        return [rng.multinomial(tokens, row).tolist() for row in p]

    def small_ints(layers: int, experts: int, high: int) -> list[list[int]]:
        return rng.integers(0, high + 1, size=(layers, experts)).tolist()

    cases = [
        ("readme", readme, 16, 4, 2, 8),
        ("small_ties_hier", small_ints(3, 12, 3), 16, 4, 2, 4),
        ("small_ties_global", small_ints(3, 12, 3), 16, 3, 2, 4),
        ("one_slot_per_gpu", small_ints(2, 16, 20), 16, 4, 2, 16),
        ("no_redundancy", small_ints(2, 32, 50), 32, 4, 2, 8),
        # DeepSeek-V3 shapes: 256 experts in 8 groups; 40 slots per node, 320 items globally.
        ("v3_hier_64gpu", multinomial(4, 256, 64 * 4096 * 8), 320, 8, 8, 64),
        ("v3_global_64gpu", multinomial(4, 256, 64 * 4096 * 8), 320, 1, 8, 64),
        ("v3_prefill_32gpu", multinomial(4, 256, 32 * 4096 * 8), 288, 8, 4, 32),
        ("v3_decode_few_tokens", multinomial(4, 256, 64 * 16 * 8), 320, 8, 8, 64),
        # Many equal loads on large layers: where the tie order matters.
        ("ties_hier_64e", small_ints(4, 64, 3), 80, 4, 2, 16),
        ("ties_global_64e", small_ints(4, 64, 3), 96, 1, 1, 16),
        ("all_equal_128e", [[7] * 128] * 2, 160, 8, 4, 32),
        ("zeros_and_ones_64e", small_ints(2, 64, 1), 80, 8, 2, 8),
        # Large layers, distinct loads and no replicas: nothing ties, so the order is defined.
        ("distinct_64e", [rng.permutation(64).tolist() for _ in range(2)], 64, 4, 2, 16),
        ("distinct_float_64e", (rng.permutation(64) * 1.37 + 0.25)[None].tolist(), 64, 1, 1, 8),
        # Non-integer loads: float32 sums and quotients must agree, not only comparisons.
        ("float_hier_64e", rng.gamma(0.5, 100.0, size=(3, 64)).round(3).tolist(), 96, 8, 4, 16),
        ("float_global_64e", rng.gamma(0.5, 100.0, size=(3, 64)).round(3).tolist(), 96, 3, 2, 16),
    ]
    keys = ("name", "weight", "num_replicas", "num_groups", "num_nodes", "num_gpus")
    return [dict(zip(keys, case, strict=True)) for case in cases]


def _load_eplb(path: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("deepseek_eplb", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _stable_sort(torch):  # type: ignore[no-untyped-def]
    """Make ``Tensor.sort`` stable while EPLB runs (its one sort: ``sort(-1, descending=True)``)."""
    original = torch.Tensor.sort

    def stable(self, dim=-1, descending=False):  # type: ignore[no-untyped-def]
        return original(self, dim=dim, descending=descending, stable=True)

    torch.Tensor.sort = stable
    try:
        yield
    finally:
        torch.Tensor.sort = original


def _run(eplb, torch, case: dict[str, object]) -> dict[str, list[object]]:  # type: ignore[no-untyped-def]
    weight = torch.tensor(case["weight"], dtype=torch.float64)
    phy2log, log2phy, logcnt = eplb.rebalance_experts(
        weight, case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"]
    )
    return {"phy2log": phy2log.tolist(), "log2phy": log2phy.tolist(), "logcnt": logcnt.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eplb_py", help="path of DeepSeek's eplb.py (outside this repository)")
    parser.add_argument("--out", default=str(OUT), help=f"fixture to write (default {OUT})")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    eplb = _load_eplb(args.eplb_py)
    results = []
    for case in _cases():
        published = _run(eplb, torch, case)
        with _stable_sort(torch):
            stable = _run(eplb, torch, case)
        defined = published == stable
        results.append(
            {
                **case,
                "published": published,
                "tie_order_defined": defined,
                # The stable run only when it differs, to keep the fixture small.
                "stable_sort": None if defined else stable,
            }
        )
        print(f"{case['name']:24} tie order defined: {defined}")
    fixture = {
        "source": "github.com/deepseek-ai/EPLB eplb.py (MIT), run by tools/eplb_fixture.py",
        "eplb_py_sha256": hashlib.sha256(Path(args.eplb_py).read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "cases": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: rerunning with the same torch gives the same bytes.
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(json.dumps(fixture, separators=(",", ":")).encode())
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
