"""Per-kernel time functions for one (model, GPU, TP): measured table where one covers the
shape, roofline otherwise. Each returns seconds for ONE layer (or one call) on numpy grids, plus
the source label; ``step_model`` sums them over layers and precomputes lookup grids.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.models.quantization import BF16, QuantPart
from fleetsim.perf import roofline as rl
from fleetsim.perf.tables import Table, known_systems, load_table

ROOFLINE = "roofline"
F64 = NDArray[np.float64]


def _ideal_gemm_s(m: F64, n: float, k: float, peak: float, bw: float, wbytes: float) -> F64:
    return np.maximum(2.0 * m * n * k / peak, (k * n * wbytes + (m * k + m * n) * 2.0) / bw)


@functools.cache
def _gemm_ratio_grid(system: str, dtype: str, peak: float, bw: float, wbytes: float):
    """log(measured / ideal roofline) on the table's (m, n, k) grid, NaN-free."""
    table = load_table(
        system, "gemm", "vllm", "gemm_perf.parquet", ("m", "n", "k"), gemm_dtype=dtype
    )
    if table is None or len(table) == 0:
        return None
    c = table.columns
    ms, ns, ks = (np.unique(c[x]) for x in ("m", "n", "k"))
    lat = np.full(len(ms) * len(ns) * len(ks), np.inf)
    flat = (np.searchsorted(ms, c["m"]) * len(ns) + np.searchsorted(ns, c["n"])) * len(ks) + (
        np.searchsorted(ks, c["k"])
    )
    # several kernels per shape: vLLM picks the fastest, so keep each shape's minimum
    order = np.lexsort((c["latency_s"], flat))
    first = np.unique(flat[order], return_index=True)[1]
    lat[flat[order][first]] = c["latency_s"][order][first]
    grid = lat.reshape(len(ms), len(ns), len(ks))
    mm, nn, kk = np.meshgrid(ms.astype(float), ns.astype(float), ks.astype(float), indexing="ij")
    ratio = np.log(grid / _ideal_gemm_s(mm, nn, kk, peak, bw, wbytes))
    if not np.isfinite(ratio).all():  # sparse grids (fp8_block): nearest measured (n, k)
        ratio = _fill_unmeasured(ratio, np.log(ns), np.log(ks))
        keep = np.isfinite(ratio).all(axis=(1, 2))
        ms, ratio = ms[keep], ratio[keep]
    return ms.astype(float), np.log(ns), np.log(ks), ratio, table.label


def _fill_unmeasured(ratio: F64, lns: F64, lks: F64) -> F64:
    """``ratio[m]`` with each non-finite (n, k) cell set to the row's nearest finite one in
    (log n, log k); a row with no finite cell becomes all NaN. Returns a new array."""
    ratio = ratio.copy()
    ln, lk = np.meshgrid(lns, lks, indexing="ij")
    # the nearest measured cell depends only on which cells were measured, and most m rows
    # share one pattern: find it once per pattern (0.2 s per table when done for every row)
    nearest_by_pattern: dict[bytes, NDArray[np.intp]] = {}
    for i in range(ratio.shape[0]):
        ok = np.isfinite(ratio[i])
        if not ok.any():
            ratio[i] = np.nan
            continue
        nearest = nearest_by_pattern.get(ok.tobytes())
        if nearest is None:
            d = (ln[..., None] - ln[ok]) ** 2 + (lk[..., None] - lk[ok]) ** 2
            nearest = nearest_by_pattern[ok.tobytes()] = np.argmin(d, axis=-1)
        ratio[i] = ratio[i][ok][nearest]
    return ratio


def _bilinear(xs: F64, ys: F64, grid: F64, x: float, y: float) -> F64:
    """Interpolate ``grid[..., i, j]`` at (x, y), clamped to the grid's edges."""
    x, y = min(max(x, xs[0]), xs[-1]), min(max(y, ys[0]), ys[-1])
    i = min(int(np.searchsorted(xs, x, side="right")) - 1, len(xs) - 2)
    j = min(int(np.searchsorted(ys, y, side="right")) - 1, len(ys) - 2)
    fx, fy = (x - xs[i]) / (xs[i + 1] - xs[i]), (y - ys[j]) / (ys[j + 1] - ys[j])
    return (
        (1 - fx) * (1 - fy) * grid[..., i, j]
        + fx * (1 - fy) * grid[..., i + 1, j]
        + (1 - fx) * fy * grid[..., i, j + 1]
        + fx * fy * grid[..., i + 1, j + 1]
    )


def _interp_linear_tail(x: F64, xs: F64, ys: F64) -> F64:
    """np.interp, but past the last point grow proportionally to x (throughput-bound)."""
    out = np.interp(x, xs, ys)
    tail = x > xs[-1]
    out[tail] = ys[-1] * x[tail] / xs[-1]
    return out


def _fit_decode_attention(rows: Table, f: int) -> tuple[F64, F64, float] | None:
    """Fit ``t = a(b) + c * sum_kv`` to the generation-attention table (per layer).

    One slope c for all batch sizes: the seconds per cached token read, i.e. the bandwidth-bound
    regime, taken as the median of per-batch slopes over batches whose requests reach >= 1024
    tokens of KV (shorter ones are dominated by per-request cost, and their fitted slopes are
    meaningless). A single slope also makes adding a request never faster. Then a(b) is each
    batch's intercept under that slope (relative least squares), made non-decreasing in b.
    """
    per_batch = []
    for bt in np.unique(rows.columns["batch_size"]):
        if bt % f:
            continue
        sel = rows.where(batch_size=bt)
        kv_len = sel.columns["step"].astype(float) + 1.0  # isl 1 + tokens decoded so far
        if len(np.unique(kv_len)) >= 2:
            per_batch.append((bt // f, (bt // f) * kv_len, sel.columns["latency_s"]))
    slopes = []
    for b, total, lat in per_batch:
        if total.max() / b >= 1024:
            w = 1.0 / lat
            coef, *_ = np.linalg.lstsq(np.c_[w, total * w], np.ones_like(lat), rcond=None)
            slopes.append(coef[1])
    if not slopes or len(per_batch) < 2:
        return None
    c = max(float(np.median(slopes)), 0.0)
    bs = np.array([float(b) for b, _, _ in per_batch])
    a = np.array(
        [
            max(np.sum((lat - c * total) / lat**2) / np.sum(1.0 / lat**2), 1e-6)
            for _, total, lat in per_batch
        ]
    )
    return bs, np.maximum.accumulate(a), c


# vLLM's custom all-reduce handles messages up to 8 MiB (its default max_size); larger ones go
# through NCCL (PyNccl).
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024


def _interp_rows(rows: Table, msg: F64) -> F64:
    order = np.argsort(rows.columns["message_size"])
    xs = rows.columns["message_size"][order].astype(float)
    return _interp_linear_tail(msg, xs, rows.columns["latency_s"][order])


def _parts(model: ModelSpec) -> tuple[QuantPart, QuantPart]:
    """(dense layers, routed experts) of ``model`` as served. Without a quantization setting,
    the checkpoint's dtype prices both, as fleetsim always has: FP8 (block tables first, as
    DeepSeek-V3 ships) or BF16."""
    if model.quantization is not None:
        return model.quantization.dense, model.quantization.experts
    if model.weight_dtype_bytes == 1:
        part = QuantPart(8, "fp8", ("fp8_block", "fp8"))
        return part, part
    return BF16, BF16


def _roofline_tag(part: QuantPart) -> str:
    """What a roofline prices: the mode's bytes and compute format (no table measures it)."""
    if part == BF16:
        return ""
    return f"{part.weight_bits:g}-bit weights, {part.compute} compute"


class OpTimes:
    """Kernel-time functions for one model on one GPU at one TP degree."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, use_tables: bool) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        self.system = gpu.aic_system if use_tables else None
        systems = known_systems() if self.system else None
        if systems is not None and self.system not in systems:  # a typo must not fall back
            raise FleetsimInputError(
                f"gpu {gpu.name}: aic_system", self.system,
                f"no measured tables of that name (known: {', '.join(systems)}); fix it, or "
                f"leave it unset for the roofline model")
        self.dense, self.experts = _parts(model)
        self.peak_flops = gpu.peak_flops(self.dense.compute)
        # Attention computes in FP8 when the cache is FP8 and the GPU has FP8 units (vLLM's
        # FlashAttention-3 path quantizes the queries too: docs/features/quantization/
        # quantized_kvcache.md); a checkpoint without a quantization setting keeps its old
        # pricing (its weights' format) so default results do not move.
        if model.kv_dtype_bytes == 1 and "fp8" in gpu.compute_formats:
            self.attn_peak_flops = gpu.peak_flops("fp8")
        elif model.quantization is None:
            self.attn_peak_flops = self.peak_flops
        else:
            self.attn_peak_flops = gpu.peak_bf16_flops
        self.kv_cache_dtype = "fp8" if model.kv_dtype_bytes == 1 else "bfloat16"
        self.heads = -(-model.num_attention_heads // tp)
        self.kv_heads = -(-model.num_kv_heads // tp)
        self.sources: dict[str, set[str]] = {}

    def _note(self, op: str, label: str, mode: str = "") -> None:
        """Record where ``op``'s numbers come from; ``mode`` names a non-BF16 format priced
        (left out for unquantized checkpoints, whose sources read as they always have)."""
        if mode and (self.model.quantization is not None or self.kv_cache_dtype != "bfloat16"):
            label = f"{label} ({mode})"
        self.sources.setdefault(op, set()).add(label)

    # ---- GEMM ----
    def gemm_s(self, m: F64, n: int, k: int, part: QuantPart | None = None) -> F64:
        """(m x k) @ (k x n) for every m in the array; m == 0 costs 0. ``part``: how the
        weights are stored and computed (default: the model's dense layers)."""
        part = self.dense if part is None else part
        dtypes, wbytes = part.tables, part.weight_bytes
        peak = self.gpu.peak_flops(part.compute)
        bw = self.gpu.hbm_bw_bytes_per_s
        grid = None
        for dtype in dtypes if self.system else ():
            grid = _gemm_ratio_grid(self.system, dtype, peak, bw, wbytes)
            if grid is not None:
                break
        if grid is None:
            self._note("gemm", ROOFLINE, _roofline_tag(part))
            out = np.array([rl.gemm_s(x, n, k, peak, bw, wbytes) for x in m])
            return np.where(m > 0, out, 0.0)
        ms, lns, lks, ratio, label = grid
        self._note("gemm", "measured: " + label, dtype)
        t_at_ms = np.exp(_bilinear(lns, lks, ratio, np.log(n), np.log(k))) * _ideal_gemm_s(
            ms, n, k, peak, bw, wbytes
        )
        return np.where(m > 0, _interp_linear_tail(m, ms, t_at_ms), 0.0)

    # ---- attention ----
    def _attn_rows(self, filename: str) -> tuple[Table, int] | None:
        """Rows for this layer's (heads, kv_heads, head_dim), and the batch factor f that maps
        our batch b onto table batch f*b when only a 1/f-sized head group was measured."""
        if self.system is None or self.model.uses_mla:
            return None
        cols = ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim")
        table = load_table(
            self.system,
            "attention",
            "vllm",
            filename,
            cols,
            kv_cache_dtype=self.kv_cache_dtype,
            window_size=0,
        )
        if table is None:  # older tables (A100, vLLM 0.14) have no sliding-window column
            table = load_table(
                self.system, "attention", "vllm", filename, cols,
                kv_cache_dtype=self.kv_cache_dtype,
            )
        if table is None or len(table) == 0:  # e.g. no FP8-cache rows: roofline
            return None
        for f in (1, 2, 4, 8, 16):
            if self.heads % f or self.kv_heads % f:
                break
            rows = table.where(
                num_heads=self.heads // f,
                num_key_value_heads=self.kv_heads // f,
                head_dim=self.model.head_dim,
            )
            if len(rows):
                return rows, f
        return None

    def prefill_attention_s(self, s: F64) -> F64:
        """One causal full prefill of ``s`` tokens (batch 1), per layer."""
        found = self._attn_rows("context_attention_perf.parquet")
        m = self.model
        if found is not None:
            rows, f = found
            rows = rows.where(batch_size=f)
            if len(rows) >= 2:
                self._note("attention", "measured: " + rows.label, self._kv_tag)
                isl = np.unique(rows.columns["isl"]).astype(float)
                lat = np.array(
                    [rows.columns["latency_s"][rows.columns["isl"] == x].min() for x in isl]
                )
                # log-log interpolation: the curve is ~quadratic between the table's points
                out = np.exp(np.interp(np.log(np.maximum(s, 1.0)), np.log(isl), np.log(lat)))
                tail = s > isl[-1]
                out[tail] = lat[-1] * (s[tail] / isl[-1]) ** 2
                return out
        self._note("attention", ROOFLINE, self._kv_tag)
        if m.uses_mla:
            flops = 2.0 * s * s / 2 * self.heads * (m.head_dim + m.v_head_dim)
        else:
            flops = 4.0 * s * s / 2 * self.heads * m.head_dim
        kv = s * self.kv_bytes_per_token_layer
        return np.array(
            [
                rl.attention_s(a, b, self.attn_peak_flops, self.gpu.hbm_bw_bytes_per_s)
                for a, b in zip(flops, kv, strict=True)
            ]
        )

    @property
    def _kv_tag(self) -> str:
        return "kv fp8" if self.kv_cache_dtype == "fp8" else ""

    @property
    def kv_bytes_per_token_layer(self) -> float:
        return self.model.kv_bytes_per_token_per_gpu(self.tp) / self.model.num_layers

    def kv_read_s_per_token(self) -> float:
        """Seconds per cached token read by attention, per layer (bandwidth bound)."""
        return self.kv_bytes_per_token_layer / (self.gpu.hbm_bw_bytes_per_s * rl.ATTN_MEMORY_EFF)

    def decode_attention_fit(self, batches: F64) -> tuple[F64, F64]:
        """Per layer ``t = a(b) + c(b) * sum_kv`` for decode batches of size b (b >= 1)."""
        found = self._attn_rows("generation_attention_perf.parquet")
        if found is not None:
            fit = _fit_decode_attention(*found)
            if fit is not None:
                self._note("attention", "measured: " + found[0].label, self._kv_tag)
                bsa, a, c = fit
                a_out = np.interp(batches, bsa, a)
                tail = batches > bsa[-1]
                a_out[tail] = a[-1] * batches[tail] / bsa[-1]
                return a_out, np.full_like(batches, c)
        self._note("attention", ROOFLINE, self._kv_tag)
        m = self.model
        if m.uses_mla:  # absorbed MLA decode: each head attends over the 576-wide latent
            flops_per_tok = 2.0 * self.heads * (m.kv_lora_rank * 2 + m.qk_rope_head_dim)
        else:
            flops_per_tok = 4.0 * self.heads * m.head_dim
        c_val = max(
            flops_per_tok / (self.attn_peak_flops * rl.ATTN_COMPUTE_EFF),
            self.kv_read_s_per_token(),
        )
        return np.full_like(batches, rl.KERNEL_FLOOR_S), np.full_like(batches, c_val)

    # ---- MoE ----
    def moe_s(self, tokens: F64) -> F64:
        """Routed experts of one MoE layer for ``tokens`` tokens entering it (TP-sharded)."""
        m, part = self.model, self.experts
        for dtype in part.tables:
            table = (
                load_table(
                    self.system,
                    "moe",
                    "vllm",
                    "moe_perf.parquet",
                    ("num_tokens", "distribution"),
                    moe_dtype=dtype,
                    hidden_size=m.hidden_size,
                    inter_size=m.moe_intermediate_size,
                    topk=m.num_experts_per_token,
                    num_experts=m.num_experts,
                    moe_tp_size=self.tp,
                    moe_ep_size=1,
                )
                if self.system
                else None
            )
            if table is None or len(table) == 0:
                continue
            # power_law_1.01: aiconfigurator's skewed routing, closer to real traffic than
            # perfectly balanced
            dist = table.columns["distribution"]
            rows = table.where(
                distribution="power_law_1.01" if (dist == "power_law_1.01").any() else dist[0]
            )
            nt = np.unique(rows.columns["num_tokens"]).astype(float)
            lat = np.array(
                [rows.columns["latency_s"][rows.columns["num_tokens"] == x].min() for x in nt]
            )
            self._note("moe", "measured: " + rows.label, dtype)
            return np.where(tokens > 0, _interp_linear_tail(tokens, nt, lat), 0.0)
        self._note("moe", ROOFLINE, _roofline_tag(part))
        inter = -(-m.moe_intermediate_size // self.tp)
        per_expert_bytes = 3.0 * m.hidden_size * inter * part.weight_bytes
        routed = tokens * m.num_experts_per_token
        touched = np.minimum(float(m.num_experts), routed)  # experts that receive any token
        flops = 2.0 * routed * 3 * m.hidden_size * inter
        bytes_moved = touched * per_expert_bytes + routed * m.hidden_size * 2 * 2
        out = np.array(
            [
                rl.grouped_gemm_s(a, b, self.gpu.peak_flops(part.compute),
                                  self.gpu.hbm_bw_bytes_per_s)
                for a, b in zip(flops, bytes_moved, strict=True)
            ]
        )
        return np.where(tokens > 0, out, 0.0)

    # ---- communication ----
    def allreduce_s(self, tokens: F64) -> F64:
        """One TP all-reduce of the hidden state of ``tokens`` tokens (bf16)."""
        if self.tp == 1:
            return np.zeros_like(tokens)
        msg = tokens * self.model.hidden_size * 2.0
        table = (
            load_table(
                self.system,
                "comm",
                "vllm",
                "custom_allreduce_perf.parquet",
                ("message_size", "backend"),
                num_gpus=self.tp,
            )
            if self.system
            else None
        )
        if table is not None and len(table):
            self._note("communication", "measured: " + table.label)
            out = np.zeros_like(tokens)
            # vLLM replays CUDA graphs for batches up to 512 tokens (default capture sizes)
            for backend, sel in (("vllm_graph", tokens <= 512), ("vllm_eager", tokens > 512)):
                out[sel] = _interp_rows(table.where(backend=backend), msg[sel])
            nccl = load_table(
                self.system,
                "comm",
                "nccl",
                "nccl_perf.parquet",
                ("message_size",),
                op_name="all_reduce",
                nccl_dtype="half",
                num_gpus=self.tp,
            )
            big = msg > CUSTOM_ALLREDUCE_MAX_BYTES
            if nccl is not None and len(nccl) and big.any():
                self._note("communication", "measured: " + nccl.label)
                out[big] = _interp_rows(nccl, msg[big])
            return np.where(tokens > 0, out, 0.0)
        self._note("communication", ROOFLINE)
        out = np.array([rl.allreduce_s(x, self.tp, self.gpu.nvlink_bw_bytes_per_s) for x in msg])
        return np.where(tokens > 0, out, 0.0)
