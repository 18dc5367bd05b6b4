"""Expert loads recorded by serving engines, as (num_steps, num_layers, num_experts) arrays.

- SGLang's expert distribution recorder (``/dump_expert_distribution_record``): in ``stat``
  mode it saves ``{"logical_count": (buffer_steps, num_layers, num_logical_experts), ...}``;
  in ``per_token`` mode a list of ``records`` with ``global_physical_count`` (num_layers,
  num_physical_experts) and ``last_physical_to_logical_map``.
- vLLM's EPLB state: ``expert_load_window`` (window_size, num_moe_layers,
  num_physical_experts) with ``physical_to_logical_map`` (num_moe_layers, num_physical_experts).

Files may be ``.json``, ``.npz`` (same keys), ``.npy`` (the logical count array itself), or
the engines' own ``.pt`` (needs torch, which fleetsim does not require).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_json

FloatArray = NDArray[np.float64]


def _read(source: object, where: str) -> Any:
    if not isinstance(source, str | Path):
        return source
    path = Path(source)
    if not path.is_file():
        raise FleetsimInputError(where, str(path), "no such file")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return read_json(path, where)
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise FleetsimInputError(where, str(path), f"not a readable numpy file ({err})") from None
    if suffix == ".pt":
        try:
            import torch
        except ImportError:
            raise FleetsimInputError(
                where,
                str(path),
                "reading .pt needs torch; convert it once with torch.load(...) and np.savez "
                "(same keys) or save the count array as .npy",
            ) from None
        return torch.load(path, map_location="cpu", weights_only=False)
    raise FleetsimInputError(where, str(path), "expected a .json, .npz, .npy or .pt file")


def _array(value: object, where: str, ndim: tuple[int, ...]) -> FloatArray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()  # type: ignore[union-attr]
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise FleetsimInputError(where, type(value).__name__, "expected a numeric array") from None
    if arr.ndim not in ndim:
        raise FleetsimInputError(
            where, f"shape {arr.shape}", f"expected {' or '.join(map(str, ndim))} dims"
        )
    if not np.isfinite(arr).all():
        raise FleetsimInputError(where, "NaN or inf entries", "counts must be finite")
    if (arr < 0).any():
        raise FleetsimInputError(where, float(arr.min()), "counts must be >= 0")
    return arr


def physical_to_logical(
    physical_count: FloatArray, phy2log: object, num_experts: int | None, where: str
) -> FloatArray:
    """Sum (steps, layers, physical slots) counts into logical experts via ``phy2log``."""
    mapping = _array(phy2log, f"{where}.physical_to_logical_map", (2,)).astype(np.int64)
    if mapping.shape != physical_count.shape[1:]:
        raise FleetsimInputError(
            f"{where}.physical_to_logical_map",
            f"shape {mapping.shape}",
            f"must match (layers, physical experts) of the counts {physical_count.shape[1:]}",
        )
    num_experts = num_experts or int(mapping.max()) + 1
    num_steps, num_layers, _ = physical_count.shape
    out = np.zeros((num_steps, num_layers, num_experts))
    layer = np.broadcast_to(np.arange(num_layers)[:, None], mapping.shape)
    for step in range(num_steps):
        np.add.at(out[step], (layer, mapping), physical_count[step])
    return out


def load_sglang_dump(source: object, num_experts: int | None = None) -> FloatArray:
    """Logical expert loads from an SGLang expert-distribution dump (path, dict or array)."""
    data = _read(source, "sglang_dump")
    if isinstance(data, Mapping) and "logical_count" in data:
        arr = _array(data["logical_count"], "sglang_dump.logical_count", (2, 3))
        return arr[None] if arr.ndim == 2 else arr
    if isinstance(data, Mapping) and "records" in data:
        records = data["records"]
        if not records:
            raise FleetsimInputError("sglang_dump.records", [], "the dump holds no records")
        counts = np.stack(
            [
                _array(
                    r["global_physical_count"], "sglang_dump.records[].global_physical_count", (2,)
                )
                for r in records
            ]
        )
        return physical_to_logical(
            counts, data.get("last_physical_to_logical_map"), num_experts, "sglang_dump"
        )
    if isinstance(data, Mapping):
        raise FleetsimInputError(
            "sglang_dump", sorted(map(str, data)), "expected a 'logical_count' or 'records' key"
        )
    arr = _array(data, "sglang_dump", (2, 3))
    return arr[None] if arr.ndim == 2 else arr


def load_vllm_window(
    source: object, physical_to_logical_map: object = None, num_experts: int | None = None
) -> FloatArray:
    """Logical expert loads from vLLM's EPLB load window.

    source: a path or mapping with ``expert_load_window`` and ``physical_to_logical_map``,
    or the window array itself with ``physical_to_logical_map`` given separately.
    """
    data = _read(source, "vllm_window")
    if isinstance(data, Mapping):
        if "expert_load_window" not in data:
            raise FleetsimInputError(
                "vllm_window", sorted(map(str, data)), "expected an 'expert_load_window' key"
            )
        window = data["expert_load_window"]
        physical_to_logical_map = data.get("physical_to_logical_map", physical_to_logical_map)
    else:
        window = data
    counts = _array(window, "vllm_window.expert_load_window", (3,))
    if physical_to_logical_map is None:
        raise FleetsimInputError(
            "physical_to_logical_map", None, "pass the EPLB map that the window was recorded with"
        )
    return physical_to_logical(counts, physical_to_logical_map, num_experts, "vllm_window")
