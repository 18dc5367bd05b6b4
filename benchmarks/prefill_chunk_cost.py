"""CPU per request of long chunked prompts: chunk runs (``serving/chunk_runs.py``) against
planning every chunk, and against whole prompts (one step a prompt: the floor).

A prompt longer than the token budget is prefilled in chunks, one step each; without chunk
runs a run's cost grows with its prompt tokens. The same requests (fixed-length prompts,
256-token outputs, Poisson arrivals) are served by Llama-3.1-8B on one H100 and on an H100
P/D pair, with the token budget (``max_batched_tokens``) at 2,048, by four systems:

- ``chunk runs``: ``token_budget`` as it is (it declares ``prefill_chunks_repeat`` and
  ``mixed_chunks_repeat``: runs also carry the decodes riding beside a prompt);
- ``lone-prompt runs``: without ``mixed_chunks_repeat`` (a subclass: capabilities are not
  inherited), runs only where nothing decodes beside the prompt;
- ``every chunk planned``: without either, so the engine plans, applies and commits each
  chunk as a step;
- ``whole prompts``: the token budget above the prompt (not the same schedule: a prompt a
  step, the cost of a run with no chunking at all).

The first three must give identical request records (checked: the script stops if not).
CPU time is the process's (``time.process_time``), the least of ``--repeat`` rounds (a round
runs each system once, after one untimed run that loads the model's tables), per request.
On one replica the running requests decode in most steps of the next prompt's chunks (mixed
steps: what ``lone-prompt runs`` against ``chunk runs`` measures); on the P/D pair's prefill
side nothing decodes.

    python benchmarks/prefill_chunk_cost.py [--requests 400] [--rate 0.25] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from fleetsim.config import config_from_dict
from fleetsim.policies.batching import TokenBudgetPlanner
from fleetsim.run import run
from fleetsim.serving.capabilities import Capabilities
from fleetsim.workloads.workload import Workload

MODEL = "Llama-3.1-8B"
BUDGET = 2048


@dataclass(slots=True)
class EveryChunkPlanned(TokenBudgetPlanner):
    """``token_budget`` without ``prefill_chunks_repeat``: each chunk planned as a step."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)


@dataclass(slots=True)
class LonePromptRuns(TokenBudgetPlanner):
    """``token_budget`` without ``mixed_chunks_repeat``: runs only while nothing decodes."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True,
                                prefill_chunks_repeat=True)


def _workload(n: int, prompt: int, rate: float) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.cumsum(rng.exponential(1 / rate, n)),
                    num_prompt_tokens=np.full(n, prompt), num_output_tokens=np.full(n, 256),
                    name=f"{prompt}-token prompts")


def _config(pd: bool, policy: str, budget: int) -> dict:
    pools = ([{"name": "p", "gpu": "H100", "role": "prefill"},
              {"name": "d", "gpu": "H100", "role": "decode"}] if pd
             else [{"name": "gpu", "gpu": "H100"}])
    return {"model": MODEL, "seed": 0, "cluster": {"pools": pools},
            "engine": {"max_running": 64, "max_batched_tokens": budget},
            "policy": {"batching": {"name": policy}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=0.25, help="arrivals per second")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompts", type=int, nargs="+", default=[2048, 16384, 65536])
    args = parser.parse_args()
    systems = (("chunk runs", "token_budget", False),
               ("lone-prompt runs", f"{__name__}:LonePromptRuns", False),
               ("every chunk planned", f"{__name__}:EveryChunkPlanned", False),
               ("whole prompts", "token_budget", True))
    print(f"{MODEL}, {args.requests} requests at {args.rate}/s, 256-token outputs, "
          f"token budget {BUDGET}; CPU per request (least of {args.repeat})")
    # (the first run in a process loads the model's tables: one untimed run first)
    run(config_from_dict(_config(False, "token_budget", BUDGET)),
        workload=_workload(4, 4096, args.rate))
    for pd in (False, True):
        for prompt in args.prompts:
            wl = _workload(args.requests, prompt, args.rate)
            best = {label: float("inf") for label, _, _ in systems}
            records = {}
            for _ in range(args.repeat):
                for label, policy, whole in systems:
                    config = config_from_dict(
                        _config(pd, policy, prompt + 64 if whole else BUDGET))
                    cpu0 = time.process_time()
                    result = run(config, workload=wl)
                    best[label] = min(best[label], time.process_time() - cpu0)
                    records[label] = result.records.requests
            planned = records["every chunk planned"]
            for label in ("chunk runs", "lone-prompt runs"):
                for col, values in planned.items():
                    if not np.array_equal(values, records[label][col], equal_nan=True):
                        raise SystemExit(f"{label} changed {col!r}: a bug")
            us = {label: best[label] / args.requests * 1e6 for label in best}
            print(f"{'H100 P/D pair' if pd else 'one H100':>14}, {prompt:>6}-token prompts: "
                  + ", ".join(f"{label} {us[label]:.0f} us" for label in us)
                  + f"; every chunk planned / chunk runs "
                  f"{us['every chunk planned'] / us['chunk runs']:.2f}x, lone-prompt runs / "
                  f"chunk runs {us['lone-prompt runs'] / us['chunk runs']:.2f}x, "
                  f"chunk runs / whole prompts {us['chunk runs'] / us['whole prompts']:.2f}x")


if __name__ == "__main__":
    main()
