"""The quantization axis of ``fleetsim plan``: each shape once per mode, as AIConfigurator
searches its ``gemm_quant_mode`` / ``kvcache_quant_mode`` alongside the parallel layout.

A mode is ``quantization``'s value (``fleetsim.models.quantization``): AIConfigurator's names
(``fp8``, ``fp8_block``, ``int4_wo``, ``nvfp4``, ...) or vLLM's method names, and ``bf16``
for the checkpoint's own dtype (the config's ``quantization = None``). A shape whose GPUs lack
the tensor cores a mode computes in (no FP8 on A100, FP4 on Blackwell only) is not searched:
it is dropped with a note naming the GPU and why, the same reason ``fleetsim run`` would give.
The KV-cache dtype stays the config's ``engine.kv_cache_dtype`` for every mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import ModelSpec
from fleetsim.models.quantization import quantize
from fleetsim.perf.breakdown import check_quantization
from fleetsim.search.plan import UNQUANTIZED, Shape

UNQUANTIZED_NAMES = ("bf16", "bfloat16", "auto", "none")
"""Names of the checkpoint's own dtype on the axis (``quantization = None``), all read as
``bf16``."""


def parse_quantization_axis(text: str, model: ModelSpec) -> list[str]:
    """``--quantization``'s comma-separated modes, in the order given, duplicates dropped;
    the names of ``UNQUANTIZED_NAMES`` read as ``bf16``. Unknown names and modes that cannot
    apply to ``model`` (an experts-only mode on a dense model) raise ``FleetsimInputError``
    naming the flag."""
    modes: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        mode = UNQUANTIZED if item.lower() in UNQUANTIZED_NAMES else item
        if mode != UNQUANTIZED:
            try:
                quantize(model, mode)
            except FleetsimInputError as err:
                fix = err.fix if "unknown mode" not in err.fix else (
                    err.fix.replace("use one of", "use bf16 or one of"))
                raise FleetsimInputError("--quantization", item, fix) from None
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise FleetsimInputError("--quantization", text,
                                 "give comma-separated modes, e.g. bf16,fp8")
    return modes


def with_quantization(shapes: Sequence[Shape], modes: Sequence[str], model: ModelSpec,
                      catalog: str | None = None) -> tuple[list[Shape], list[str]]:
    """Every shape once per mode its GPUs run (``parse_quantization_axis``'s modes), and one
    note per (mode, GPU) skipped."""
    out: list[Shape] = []
    notes: dict[tuple[str, str], str] = {}  # (mode, gpu) -> why it was skipped
    for mode in modes:
        quantized = quantize(model, None if mode == UNQUANTIZED else mode)
        for shape in shapes:
            missing = None
            for pool in shape.pools:
                try:
                    check_quantization(quantized, get_gpu(pool.gpu, catalog))
                except FleetsimInputError as err:
                    missing = (pool.gpu, err.fix)
                    break
            if missing is None:
                out.append(dataclasses.replace(shape, quantization=mode))
            else:
                notes.setdefault((mode, missing[0]), f"skipped {mode}: {missing[1]}")
    return out, list(notes.values())
