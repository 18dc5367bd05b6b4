"""L-Eval's request lengths from its published statistics (An et al., *L-Eval: Instituting
Standardized Evaluation for Long Context Language Models*, ACL'24, arXiv:2307.11088, Table 1;
the same table is ``figs/data.png`` in ``OpenLMLab/LEval``).

The dataset is GPL-3.0; only length statistics are used here, no text. Per task the table gives
the mean and max document length in tokens, the number of instructions (queries) and of
documents. A request is one instruction on its document, as LoongServe's preprocessing builds
it (``test/longserve/4-preprocess-dataset.py``: one request per instruction, prompt = document
+ instruction), so a task's share of requests is its share of instructions.

Input shape [assumption]: within a task, document lengths follow a power law ``x^(c-1)`` on
[3,000 tokens, the task's max] whose exponent is solved so that its mean is the table's mean
(3,000 is the low end of L-Eval's stated 3k-200k range, its abstract; ``c = 0`` is
log-uniform). The instruction's own tokens (a sentence) are not in the table and are left out.

Outputs: the table has none. ``mean_output_words`` is the mean whitespace-word count of the
reference answers per task, counted in the repository's ``LEval-data/*.jsonl`` at commit
``cd34b05`` (only the counts are kept); two files were not readable here (``codeU``,
``narrative_qa``) and take their group's instruction-weighted mean (closed-ended tasks 4.3
words, open-ended QA 28.5) [assumption]. Words become tokens at 1.3 Llama tokens per word
[assumption, as for LV-Eval in ``workloads/long_context.py``]; every request of a task asks
for the task's mean (a point mass: the spread within a task is not published).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

MIN_INPUT_TOKENS = 3_000  # the abstract's "input length (3k~200k tokens)"
TOKENS_PER_WORD = 1.3  # [assumption] Llama-2 tokenizer on English prose


@dataclass(frozen=True, slots=True)
class LevalTask:
    """One row of L-Eval's Table 1 plus its reference answers' mean length."""

    name: str
    """The task's file name in ``LEval-data``."""
    mean_input_tokens: int
    """Table 1 "Avg len": mean document length, tokens."""
    max_input_tokens: int
    """Table 1 "Max len": longest document, tokens."""
    num_instructions: int
    """Table 1 "#Instr": queries over the task's documents."""
    num_documents: int
    """Table 1 "#Doc"."""
    mean_output_words: float
    """Mean reference-answer length, words (counted, see the module docstring)."""


# Table 1 of arXiv:2307.11088, row by row (closed-ended tasks, then open-ended).
TASKS: tuple[LevalTask, ...] = (
    LevalTask("tpo", 3_907, 4_171, 269, 15, 1.0),                   # TOEFL
    LevalTask("gsm100", 5_557, 5_638, 100, 100, 1.0),               # GSM (16-shot)
    LevalTask("quality", 7_169, 8_560, 202, 15, 12.2),              # QuALITY
    LevalTask("coursera", 9_075, 17_185, 172, 15, 1.0),
    LevalTask("topic_retrieval_longchat", 12_506, 15_916, 150, 50, 6.4),
    LevalTask("sci_fi", 16_381, 26_918, 64, 7, 3.0),                # SFiction
    LevalTask("codeU", 31_575, 36_509, 90, 90, 4.3),                # closed-ended mean
    LevalTask("multidoc_qa", 3_905, 7_888, 136, 20, 21.5),          # MultiDoc2Dial
    LevalTask("scientific_qa", 5_019, 6_547, 160, 20, 12.2),        # Qasper
    LevalTask("financial_qa", 6_032, 7_824, 52, 6, 60.0),           # LongFQA
    LevalTask("natural_question", 23_698, 47_726, 104, 20, 4.4),    # NQ
    LevalTask("legal_contract_qa", 30_966, 68_625, 130, 20, 62.5),  # CUAD
    LevalTask("narrative_qa", 62_335, 210_541, 182, 20, 28.5),      # open-ended QA mean
    LevalTask("news_summ", 7_320, 19_278, 11, 11, 274.7),           # Multi-News
    LevalTask("gov_report_summ", 7_495, 27_128, 13, 13, 263.3),
    LevalTask("patent_summ", 7_718, 12_867, 13, 13, 122.4),         # BigPatent
    LevalTask("tv_show_summ", 10_688, 14_544, 13, 13, 98.1),        # SummScreen
    LevalTask("paper_assistant", 11_170, 33_303, 60, 20, 268.8),    # Openreview
    LevalTask("meeting_summ", 16_692, 33_310, 156, 20, 62.4),       # QMSum
    LevalTask("review_summ", 19_978, 22_158, 120, 20, 97.9),        # SPACE
)


def request_weights() -> NDArray[np.float64]:
    """Each task's share of requests (its share of instructions)."""
    n = np.asarray([t.num_instructions for t in TASKS], dtype=np.float64)
    return n / n.sum()


def mean_prompt_tokens() -> float:
    """The published per-request mean input (instruction-weighted mean of "Avg len")."""
    return float(sum(w * t.mean_input_tokens for w, t in zip(request_weights(), TASKS,
                                                               strict=True)))


def output_tokens(task: LevalTask) -> int:
    return max(1, round(task.mean_output_words * TOKENS_PER_WORD))


def power_exponent(task: LevalTask) -> float:
    """``c`` of the density ``x^(c-1)`` on [MIN_INPUT_TOKENS, max] whose mean is the task's."""
    lo_frac = MIN_INPUT_TOKENS / task.max_input_tokens
    target = task.mean_input_tokens / task.max_input_tokens
    # the mean rises with c; the table's rows need -4 < c < 69, and beyond -60 the power
    # of a 3k/210k fraction would overflow a float
    lo, hi = -60.0, 120.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if _mean_fraction(mid, lo_frac) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def lengths(n: int, rng: np.random.Generator) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``n`` (prompt, output) token counts: a task by its share of instructions, then a
    document length from the task's power law and the task's mean answer."""
    task_of = rng.choice(len(TASKS), size=n, p=request_weights())
    u = rng.random(n)
    prompt = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for i, task in enumerate(TASKS):
        pick = task_of == i
        c, lo_frac = power_exponent(task), MIN_INPUT_TOKENS / task.max_input_tokens
        if abs(c) < 1e-9:  # log-uniform
            frac = lo_frac ** (1.0 - u[pick])
        else:  # inverse CDF of x^(c-1) on [lo_frac, 1]
            frac = (lo_frac ** c + u[pick] * (1.0 - lo_frac ** c)) ** (1.0 / c)
        prompt[pick] = np.rint(frac * task.max_input_tokens).astype(np.int64)
        out[pick] = output_tokens(task)
    return prompt, out


def _mean_fraction(c: float, lo_frac: float) -> float:
    """Mean of ``t`` under density ``t^(c-1)`` on [lo_frac, 1] (a fraction of the max)."""
    log_lo = math.log(lo_frac)
    if abs(c) < 1e-9:
        return (1.0 - lo_frac) / -log_lo
    if abs(c + 1.0) < 1e-9:
        return -log_lo * lo_frac / (1.0 - lo_frac)
    return c / (c + 1.0) * (1.0 - lo_frac ** (c + 1.0)) / (1.0 - lo_frac ** c)
