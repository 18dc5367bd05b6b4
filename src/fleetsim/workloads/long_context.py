"""LoongServe's datasets as request lengths: ShareGPT, L-Eval, LV-Eval and their Mixed set.

The artifact samples prompts from preprocessed datasets (``test/longserve/4-preprocess-dataset.py``,
``4-mix-dataset.py``) that are not obtainable offline, so:

- **ShareGPT**: fleetsim's embedded ShareGPT lengths (Llama-2 tokenizer, the same family as
  LWM-Text-1M's), with the artifact's filters: prompt and output >= 4 tokens, prompt + output
  < 200,000, output < 1,000. The artifact joins a random number of earlier turns into the
  prompt, so its prompts are longer than these first-turn ones (a difference, stated);
- **L-Eval** (An et al., ACL'24, arXiv:2307.11088): from its Table 1's per-task statistics
  (``fleetsim.workloads.leval``: a task by its share of instructions, a document length with
  the task's published mean and max, the task's mean answer length): 16.4k tokens per prompt
  on average, as the artifact's one request per (document, instruction) pair weighs them;
- **LV-Eval** (Yuan et al., 2024): five length levels of 16k, 32k, 64k, 128k and 256k words,
  min/max 11,896 / 387,406 words (its README); six English subsets in the artifact. We draw a
  level uniformly, then words log-uniform on [0.74, 1.51] x the level (the stated min/max over
  the extreme levels), times 1.3 Llama tokens per word [assumption], capped at the artifact's
  500,000-token request limit; outputs log-uniform on [4, 64] tokens (an assumption: its
  answers are keywords and short phrases);
- **Mixed**: the three pooled, equal parts (the artifact's 1,500 of each), shuffled.

Arrivals are Poisson at the given rate (the artifact's ``5-benchmark-serving.py``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fleetsim.workloads import leval
from fleetsim.workloads.loaders import read_column
from fleetsim.workloads.workload import Workload

DATASETS = ("sharegpt", "leval", "lv-eval", "mixed", "zipf<alpha>")
ZIPF_TARGETS = (10, 200_000)  # 4-mix-dataset-zipf.py: lens = range(10, 200000)
MAX_REQUEST_TOKENS = 500_000  # --max_req_total_len of the artifact's servers
LVEVAL_LEVELS_WORDS = (16_000, 32_000, 64_000, 128_000, 256_000)
LVEVAL_SPREAD = (0.74, 1.51)  # 11,896 / 16k and 387,406 / 256k
TOKENS_PER_WORD = 1.3
LVEVAL_OUTPUT = (4, 64)


def lengths(dataset: str, n: int, rng: np.random.Generator
            ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``n`` (prompt, output) token counts of ``dataset``."""
    if dataset == "sharegpt":
        return _sharegpt(n, rng)
    if dataset == "leval":
        return leval.lengths(n, rng)
    if dataset == "lv-eval":
        level = np.asarray(LVEVAL_LEVELS_WORDS, dtype=np.float64)[rng.integers(0, 5, n)]
        words = level * np.exp(rng.uniform(np.log(LVEVAL_SPREAD[0]),
                                           np.log(LVEVAL_SPREAD[1]), n))
        out = _loguniform(LVEVAL_OUTPUT, n, rng)
        prompt = np.minimum(np.rint(words * TOKENS_PER_WORD).astype(np.int64),
                            MAX_REQUEST_TOKENS - out)
        return prompt, out
    if dataset == "mixed":
        parts = [lengths(d, n // 3 + (1 if i < n % 3 else 0), rng)
                 for i, d in enumerate(("sharegpt", "leval", "lv-eval"))]
        prompt = np.concatenate([p for p, _ in parts])
        out = np.concatenate([o for _, o in parts])
        order = rng.permutation(n)
        return prompt[order], out[order]
    if dataset.startswith("zipf"):
        return _zipf(float(dataset.removeprefix("zipf")), n, rng)
    raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")


POOL_SIZE = 6000  # lengths drawn once per (dataset, seed); a run takes the first n


def workload(dataset: str, n: int, rate_per_s: float, seed: int) -> Workload:
    """``n`` requests of ``dataset`` arriving as a Poisson process of ``rate_per_s``. Common
    random numbers: for one seed, every rate sees the same requests in the same order and
    the same arrival pattern scaled by 1 / rate, so a sweep's curves differ by load alone."""
    if not 0 < n <= POOL_SIZE:
        raise ValueError(f"n must be in 1..{POOL_SIZE}, got {n}")
    prompt, out = lengths(dataset, POOL_SIZE, np.random.default_rng([seed, 1]))
    gaps = np.random.default_rng([seed, 2]).exponential(1.0, n) / rate_per_s
    arrival = np.cumsum(gaps)
    return Workload(arrival_s=arrival - arrival[0], num_prompt_tokens=prompt[:n],
                    num_output_tokens=out[:n], name=f"loongserve {dataset} @ {rate_per_s:g}/s")


def _zipf(alpha: float, n: int, rng: np.random.Generator
          ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The artifact's Zipf mixes (``4-mix-dataset-zipf.py``): a target prompt length drawn
    with weight ``1 / x^alpha`` over 10..199,999 tokens, then a request of the pooled
    ShareGPT, L-Eval and LV-Eval sets whose prompt length is nearest (the last shorter one
    on a tie), one of those of that length at random."""
    parts = [lengths(d, POOL_SIZE, rng) for d in ("sharegpt", "leval", "lv-eval")]
    pool_p = np.concatenate([p for p, _ in parts])
    pool_o = np.concatenate([o for _, o in parts])
    order = np.argsort(pool_p, kind="stable")
    pool_p, pool_o = pool_p[order], pool_o[order]
    x = np.arange(*ZIPF_TARGETS, dtype=np.float64)
    cdf = np.cumsum(x ** -alpha)
    targets = x[np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"),
                           len(x) - 1)]
    avail = np.unique(pool_p)
    hi = np.minimum(np.searchsorted(avail, targets, side="left"), len(avail) - 1)
    lo = np.maximum(hi - 1, 0)
    shorter = (targets - avail[lo]) <= (avail[hi] - targets)
    nearest = np.where((avail[hi] >= targets) & shorter & (avail[lo] < targets),
                       avail[lo], avail[hi])
    left = np.searchsorted(pool_p, nearest, side="left")
    right = np.searchsorted(pool_p, nearest, side="right")
    pick = left + (rng.random(n) * (right - left)).astype(np.int64)
    return pool_p[pick], pool_o[pick]


def _loguniform(bounds: tuple[int, int], n: int, rng: np.random.Generator
                ) -> NDArray[np.int64]:
    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    return np.rint(np.exp(rng.uniform(lo, hi, n))).astype(np.int64)


def _sharegpt(n: int, rng: np.random.Generator) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    prompt = read_column("embedded:sharegpt_lengths", "num_prefill_tokens")
    out = read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    keep = (prompt >= 4) & (out >= 4) & (prompt + out < 200_000) & (out < 1_000)
    prompt, out = prompt[keep], out[keep]
    pick = rng.integers(0, len(prompt), n)
    return prompt[pick].astype(np.int64), out[pick].astype(np.int64)
