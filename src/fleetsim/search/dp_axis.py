"""The wide-EP axis of ``fleetsim plan``: replicas of ``dp`` attention ranks of ``tp`` GPUs each
with the routed experts over all ``dp x tp`` GPUs (``hardware.dp_attention``,
``moe/wide_ep.py``), searched next to the plain ``tp`` layouts, as AIConfigurator searches
``attention_dp_size`` and ``moe_ep_size`` alongside TP for DeepSeek-V3.

The axis is ``--dp-attention``'s values, or, when the flag is absent, the config's own
``dp_attention`` (so a config written for ``fleetsim run`` plans its own layout). Before any
search, a wide-EP shape ``fleetsim run`` would refuse is dropped with a note, once per reason:
the EP group does not fill whole nodes or split the experts (``check_dp_attention``), or the
weights leave no KV memory (``wide_ep_kv_capacity_blocks``, with the shape's quantization).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetsim.config import SimConfig
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import ModelSpec, get_model
from fleetsim.models.quantization import quantize
from fleetsim.moe.wide_ep import check_dp_attention, wide_ep_kv_capacity_blocks
from fleetsim.search.plan import UNQUANTIZED, Shape


def parse_dp_attention_axis(text: str | None, config: SimConfig) -> list[int]:
    """``--dp-attention``'s comma-separated ranks per replica (sorted, duplicates dropped; 1:
    the plain layouts), or without the flag the config's own ``dp_attention``. Values other
    than 1 for a dense model raise ``FleetsimInputError`` naming the flag."""
    if text is None:
        return [max(p.dp_attention for p in config.pools)]
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise FleetsimInputError("--dp-attention", text,
                                 "give comma-separated integers, e.g. 1,8,16") from None
    if not values or values[0] < 1:
        raise FleetsimInputError("--dp-attention", text,
                                 "give comma-separated integers >= 1, e.g. 1,8,16")
    model = get_model(config.model)
    if values != [1] and not model.is_moe:
        raise FleetsimInputError("--dp-attention", text, f"{model.name} is dense: attention "
                                 "data parallelism with expert parallelism needs a MoE model; "
                                 "drop the flag (replicas are already searched)")
    return values


def servable_wide_ep(shapes: Sequence[Shape], config: SimConfig) -> tuple[list[Shape], list[str]]:
    """``shapes`` less the wide-EP ones ``fleetsim run`` would refuse, and one note per reason
    (``skipped dp16 tp1 on H100-SXM: ...``). Shapes without dp_attention pass as they are."""
    eng = config.engine
    spare = config.hardware.ep.num_spare_slots_per_gpu if config.hardware.ep else 0
    base = get_model(config.model)
    models: dict[str | None, ModelSpec] = {}  # quantization mode -> the model served in it
    out: list[Shape] = []
    notes: dict[str, None] = {}  # ordered set
    for shape in shapes:
        reason = None
        for pool in shape.pools:
            if pool.dp_attention == 1:
                continue
            mode = config.quantization if shape.quantization is None else (
                None if shape.quantization == UNQUANTIZED else shape.quantization)
            if mode not in models:
                models[mode] = quantize(base, mode, eng.kv_cache_dtype)
            gpu = get_gpu(pool.gpu, config.hardware.catalog)
            try:
                check_dp_attention(models[mode], gpu, pool.tp, pool.dp_attention)
                if eng.num_kv_blocks is None:  # a fixed KV size skips the fit, as in run()
                    wide_ep_kv_capacity_blocks(
                        models[mode], gpu, pool.tp, pool.dp_attention, eng.block_size,
                        eng.gpu_memory_utilization, max_batched_tokens=eng.max_batched_tokens,
                        num_spare_slots_per_gpu=spare)
            except FleetsimInputError as err:
                tail = "" if shape.quantization is None else f" {shape.quantization}"
                reason = (f"skipped dp{pool.dp_attention} tp{pool.tp}{tail} on {gpu.name}: "
                          f"{err.fix}")
                break
        if reason is None:
            out.append(shape)
        else:
            notes[reason] = None
    return out, list(notes)
