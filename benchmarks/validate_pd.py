"""Prefill/decode disaggregation vs colocation: reproduce DistServe's motivating experiment.

Source: the DistServe authors' blog (Hao AI Lab, "Throughput is Not All You Need", March
2024, Figure 6 and the text around it): a 13B model on one A100-80GB, Poisson arrivals,
512-token prompts and 64-token outputs, SLO P90 TTFT <= 0.4 s and P90 TPOT <= 0.04 s.
Read from their figure (so approximate): the colocated system (vLLM of the time) sustains
about 1.6 req/s per GPU; a prefill-only worker about 5.6 req/s; a decode-only worker about
10 req/s; 2P1D about 10 req/s on 3 GPUs = 3.3 req/s per GPU, i.e. 2.1x per GPU.

Here the same setups run through fleetsim (Llama-2-13B shape, vLLM-v0 `prefill_first`
batching for the colocated baseline, NVLink between prefill and decode replicas), and each
goodput is found by bisection on the arrival rate. Prints a table; `--markdown` prints the
rows for docs/validation.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from fleetsim.config import config_from_dict
from fleetsim.metrics.summary import per_request_latencies
from fleetsim.run import run

LLAMA2_13B = {  # Hugging Face config.json of meta-llama/Llama-2-13b-hf (public values)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 5120,
    "intermediate_size": 13824, "num_attention_heads": 40, "num_hidden_layers": 40,
    "num_key_value_heads": 40, "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}
TTFT_P90_S, TPOT_P90_S = 0.4, 0.04
PUBLISHED = {"colocated": 1.6, "prefill worker": 5.6, "decode worker": 10.0,
             "2P1D (per GPU)": 10.0 / 3}


def setup(model_path: str, pools: list[dict] | None, rate: float, n: int) -> dict:
    cfg = {
        "model": model_path,
        "hardware": {"gpu": "a100"},
        "engine": {"max_batched_tokens": 4096},
        "policy": {"batching": {"name": "prefill_first"}},
        "workload": {"trace": None, "arrival": "poisson", "rate_per_s": rate,
                     "num_requests": n, "prompt_tokens": {"kind": "fixed", "value": 512},
                     "output_tokens": {"kind": "fixed", "value": 64}},
        "seed": 1,
    }
    if pools:
        cfg["cluster"] = {"pools": pools, "link": {"placement": "intra_node"}}
    return cfg


def p90s(cfg: dict) -> tuple[float, float]:
    req = run(config_from_dict(cfg)).records.requests
    lat = per_request_latencies(req)
    return float(np.percentile(lat["ttft_s"], 90)), float(np.nanpercentile(lat["tpot_s"], 90))


def max_rate(model_path: str, pools, check: str, n: int, lo=0.2, hi=40.0, iters=12) -> float:
    """Highest Poisson rate whose P90 latencies meet the SLO (bisection)."""
    def ok(rate: float) -> bool:
        ttft, tpot = p90s(setup(model_path, pools, rate, n))
        return (check in ("ttft", "both") and ttft <= TTFT_P90_S or check == "tpot") and \
            (check in ("tpot", "both") and tpot <= TPOT_P90_S or check == "ttft")
    if not ok(lo):
        return 0.0
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(Path(tmp) / "config.json")
        Path(model_path).write_text(json.dumps(LLAMA2_13B))
        p = {"name": "p", "gpu": "a100", "role": "prefill"}
        d = {"name": "d", "gpu": "a100", "role": "decode"}
        rows = {
            "colocated": max_rate(model_path, None, "both", args.requests),
            "prefill worker": max_rate(model_path, [p, {**d, "num_replicas": 3}], "ttft",
                                       args.requests),
            "decode worker": max_rate(model_path, [{**p, "num_replicas": 3}, d], "tpot",
                                      args.requests),
            "2P1D (per GPU)": max_rate(model_path, [{**p, "num_replicas": 2}, d], "both",
                                       args.requests) / 3,
        }
    gain_sim = rows["2P1D (per GPU)"] / rows["colocated"]
    gain_pub = PUBLISHED["2P1D (per GPU)"] / PUBLISHED["colocated"]
    if args.markdown:
        print("| setup | published (req/s, read off Fig. 6) | fleetsim (req/s) | error |")
        print("|---|---|---|---|")
        for k, v in rows.items():
            print(f"| {k} | {PUBLISHED[k]:.1f} | {v:.2f} | {100 * (v / PUBLISHED[k] - 1):+.0f}% |")
        print(f"| 2P1D / colocated, per GPU | {gain_pub:.2f}x | {gain_sim:.2f}x | "
              f"{100 * (gain_sim / gain_pub - 1):+.0f}% |")
        return
    print(f"{'setup':<18}{'published':>10}{'fleetsim':>10}{'error':>8}")
    for k, v in rows.items():
        print(f"{k:<18}{PUBLISHED[k]:>10.2f}{v:>10.2f}{100 * (v / PUBLISHED[k] - 1):>+7.0f}%")
    print(f"{'2P1D/colocated':<18}{gain_pub:>9.2f}x{gain_sim:>9.2f}x")


if __name__ == "__main__":
    main()
