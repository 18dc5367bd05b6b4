"""Prompt and response lengths of one RL step: long-tailed, correlated inside a GRPO group.

``polytrace`` resamples real GRPO groups (PolyTrace's DAPO Qwen2.5-32B and DeepCoder-14B
runs, embedded as ``fleetsim/data/polytrace_grpo_groups.csv``): each prompt of the step draws
one logged group (with replacement) and its samples draw from that group's logged lengths
(without replacement up to 8, the logged group size, with replacement beyond), so prompts
keep their own difficulty. ``lognormal`` is a hierarchical fit to the same DAPO groups,
``log L = mean_log + a_prompt + e_sample`` with ``a ~ N(0, between_sd)`` and
``e ~ N(0, within_sd)``. Lengths are multiplied by ``scale``, rounded and capped at
``max_response_tokens`` (a capped sample is a truncated rollout, as DeepCoder's 16K hits).
``sharegpt`` draws each sample's response (and, unless ``prompt_tokens`` is set, its prompt)
from one row of ShareGPT's chat lengths (``embedded:sharegpt_lengths``: a chat assistant's
answers, for RLHF on dialogue prompts), samples independent of each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # rl.config's agentic table imports the trajectories, which import us
    from fleetsim.rl.config import RLConfig

# median prompt of PolyTrace's DAPO run (the embedded polytrace_grpo_groups.csv)
DEFAULT_PROMPT_TOKENS = 152


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One step's rollouts: sample i belongs to prompt ``group[i]``."""

    prompt_tokens: NDArray[np.int64]
    """Per sample (the group's prompt)."""
    response_tokens: NDArray[np.int64]
    group: NDArray[np.int64]

    @property
    def num_samples(self) -> int:
        return len(self.group)


@lru_cache(maxsize=4)
def polytrace_groups(run: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(prompt tokens, response lengths) of every logged group of ``run``."""
    text = resources.files("fleetsim").joinpath("data", "polytrace_grpo_groups.csv").read_text()
    out = []
    for line in text.splitlines()[1:]:
        name, _, _, prompt, responses = line.split(",")
        if name == run:
            out.append((int(prompt), tuple(int(x) for x in responses.split())))
    if not out:
        raise ValueError(f"no polytrace groups for run {run!r}")
    return tuple(out)


@lru_cache(maxsize=1)
def sharegpt_rows() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(prompt, answer) token counts of every ShareGPT row (fleetsim/data/README.md)."""
    from fleetsim.workloads.loaders import read_column

    src = "embedded:sharegpt_lengths"
    return read_column(src, "num_prefill_tokens"), read_column(src, "num_decode_tokens")


def sample_step(cfg: RLConfig, rng: np.random.Generator) -> StepBatch:
    """Draw one step's batch (``num_prompts_per_step`` groups of ``samples_per_prompt``)."""
    lc = cfg.lengths
    n, g = cfg.num_prompts_per_step, cfg.samples_per_prompt
    if lc.kind == "polytrace":
        groups = polytrace_groups(lc.run)
        pick = rng.integers(0, len(groups), size=n)
        prompts = np.empty(n, dtype=np.int64)
        resp = np.empty((n, g), dtype=np.float64)
        for i, j in enumerate(pick.tolist()):
            prompt, lens = groups[j]
            prompts[i] = prompt
            arr = np.asarray(lens, dtype=np.float64)
            resp[i] = (rng.permutation(arr)[:g] if g <= len(arr)
                       else rng.choice(arr, size=g, replace=True))
    elif lc.kind == "lognormal":
        prompts = np.full(n, DEFAULT_PROMPT_TOKENS, dtype=np.int64)
        a = rng.normal(0.0, lc.between_sd, size=(n, 1))
        e = rng.normal(0.0, lc.within_sd, size=(n, g))
        resp = np.exp(lc.mean_log + a + e)
    elif lc.kind == "sharegpt":
        prompt_col, answer_col = sharegpt_rows()
        rows = rng.integers(0, len(answer_col), size=(n, g))
        prompts = prompt_col[rows[:, 0]].astype(np.int64)
        resp = answer_col[rows].astype(np.float64)
    else:
        prompts = np.full(n, DEFAULT_PROMPT_TOKENS, dtype=np.int64)
        resp = np.full((n, g), float(lc.value))
    if lc.prompt_tokens is not None:
        prompts[:] = lc.prompt_tokens
    lengths = np.clip(np.rint(resp * lc.scale), 1, cfg.max_response_tokens).astype(np.int64)
    return StepBatch(prompt_tokens=np.repeat(prompts, g), response_tokens=lengths.ravel(),
                     group=np.repeat(np.arange(n, dtype=np.int64), g))
