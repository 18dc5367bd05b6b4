"""A plan in AIConfigurator's terms: output tokens/s per GPU against tokens/s per user, what a
GPU budget or a target request rate implies, and the ``vllm serve`` lines that deploy a shape.

AIConfigurator (NVIDIA, github.com/ai-dynamo/aiconfigurator) ranks deployments by
``tokens/s/gpu`` (throughput per GPU) against ``tokens/s/user`` (one user's generation speed,
1 / TPOT) under TTFT and TPOT limits, for a ``--total_gpus`` budget. fleetsim measures both
at each shape's goodput (the highest rate meeting the SLO target): tokens/s/GPU is that rate's
output tokens per second divided by the shape's GPUs; tokens/s/user is 1 / its mean TPOT.
A GPU budget holds ``total // shape GPUs`` copies of a shape behind a load balancer; a target
rate needs ``ceil(rate / goodput)`` copies. Both assume copies share load evenly.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from fleetsim.config import PoolConfig, SimConfig
from fleetsim.models.catalog import HF_IDS
from fleetsim.models.speculative import vllm_speculative_json


def hf_repo_id(model: str) -> str:
    """The Hugging Face id ``vllm serve`` takes for ``model`` (a catalog name, an id or a
    config.json path, returned as is when no id is known)."""
    if "/" in model and not model.endswith(".json"):
        return model
    key = model.lower()
    for repo, name in HF_IDS.items():  # the first id of each model is its canonical one
        if name.lower() == key:
            return repo
    return model


def vllm_serve_commands(config: SimConfig, pools: Sequence[PoolConfig]) -> list[str]:
    """One ``vllm serve`` line per pool, with the engine limits of ``config``: TP, PP, replicas as
    ``--data-parallel-size``, and for prefill/decode pools a NIXL KV connector (vLLM's
    disaggregated prefill also needs its proxy in front, not shown)."""
    eng = config.engine
    args = dict(config.policy.batching.args)
    lines = []
    for pool in pools:
        cmd = ["vllm", "serve", hf_repo_id(config.model),
               "--tensor-parallel-size", str(pool.tp)]
        if pool.pp > 1:
            cmd += ["--pipeline-parallel-size", str(pool.pp)]
        if pool.dp_attention > 1:
            # one wide-EP replica per command (across nodes: vLLM's --data-parallel-size-local
            # and --data-parallel-address on each node; SGLang: --enable-dp-attention --dp-size
            # N --moe-a2a-backend deepep)
            cmd += ["--data-parallel-size", str(pool.dp_attention), "--enable-expert-parallel"]
        elif pool.num_replicas > 1:
            cmd += ["--data-parallel-size", str(pool.num_replicas)]
        cmd += ["--max-num-seqs", str(eng.max_running),
                "--max-num-batched-tokens", str(eng.max_batched_tokens),
                "--gpu-memory-utilization", f"{eng.gpu_memory_utilization:g}",
                "--block-size", str(eng.block_size)]
        if config.quantization is not None:
            cmd += ["--quantization", _vllm_quantization(config.quantization)]
        if eng.kv_cache_dtype != "auto":
            cmd += ["--kv-cache-dtype", eng.kv_cache_dtype]
        if eng.speculative is not None:
            cmd += ["--speculative-config", vllm_speculative_json(eng.speculative)]
        if not eng.enable_prefix_caching:
            cmd.append("--no-enable-prefix-caching")
        if args.get("enable_chunked_prefill") is False:
            cmd.append("--no-enable-chunked-prefill")
        # vLLM >= 0.14 schedules asynchronously unless told not to; deploy what was simulated.
        cmd.append("--async-scheduling" if eng.async_scheduling else "--no-async-scheduling")
        if pool.role != "mixed":
            cmd += ["--kv-transfer-config",
                    json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                               separators=(",", ":"))]
        line = shlex.join(cmd)
        lines.append(line if pool.role == "mixed" else f"# {pool.role}: {line}")
    return lines


# AIConfigurator's mode names that are not vLLM --quantization methods, mapped to the method
# that serves such a checkpoint (vLLM's model_executor/layers/quantization/ registry); vLLM
# reads DeepSeek's block-wise fp8 from the checkpoint as "fp8", ModelOpt checkpoints as
# "modelopt"/"modelopt_fp4", AWQ/GPTQ int4 as "awq".
_VLLM_METHOD = {"fp8_block": "fp8", "fp8_static": "modelopt", "nvfp4": "modelopt_fp4",
                "int4_wo": "awq", "w4a16_mxfp4": "mxfp4"}


def _vllm_quantization(name: str) -> str:
    """The ``--quantization`` value vLLM takes for fleetsim's mode ``name``; modes vLLM has no
    method of its own for (int8_wo, sq, w4afp8) are passed as given, for the reader to map."""
    return _VLLM_METHOD.get(name, name)


def deployment_row(row: Mapping[str, Any], output_tokens_per_request: float,
                   tpot_mean_s: float | None, total_gpus: int | None,
                   target_rate_per_s: float | None) -> dict[str, Any]:
    """AIConfigurator's numbers for one feasible plan row (its goodput and GPUs)."""
    rate = row["goodput_requests_per_s"] or 0.0
    gpus = row["num_gpus"]
    out: dict[str, Any] = {
        "output_tokens_per_s_per_gpu": rate * output_tokens_per_request / gpus,
        "tokens_per_s_per_user": 1.0 / tpot_mean_s if tpot_mean_s else None,
    }
    if total_gpus is not None:
        copies = total_gpus // gpus
        out["copies_in_total_gpus"] = copies
        out["total_goodput_requests_per_s"] = copies * rate
    if target_rate_per_s is not None:
        copies = math.ceil(target_rate_per_s / rate) if rate > 0 else None
        out["copies_for_target_rate"] = copies
        out["gpus_for_target_rate"] = None if copies is None else copies * gpus
        if total_gpus is not None:
            out["target_rate_fits_total_gpus"] = (copies is not None
                                                  and copies * gpus <= total_gpus)
    return out


def per_user_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (tokens/s/user, tokens/s/GPU) points no other point beats in both
    (higher is better in both), sorted by tokens/s/user; AIConfigurator's Pareto front."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1], i))
    front: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return sorted(front, key=lambda i: (points[i][0], i))
