"""Speculative decoding settings (``engine.speculative``) and their acceptance arithmetic.

A speculating sequence drafts ``k = num_speculative_tokens`` tokens per step (an EAGLE head, a
DeepSeek MTP module, or an n-gram match in its own prompt and output) and the target model
verifies them in one forward pass of ``k + 1`` positions: the accepted prefix plus one token
of the target's own (the bonus token) are emitted. With per-position acceptance rates
``a_1..a_k`` (``a_i``: the i-th draft is accepted given that all before it were) a step emits
on average ``tau = 1 + a_1 + a_1 a_2 + ... + a_1...a_k`` tokens, the "mean acceptance length"
that vLLM logs and the EAGLE papers call tau (both count the bonus token).

Defaults, when ``acceptance`` and ``mean_accepted_tokens`` are not given, come from published
measurements, turned into one rate per position (the same at every position: the geometric
chain, which gives back the published tau at the published k exactly):
- ``eagle3``: mean acceptance length 3.53 at k = 7, EAGLE3-LLaMA3.1-Instruct-8B drafting for
  Llama-3.1-8B-Instruct on MT-bench, temperature 0, vLLM V1 (vllm-project/vllm issue #26191,
  quoting PR #17504). The EAGLE-3 paper's own tau (arXiv:2503.01840, Table 1, 6-7 on MT-bench)
  is for tree drafting with 60 draft tokens, which vLLM does not run; the chain figure is the
  one that matches a ``k``-token chain.
- ``eagle``: mean acceptance length 2.08 at k = 4, EAGLE-LLaMA3-Instruct-8B on MT-bench, vLLM V1
  at batch 1 (vllm-project/vllm PR #16035, benchmark comment of 2025-04-09).
- ``mtp``: "the acceptance rate of the second token prediction ranges between 85% and 90%"
  (DeepSeek-V3 technical report, arXiv:2412.19437, sec. 5.4.3): 0.875 per position, the
  middle of the range; measured there with one MTP module (k = 1).
- ``ngram``: no default. Prompt lookup accepts what the output copies from the prompt, which
  is a property of the workload (summaries and code edits copy a lot, chat little), so the
  user states it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

SPEC_METHODS = ("eagle", "eagle3", "mtp", "ngram")
"""vLLM's ``speculative_config.method`` names that fleetsim prices."""

# method -> (mean acceptance length, k it was measured at, source); see the module docstring.
PUBLISHED_ACCEPTANCE: dict[str, tuple[float, int, str]] = {
    "eagle3": (3.53, 7, "vLLM issue #26191 (Llama-3.1-8B, MT-bench, k=7)"),
    "eagle": (2.08, 4, "vLLM PR #16035 (Llama-3-8B, MT-bench, k=4)"),
    "mtp": (1.875, 1, "DeepSeek-V3 report sec. 5.4.3 (85-90% second-token acceptance)"),
}

# Denominator of the emission schedule's rational tau (serving/speculative.py): tau is kept to
# 1e-6 tokens per step, far below what any acceptance figure resolves.
TAU_DENOMINATOR = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding of every replica (vLLM's ``--speculative-config``)."""

    method: str
    """Draft method: eagle | eagle3 (a one-layer EAGLE head), mtp (the model's own MTP module,
    DeepSeek-V3 style), ngram (prompt lookup, no draft model)."""
    num_speculative_tokens: int
    """Draft tokens per step, k: the target verifies k + 1 positions per sequence."""
    acceptance: float | tuple[float, ...] | None = None
    """Per-position acceptance rate in (0, 1], one for all positions or a list of k (the i-th
    given the ones before were accepted); None: ``mean_accepted_tokens`` or the method's
    published figure (docs/engine.md)."""
    mean_accepted_tokens: float | None = None
    """Mean tokens emitted per step, bonus token included (vLLM's "mean acceptance length"),
    in [1, k + 1]; instead of ``acceptance``."""
    draft_model: str | None = None
    """Draft checkpoint for the printed ``vllm serve`` line (eagle/eagle3 need one there);
    not used by the simulation."""

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if self.method not in SPEC_METHODS:
            raise ValueError(f"engine.speculative.method must be one of "
                             f"{', '.join(SPEC_METHODS)}, got {self.method!r}")
        if k < 1:
            raise ValueError(f"engine.speculative.num_speculative_tokens must be >= 1, got {k}; "
                             f"to turn speculation off, remove engine.speculative")
        if self.acceptance is not None and self.mean_accepted_tokens is not None:
            raise ValueError("engine.speculative: give acceptance or mean_accepted_tokens, "
                             "not both")
        rates = self.acceptance
        if isinstance(rates, tuple):
            if len(rates) not in (1, k):
                raise ValueError(f"engine.speculative.acceptance has {len(rates)} rates; give "
                                 f"one, or one per draft position ({k})")
            bad = [a for a in rates if not 0.0 < a <= 1.0]
        else:
            bad = [rates] if rates is not None and not 0.0 < rates <= 1.0 else []
        if bad:
            raise ValueError(f"engine.speculative.acceptance must be in (0, 1], got {bad[0]}")
        tau = self.mean_accepted_tokens
        if tau is not None and not 1.0 <= tau <= k + 1:
            raise ValueError(f"engine.speculative.mean_accepted_tokens must be in [1, "
                             f"num_speculative_tokens + 1 = {k + 1}], got {tau}")
        if self.method == "ngram" and rates is None and tau is None:
            raise ValueError("engine.speculative: ngram has no published acceptance (it "
                             "depends on how much the output copies the prompt); set "
                             "acceptance or mean_accepted_tokens")

    @property
    def uses_draft_kv(self) -> bool:
        """Whether the drafter keeps KV of its own in the same blocks: vLLM's EAGLE-family
        proposers (eagle, eagle3, mtp) reserve k lookahead slots per step; n-gram none."""
        return self.method != "ngram"


def chain_tau(rates: tuple[float, ...]) -> float:
    """Mean tokens per step of a chain with per-position acceptance ``rates`` (bonus incl.)."""
    tau, p = 1.0, 1.0
    for a in rates:
        p *= a
        tau += p
    return tau


def rate_for_tau(tau: float, k: int) -> float:
    """The one per-position rate whose k-token chain emits ``tau`` tokens per step
    (bisection: ``chain_tau`` grows with the rate)."""
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if chain_tau((mid,) * k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def position_rates(cfg: SpeculativeConfig) -> tuple[float, ...]:
    """Acceptance rate of each of the k draft positions, as given or by default."""
    k = cfg.num_speculative_tokens
    if isinstance(cfg.acceptance, tuple):
        return cfg.acceptance * k if len(cfg.acceptance) == 1 else cfg.acceptance
    if cfg.acceptance is not None:
        return (cfg.acceptance,) * k
    if cfg.mean_accepted_tokens is not None:
        return (rate_for_tau(cfg.mean_accepted_tokens, k),) * k
    tau, k_pub, _ = PUBLISHED_ACCEPTANCE[cfg.method]
    return (rate_for_tau(tau, k_pub),) * k


def tokens_per_step(cfg: SpeculativeConfig) -> Fraction:
    """Expected tokens emitted per decode step, as the exact rational the engine uses."""
    if cfg.mean_accepted_tokens is not None:
        tau = cfg.mean_accepted_tokens
    else:
        tau = chain_tau(position_rates(cfg))
    return Fraction(round(tau * TAU_DENOMINATOR), TAU_DENOMINATOR)


def vllm_speculative_json(cfg: SpeculativeConfig) -> str:
    """The ``--speculative-config`` JSON vLLM takes for ``cfg``."""
    parts = [f'"method": "{cfg.method}"']
    if cfg.draft_model is not None:
        parts.append(f'"model": "{cfg.draft_model}"')
    parts.append(f'"num_speculative_tokens": {cfg.num_speculative_tokens}')
    return "{" + ", ".join(parts) + "}"
