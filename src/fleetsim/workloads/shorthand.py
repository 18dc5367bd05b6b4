"""``fleetsim run`` flags in the words of ``vllm bench serve``, turned into ``--set`` items.

``--isl/--osl`` (with ``--random-range-ratio``, as vLLM's random dataset: lengths uniform in
[N (1 - r), N (1 + r)]), ``--request-rate`` (``inf``: all at 0 s), ``--burstiness`` (gamma
inter-arrivals of shape B, so CV = 1 / sqrt(B); 1 is Poisson), ``--num-prompts`` and
``--max-concurrency`` (a closed loop of that many clients). Without ``--isl`` the flags
apply to the config's workload (a trace keeps its lengths and arrival times; ``--num-prompts``
keeps its first N requests).
"""

from __future__ import annotations

import argparse
import math

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import MAX_REQUESTS, MAX_TOKENS, check_number


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload shorthands (vllm bench serve's flags)")
    g.add_argument("--isl", "--random-input-len", "--input-len", dest="isl", type=int,
                   default=None, metavar="N",
                   help="synthetic prompts of N tokens (vLLM's --random-input-len)")
    g.add_argument("--osl", "--random-output-len", "--output-len", dest="osl", type=int,
                   default=None, metavar="N",
                   help="synthetic outputs of N tokens (vLLM's --random-output-len)")
    g.add_argument("--random-range-ratio", type=float, default=0.0, metavar="R",
                   help="lengths uniform in [N(1-R), N(1+R)] (default 0: fixed)")
    g.add_argument("--request-rate", default=None, metavar="RATE",
                   help="requests per second, or inf to send all at once (default: inf with "
                        "--isl, else the config's)")
    g.add_argument("--burstiness", type=float, default=None, metavar="B",
                   help="gamma arrivals of shape B (CV 1/sqrt(B)); 1 = Poisson")
    g.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="requests to send (default 1000 with --isl, as vLLM)")
    g.add_argument("--max-concurrency", type=int, default=None, metavar="C",
                   help="closed loop: at most C requests in flight, the next sent as one "
                        "finishes")


def _lengths(n: int, ratio: float) -> str:
    if ratio == 0:
        return f"{{kind='fixed', value={n}}}"
    low, high = max(1, math.floor(n * (1 - ratio))), math.ceil(n * (1 + ratio))
    return f"{{kind='uniform', low={low}, high={high}}}"


def workload_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` items the shorthand flags stand for (validated here)."""
    out: list[str] = []
    isl, osl = getattr(args, "isl", None), getattr(args, "osl", None)
    if isl is None and osl is None and all(
            getattr(args, k, None) is None for k in ("request_rate", "burstiness",
                                                      "num_prompts", "max_concurrency")):
        return out
    if (isl is None) != (osl is None):
        raise FleetsimInputError("--isl" if isl is None else "--osl", None,
                                 "give both --isl and --osl for a synthetic workload")
    for flag, v in (("--isl", isl), ("--osl", osl)):
        if v is not None:
            check_number(v, flag, lo=1, hi=MAX_TOKENS, integer=True)
    ratio = check_number(args.random_range_ratio, "--random-range-ratio", lo=0.0, hi=0.999)
    rate: float | None = None
    if args.request_rate is not None:
        try:
            rate = float(args.request_rate)
        except ValueError:
            raise FleetsimInputError("--request-rate", args.request_rate,
                                     "give requests per second, or inf") from None
        if rate != math.inf:
            check_number(rate, "--request-rate", lo=1e-6, hi=1e7)
    if args.burstiness is not None:
        check_number(args.burstiness, "--burstiness", lo=1e-4, hi=1e6)
    if args.num_prompts is not None:
        check_number(args.num_prompts, "--num-prompts", lo=1, hi=MAX_REQUESTS, integer=True)
    if args.max_concurrency is not None:
        check_number(args.max_concurrency, "--max-concurrency", lo=1, hi=10_000_000,
                     integer=True)
        out.append(f"workload.max_concurrency={args.max_concurrency}")
    burst = args.burstiness not in (None, 1.0)
    if isl is not None:
        out += ["workload.trace='synthetic'",
                f"workload.prompt_tokens={_lengths(isl, ratio)}",
                f"workload.output_tokens={_lengths(osl, ratio)}",  # type: ignore[arg-type]
                f"workload.num_requests={args.num_prompts or 1000}"]
        if rate is None or rate == math.inf:
            if burst:
                raise FleetsimInputError("--burstiness", args.burstiness,
                                         "shapes arrivals at a finite --request-rate; give one")
            out.append("workload.arrival='at_once'")
        else:
            out.append(f"workload.rate_per_s={rate!r}")
            if burst:
                out += ["workload.arrival='gamma'",
                        f"workload.cv={1 / math.sqrt(args.burstiness)!r}"]
        return out
    # a configured workload: a trace, or a synthetic one
    if args.num_prompts is not None:
        out.append(f"workload.max_requests={args.num_prompts}")
    if rate is not None or burst:
        raise FleetsimInputError("--request-rate" if rate is not None else "--burstiness",
                                 args.request_rate if rate is not None else args.burstiness,
                                 "shape synthetic arrivals: use them with --isl/--osl (for a "
                                 "trace, scale it with --set workload.rate_scale=X)")
    return out
