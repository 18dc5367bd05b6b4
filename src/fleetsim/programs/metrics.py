"""Program metrics: JCT per program, its standalone time T_w, the SLO scale ReqX over
programs (HexAGenT: a program meets its SLO at scale s when JCT <= s x T_w; ReqX is the
smallest s at which X% of the programs that arrived meet it, unfinished ones never do), and
the latency per token (Autellix, arXiv:2502.13965 §6.2: a program's response time over the
tokens it generated, all its threads together; its Figures 12-15 plot the mean in s/token)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.metrics.summary import distribution

DEFAULT_PCTS = (90.0, 95.0, 99.0)


def slo_scale(jct_s: NDArray[np.float64], standalone_s: NDArray[np.float64], pct: float,
              num_unfinished: int = 0) -> float:
    """Smallest s with at least ``pct``% of programs at JCT <= s x T_w (the inverted-CDF
    percentile of JCT / T_w, as ``search.slo_scale.req_slo_scale`` for requests): inf when
    it falls on unfinished programs, nan with no program."""
    if not 0.0 < pct <= 100.0:
        raise ValueError(f"pct must be in (0, 100], got {pct}")
    ratios = np.sort(np.asarray(jct_s, dtype=np.float64) / np.asarray(standalone_s))
    n = ratios.size + num_unfinished
    if n == 0:
        return math.nan
    k = max(int(np.ceil(pct / 100.0 * n - 1e-9)), 1)
    return float(ratios[k - 1]) if k <= ratios.size else math.inf


def latency_per_token_s(jct_s: NDArray[np.float64], num_output_tokens: NDArray[np.int64]
                        ) -> NDArray[np.float64]:
    """Each program's seconds per generated token: JCT (arrival to its last call's finish,
    so the critical path for a DAG) over the output tokens of all its calls (Autellix's
    "program-level token latency", §6.2; per program, the normalized latency of vLLM, SOSP'23
    §6.1)."""
    return np.asarray(jct_s, dtype=np.float64) / np.asarray(num_output_tokens,
                                                             dtype=np.float64)


def program_summary(rows: dict[str, NDArray[Any]], pcts: tuple[float, ...] = DEFAULT_PCTS
                    ) -> dict[str, Any]:
    """The summary's ``programs`` section from ``ProgramSource.records()``."""
    done = ~np.isnan(rows["finish_s"])
    jct, tw = rows["jct_s"][done], rows["standalone_s"][done]
    num_tokens = rows["num_output_tokens"][done]
    num_unfinished = int((~done).sum())
    out: dict[str, Any] = {
        "num_programs": int(done.size),
        "num_finished": int(done.sum()),
        "num_unfinished": num_unfinished,
        "num_calls": int(rows["num_calls"].sum()),
        "jct_s": distribution(jct),
        "standalone_s": distribution(tw),
        "slowdown": distribution(jct / tw) if jct.size else distribution(jct),
        "latency_per_token_s": distribution(latency_per_token_s(jct, num_tokens)),
        "standalone_per_token_s": distribution(latency_per_token_s(tw, num_tokens)),
        "slo_scale": {},
        "by_kind": {},
    }
    for pct in pcts:
        s = slo_scale(jct, tw, pct, num_unfinished)
        out["slo_scale"][f"req{pct:g}"] = s if math.isfinite(s) else None
    for kind in sorted(set(rows["kind"].tolist())):
        mask = rows["kind"] == kind
        k_done = mask & done
        s95 = slo_scale(rows["jct_s"][k_done], rows["standalone_s"][k_done], 95.0,
                        int((mask & ~done).sum()))
        out["by_kind"][kind] = {"num_programs": int(mask.sum()),
                                "jct_p50_s": float(np.median(rows["jct_s"][k_done]))
                                if k_done.any() else None,
                                "req95": s95 if math.isfinite(s95) else None}
    return out
