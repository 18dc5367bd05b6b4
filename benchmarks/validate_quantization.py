"""Compare fleetsim's quantized step model against published FP8 vs FP16 vLLM measurements.

Source: LLM-Inference-Bench (Chitty-Venkata et al., SC'24 workshops, arXiv:2411.00136), Fig. 3,
raw results in github.com/argonne-lcf/LLM-Inference-Bench ``Plots/Fig_3/
A100_H100_quant_all_results.csv`` (commit 691ffab): vLLM (2024, V0 engine), Meta-Llama-3-8B
on one H100 or A100, an offline batch of B requests of L input and L output tokens, whole-batch
latency in seconds, for "Weight = fp16, KV Cache = fp16", "Weight = fp16, KV Cache = fp8" and
(H100) "Weight = fp8, KV Cache = fp8". The numbers below are copied verbatim.

Each row is predicted exactly as ``validate_perf.py`` predicts that paper's other vLLM rows
(V0 prefill packing, L - 1 decode steps, Vidur's V0 CPU profile), with ``quantization = "fp8"``
and/or ``engine.kv_cache_dtype = "fp8"`` set as the row says. Nothing is fitted to these
points. Besides each latency's error, the table gives the FP8 speedup (FP16 latency / FP8
latency) measured and predicted: the number a user asks fleetsim for.

Run: ``python benchmarks/validate_quantization.py [--write-docs]``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
from validate_perf import L3_8B, SRC_BATCH, Point

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.perf import build_step_model
from fleetsim.perf.cpu_overhead import vllm_v0_overhead

SRC = ("LLM-Inference-Bench Fig. 3 (github.com/argonne-lcf/LLM-Inference-Bench, "
       "Plots/Fig_3/A100_H100_quant_all_results.csv @691ffab)")
FP16, FP8_KV, FP8 = "fp16 / fp16 KV", "fp16 / fp8 KV", "fp8 / fp8 KV"
SETTINGS = {FP16: (None, "auto"), FP8_KV: (None, "fp8"), FP8: ("fp8", "fp8")}

# (gpu, weights / KV, L, batch, latency_s), verbatim from the CSV (vLLM rows, Meta-Llama-3-8B,
# tp 1). L in {128, 1024, 2048} and batch in {1, 16, 64}: the corners and middle of its grid.
ROWS = [
    ("H100", FP16, 128, 1, 1.010333460289985),
    ("H100", FP16, 1024, 1, 8.197732408065349),
    ("H100", FP16, 2048, 1, 16.666050790809095),
    ("H100", FP16, 128, 16, 1.1884269518777728),
    ("H100", FP16, 1024, 16, 11.196044038049877),
    ("H100", FP16, 2048, 16, 25.940946077927947),
    ("H100", FP16, 128, 64, 1.8078341940417886),
    ("H100", FP16, 1024, 64, 19.312098698690534),
    ("H100", FP16, 2048, 64, 50.99662512680516),
    ("H100", FP8_KV, 128, 1, 0.9973997483029962),
    ("H100", FP8_KV, 1024, 1, 8.367716738022864),
    ("H100", FP8_KV, 2048, 1, 16.961227899882942),
    ("H100", FP8_KV, 128, 16, 1.1969947698526084),
    ("H100", FP8_KV, 1024, 16, 11.884978183079511),
    ("H100", FP8_KV, 2048, 16, 28.314875633921474),
    ("H100", FP8_KV, 128, 64, 1.7918249820359051),
    ("H100", FP8_KV, 1024, 64, 23.043681737035513),
    ("H100", FP8_KV, 2048, 64, 65.51213897718117),
    ("H100", FP8, 128, 1, 0.7699878138955683),
    ("H100", FP8, 1024, 1, 6.144760839175433),
    ("H100", FP8, 2048, 1, 12.414477087091655),
    ("H100", FP8, 128, 16, 0.9049272441770881),
    ("H100", FP8, 1024, 16, 8.905026635853574),
    ("H100", FP8, 2048, 16, 21.628968250006437),
    ("H100", FP8, 128, 64, 1.4434360191226006),
    ("H100", FP8, 1024, 64, 16.766064875992015),
    ("H100", FP8, 2048, 64, 45.70058059808798),
    # A100: no FP8 units; the 2024 FP8 cache there dequantized in a slow path (see docs)
    ("A100", FP16, 1024, 16, 19.82253386825323),
    ("A100", FP8_KV, 1024, 16, 52.34908778592944),
    ("A100", FP16, 1024, 64, 35.98174176923931),
    ("A100", FP8_KV, 1024, 64, 168.10905429907143),
]


def predict_s(gpu: str, setting: str, length: int, batch: int) -> float:
    """The offline batch as vLLM V0 ran it (validate_perf.predict_offline_batch_s), with the
    row's weights and KV cache."""
    quantization, kv = SETTINGS[setting]
    hf, name, max_model_len = L3_8B
    model = quantize(get_model(name), quantization, kv)
    fixed_s, per_seq_s = vllm_v0_overhead(1)
    sm = build_step_model(model, get_gpu(gpu), 1, step_overhead_s=fixed_s,
                          step_overhead_per_seq_s=per_seq_s)
    p = Point(SRC_BATCH, name, hf, gpu, 1, batch, length, length, max_model_len, 0.0)
    per_step = max(1, max(p.max_model_len, 2048) // p.input_tokens)
    total = 0.0
    for first in range(0, p.batch, per_step):
        n = min(per_step, p.batch - first)
        total += sm.step_time_s([(p.input_tokens, 0)] * n, 0, 0)
    kv_tokens = p.batch * (p.input_tokens + np.arange(p.output_tokens - 1, dtype=np.int64))
    return total + float(sm.decode_step_times_s(p.batch, kv_tokens).sum())


def run() -> list[dict]:
    rows = []
    measured = {(g, s, L, b): t for g, s, L, b, t in ROWS}
    for g, s, L, b, t in ROWS:
        pred = predict_s(g, s, L, b)
        row = {"gpu": g, "setting": s, "L": L, "batch": b, "measured_s": t,
               "predicted_s": pred, "error_pct": 100 * (pred - t) / t}
        base = measured.get((g, FP16, L, b))
        if s != FP16 and base is not None:
            row["speedup_measured"] = base / t
            row["speedup_predicted"] = predict_s(g, FP16, L, b) / pred
        rows.append(row)
    return rows


def _mape(rows: list[dict], key: str = "error_pct") -> float:
    return float(np.mean([abs(r[key]) for r in rows]))


def markdown(rows: list[dict]) -> str:
    lines = ["| GPU | weights / KV cache | batch x L in / L out | measured s | predicted s "
             "| error % | FP8 speedup measured | predicted |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        sm, sp = r.get("speedup_measured"), r.get("speedup_predicted")
        lines.append(
            f"| {r['gpu']} | {r['setting']} | {r['batch']} x {r['L']} | {r['measured_s']:.3f} "
            f"| {r['predicted_s']:.3f} | {r['error_pct']:+.1f} | "
            f"{'' if sm is None else f'{sm:.2f}x'} | {'' if sp is None else f'{sp:.2f}x'} |")
    for g, s in (("H100", FP16), ("H100", FP8_KV), ("H100", FP8)):
        sub = [r for r in rows if r["gpu"] == g and r["setting"] == s]
        lines.append(f"| **MAPE** | {g} {s} | {len(sub)} points | | | **{_mape(sub):.1f}%** "
                     f"| | |")
    fp8 = [r for r in rows if r["gpu"] == "H100" and r["setting"] == FP8]
    err = [100 * (r["speedup_predicted"] - r["speedup_measured"]) / r["speedup_measured"]
           for r in fp8]
    lines.append(f"| **FP8 speedup error** | H100 {FP8} vs {FP16} | {len(fp8)} points | | | | "
                 f"mean abs {np.mean(np.abs(err)):.1f}% | signed {np.mean(err):+.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite the quantization table in docs/validation.md")
    args = parser.parse_args()
    table = markdown(run())
    print(table)
    if args.write_docs:
        path = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
        text = path.read_text()
        new = re.sub(r"<!-- quant-table-start -->.*<!-- quant-table-end -->",
                     lambda _: f"<!-- quant-table-start -->\n{table}\n<!-- quant-table-end -->",
                     text, flags=re.S)
        path.write_text(new)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
