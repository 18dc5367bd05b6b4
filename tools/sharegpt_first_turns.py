"""Build ``src/fleetsim/data/sharegpt_first_turn_opt.csv``: length statistics of ShareGPT's
first turns as FastServe's client samples them.

Input: ``datasets/sharegpt_opt_text_completion_length.pkl`` of the vLLM paper's artifact
(``sosp-ae-39/sosp-ae-astra`` at commit 3180d2f; Kwon et al., "Efficient Memory Management for
Large Language Model Serving with PagedAttention", SOSP'23, arXiv:2309.06180): one (prompt,
output) pair of OPT-tokenizer token counts per ShareGPT conversation (March 2023), its first
user message and ChatGPT's first answer; 84,226 pairs, no text. That repository has no
licence, so fleetsim embeds statistics of it, never the pairs themselves:

1. FastServe's client filter (``LLMServe/FastServe`` at 187a274,
   ``benchmarks/benchmark-serving/benchmark-serving.py``, ``sample_requests``): a pair is
   dropped when prompt < 4 *and* output < 4 tokens, or prompt > 1,024, or prompt + output
   > 2,048 (76,819 pairs are left);
2. a 2-D histogram over geometric bins (edges ``floor(1.08**k)``, each bin about 8% wide,
   the same for prompts and outputs): per non-empty bin the number of pairs and their mean
   prompt and mean output (rounded). Resampled with those counts (``PairedLengthsConfig``'s
   ``count_column``), the means match the pairs' to 0.02 tokens and the 10th-99th
   percentiles to within 3%.

Usage (the pickle is read with an unpickler that refuses every class: it holds only a list
of integer tuples, and nothing else may load)::

    python tools/sharegpt_first_turns.py sharegpt_opt_text_completion_length.pkl \\
        src/fleetsim/data/sharegpt_first_turn_opt.csv
"""

from __future__ import annotations

import io
import math
import pickle
import sys
from pathlib import Path

import numpy as np

BIN_RATIO = 1.08  # each bin about 8% wide: percentiles within 3% (module docstring)
MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS, MIN_TOKENS = 1024, 2048, 4  # FastServe's client


class _PlainDataOnly(pickle.Unpickler):
    """Loads lists, tuples and numbers; any class (code) in the file is refused."""

    def find_class(self, module: str, name: str) -> type:
        raise pickle.UnpicklingError(f"refused {module}.{name}: only plain data is read")


def first_turn_pairs(pkl: Path) -> np.ndarray:
    """The artifact's (prompt, output) pairs, FastServe's client filter applied."""
    pairs = np.asarray(_PlainDataOnly(io.BytesIO(pkl.read_bytes())).load(), dtype=np.int64)
    p, o = pairs[:, 0], pairs[:, 1]
    keep = ~((p < MIN_TOKENS) & (o < MIN_TOKENS)) & (p <= MAX_PROMPT_TOKENS) & (
        p + o <= MAX_TOTAL_TOKENS)
    return pairs[keep]


def geometric_edges(top: int) -> np.ndarray:
    """Bin edges ``floor(BIN_RATIO**k)`` up to ``top`` (one token wide at the bottom)."""
    k_max = math.ceil(math.log(top + 1, BIN_RATIO))
    return np.unique([math.floor(BIN_RATIO ** k) for k in range(k_max + 1)] + [top + 1])


def histogram(pairs: np.ndarray) -> np.ndarray:
    """Rows (mean prompt, mean output, count) of each non-empty bin, in bin order."""
    p, o = pairs[:, 0], pairs[:, 1]
    bp = np.searchsorted(geometric_edges(MAX_PROMPT_TOKENS), p, side="right")
    bo = np.searchsorted(geometric_edges(MAX_TOTAL_TOKENS), o, side="right")
    _, bins, counts = np.unique(bp * 100_000 + bo, return_inverse=True, return_counts=True)
    mean_p = np.rint(np.bincount(bins, weights=p) / counts).astype(np.int64)
    mean_o = np.rint(np.bincount(bins, weights=o) / counts).astype(np.int64)
    # Each bin's pairs pass the filter, so their means do; rounding up may add one token.
    mean_p = np.minimum(mean_p, MAX_PROMPT_TOKENS)
    mean_o = np.minimum(mean_o, MAX_TOTAL_TOKENS - mean_p)
    return np.column_stack([mean_p, mean_o, counts])


def main(argv: list[str]) -> None:
    pkl, out = Path(argv[0]), Path(argv[1])
    pairs = first_turn_pairs(pkl)
    rows = histogram(pairs)
    lines = ["num_prefill_tokens,num_decode_tokens,num_requests"]
    lines += [f"{p},{o},{c}" for p, o, c in rows]
    out.write_text("\n".join(lines) + "\n")
    p_hist = np.repeat(rows[:, 0], rows[:, 2])
    o_hist = np.repeat(rows[:, 1], rows[:, 2])
    print(f"{len(pairs):,} pairs in {len(rows):,} bins; mean prompt {pairs[:, 0].mean():.2f} "
          f"(histogram {p_hist.mean():.2f}), output {pairs[:, 1].mean():.2f} "
          f"(histogram {o_hist.mean():.2f}); written to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
