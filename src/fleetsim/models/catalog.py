"""Built-in model catalog (values from each model's Hugging Face config.json) and a loader
for any Hugging Face ``config.json`` in llama / qwen2 / mixtral / qwen3_moe / deepseek_v3 style.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number, read_json
from fleetsim.models.quantization import quantize
from fleetsim.models.spec import ModelSpec

_BUILTIN: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-3.1-8B config.json
    ModelSpec(
        name="Llama-3.1-8B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_context_tokens=131072,
    ),
    # meta-llama/Llama-3.1-70B config.json
    ModelSpec(
        name="Llama-3.1-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        max_context_tokens=131072,
    ),
    # meta-llama/Llama-3.1-405B config.json (126 layers: more than one 8-GPU node holds in
    # bf16, so it is served with tp=8 x pp=2 over two nodes, or in fp8 on one)
    ModelSpec(
        name="Llama-3.1-405B",
        num_layers=126,
        hidden_size=16384,
        num_attention_heads=128,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=53248,
        vocab_size=128256,
        max_context_tokens=131072,
    ),
    # meta-llama/Llama-2-7b-hf config.json (MHA: 32 KV heads)
    ModelSpec(
        name="Llama-2-7B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
        max_context_tokens=4096,
    ),
    # LargeWorldModel/LWM-Text-1M: the Llama-2-7B architecture trained to a 1M-token context
    # (LoongServe's evaluation model; max_position_embeddings 1,048,576 [M: not re-read]).
    ModelSpec(
        name="LWM-Text-1M",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
        max_context_tokens=1048576,
    ),
    # meta-llama/Llama-2-70b-hf config.json
    ModelSpec(
        name="Llama-2-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=32000,
        max_context_tokens=4096,
    ),
    # facebook/opt-13b config.json: ffn_dim 20480 (a plain fc1/fc2 MLP with ReLU, not gated),
    # 2,048 positions, LM head tied to the embedding. FastServe's main evaluation model.
    ModelSpec(
        name="OPT-13B",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=40,
        head_dim=128,
        intermediate_size=20480,
        gated_mlp=False,
        vocab_size=50272,
        max_context_tokens=2048,
        tie_word_embeddings=True,
    ),
    # facebook/opt-66b config.json: 64 layers, hidden 9216, 72 heads, ffn_dim 36864 (ReLU MLP),
    # 2,048 positions, tied LM head. DeepSpeed-Chat's largest published actor (its Table 2).
    ModelSpec(
        name="OPT-66B",
        num_layers=64,
        hidden_size=9216,
        num_attention_heads=72,
        num_kv_heads=72,
        head_dim=128,
        intermediate_size=36864,
        gated_mlp=False,
        vocab_size=50272,
        max_context_tokens=2048,
        tie_word_embeddings=True,
    ),
    # facebook/opt-350m config.json: 24 layers, hidden 1024, 16 heads, ffn_dim 4096; its
    # 512-wide embedding and the project_in/out matrices are taken as 1024-wide (a <1% error
    # in its FLOPs). DeepSpeed-Chat's reward and critic model in its published runs.
    ModelSpec(
        name="OPT-350M",
        num_layers=24,
        hidden_size=1024,
        num_attention_heads=16,
        num_kv_heads=16,
        head_dim=64,
        intermediate_size=4096,
        gated_mlp=False,
        vocab_size=50272,
        max_context_tokens=2048,
        tie_word_embeddings=True,
    ),
    # Qwen/Qwen2.5-72B-Instruct config.json
    ModelSpec(
        name="Qwen2.5-72B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        max_context_tokens=32768,
    ),
    # mistralai/Mixtral-8x7B-v0.1 config.json
    ModelSpec(
        name="Mixtral-8x7B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        max_context_tokens=32768,
        num_experts=8,
        num_experts_per_token=2,
        moe_intermediate_size=14336,
    ),
    # Qwen/Qwen3-235B-A22B config.json
    ModelSpec(
        name="Qwen3-235B-A22B",
        num_layers=94,
        hidden_size=4096,
        num_attention_heads=64,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        max_context_tokens=40960,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=1536,
    ),
    # deepseek-ai/DeepSeek-V3 config.json (native fp8 block-quantized weights; MTP layer not
    # counted)
    ModelSpec(
        name="DeepSeek-V3",
        num_layers=61,
        hidden_size=7168,
        num_attention_heads=128,
        num_kv_heads=128,
        head_dim=192,
        intermediate_size=18432,
        vocab_size=129280,
        max_context_tokens=163840,
        weight_dtype_bytes=1,
        num_experts=256,
        num_experts_per_token=8,
        moe_intermediate_size=2048,
        num_shared_experts=1,
        num_dense_layers=3,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    ),
    # ---- the RL papers' models ----------------------------------------------------------
    # Qwen/Qwen2.5-7B config.json (StreamRL's smallest model; verl's GRPO examples)
    ModelSpec(name="Qwen2.5-7B", num_layers=28, hidden_size=3584, num_attention_heads=28,
              num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064,
              max_context_tokens=131072),
    # Qwen/Qwen2.5-14B config.json (DeepCoder-14B's base, DeepSeek-R1-Distill-Qwen-14B)
    ModelSpec(name="Qwen2.5-14B", num_layers=48, hidden_size=5120, num_attention_heads=40,
              num_kv_heads=8, head_dim=128, intermediate_size=13824, vocab_size=152064,
              max_context_tokens=131072),
    # Qwen/Qwen2.5-32B config.json (DAPO's model; StreamRL)
    ModelSpec(name="Qwen2.5-32B", num_layers=64, hidden_size=5120, num_attention_heads=40,
              num_kv_heads=8, head_dim=128, intermediate_size=27648, vocab_size=152064,
              max_context_tokens=131072),
    # Qwen/Qwen3-8B, Qwen3-14B and Qwen3-32B config.json (dense; Heddle's models); the 14B and
    # 32B shapes checked against copies of their config.json quoted in public code
    ModelSpec(name="Qwen3-8B", num_layers=36, hidden_size=4096, num_attention_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
              max_context_tokens=40960),
    ModelSpec(name="Qwen3-14B", num_layers=40, hidden_size=5120, num_attention_heads=40,
              num_kv_heads=8, head_dim=128, intermediate_size=17408, vocab_size=151936,
              max_context_tokens=40960),
    ModelSpec(name="Qwen3-32B", num_layers=64, hidden_size=5120, num_attention_heads=64,
              num_kv_heads=8, head_dim=128, intermediate_size=25600, vocab_size=151936,
              max_context_tokens=40960),
    # huggyllama/llama-13b config.json (LLaMA-1; RLHFuse's models). LLaMA-1 was trained at
    # 2,048 tokens; RLHFuse generates up to 2,048 after the prompt, so the context is that of
    # the RLHF runs, not of the base config: 4,096 (as LLaMA-2 of the same shapes).
    ModelSpec(name="LLaMA-13B", num_layers=40, hidden_size=5120, num_attention_heads=40,
              num_kv_heads=40, head_dim=128, intermediate_size=13824, vocab_size=32000,
              max_context_tokens=4096),
    # huggyllama/llama-30b config.json (the paper's "33B")
    ModelSpec(name="LLaMA-33B", num_layers=60, hidden_size=6656, num_attention_heads=52,
              num_kv_heads=52, head_dim=128, intermediate_size=17920, vocab_size=32000,
              max_context_tokens=4096),
    # huggyllama/llama-65b config.json
    ModelSpec(name="LLaMA-65B", num_layers=80, hidden_size=8192, num_attention_heads=64,
              num_kv_heads=64, head_dim=128, intermediate_size=22016, vocab_size=32000,
              max_context_tokens=4096),
    # ---- laptop-class models (Agent.xpu's personal-agent SoC) ----------------------------
    # meta-llama/Llama-3.2-3B config.json (24 heads of 128, 8 KV heads, tied embeddings)
    ModelSpec(name="Llama-3.2-3B", num_layers=28, hidden_size=3072, num_attention_heads=24,
              num_kv_heads=8, head_dim=128, intermediate_size=8192, vocab_size=128256,
              max_context_tokens=131072, tie_word_embeddings=True),
)

_ALIASES = {
    "llama3.1-8b": "Llama-3.1-8B",
    "meta-llama-3.1-8b": "Llama-3.1-8B",
    "llama-3.1-8b-instruct": "Llama-3.1-8B",
    "meta-llama/llama-3.1-8b": "Llama-3.1-8B",
    "llama3.1-70b": "Llama-3.1-70B",
    "meta-llama-3.1-70b": "Llama-3.1-70B",
    "llama-3.1-70b-instruct": "Llama-3.1-70B",
    "meta-llama/llama-3.1-70b": "Llama-3.1-70B",
    "llama3.1-405b": "Llama-3.1-405B",
    "meta-llama-3.1-405b": "Llama-3.1-405B",
    "llama-3.1-405b-instruct": "Llama-3.1-405B",
    "meta-llama/llama-3.1-405b": "Llama-3.1-405B",
    "llama2-7b": "Llama-2-7B",
    "llama-2-7b-hf": "Llama-2-7B",
    "meta-llama/llama-2-7b-hf": "Llama-2-7B",
    "llama2-70b": "Llama-2-70B",
    "llama-2-70b-hf": "Llama-2-70B",
    "meta-llama/llama-2-70b-hf": "Llama-2-70B",
    "qwen2.5-72b-instruct": "Qwen2.5-72B",
    "qwen/qwen2.5-72b-instruct": "Qwen2.5-72B",
    "mixtral-8x7b-v0.1": "Mixtral-8x7B",
    "mixtral-8x7b-instruct-v0.1": "Mixtral-8x7B",
    "mistralai/mixtral-8x7b-v0.1": "Mixtral-8x7B",
    "qwen3-235b": "Qwen3-235B-A22B",
    "qwen/qwen3-235b-a22b": "Qwen3-235B-A22B",
    "deepseek-v3-0324": "DeepSeek-V3",
    "deepseek-ai/deepseek-v3": "DeepSeek-V3",
    "dsv3": "DeepSeek-V3",
}


HF_IDS = {
    # Hugging Face repo id -> catalog name (matched case-insensitively); the first id of
    # each model is the one `fleetsim models` shows.
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.2-3B-Instruct": "llama-3.2-3b",
    "meta-llama/Llama-3.2-3B": "llama-3.2-3b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
    "meta-llama/Llama-3.1-405B": "llama-3.1-405b",
    "facebook/opt-13b": "opt-13b",
    "facebook/opt-66b": "opt-66b",
    "facebook/opt-350m": "opt-350m",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "LargeWorldModel/LWM-Text-1M": "lwm-text-1m",
    "meta-llama/Llama-2-70b-chat-hf": "llama-2-70b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b",
    "Qwen/Qwen2.5-72B": "qwen2.5-72b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "Qwen/Qwen2.5-14B": "qwen2.5-14b",
    "Qwen/Qwen2.5-32B": "qwen2.5-32b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "huggyllama/llama-13b": "llama-13b",
    "huggyllama/llama-30b": "llama-33b",
    "huggyllama/llama-65b": "llama-65b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
}
_HF_LOWER = {k.lower(): v for k, v in HF_IDS.items()}


def list_models() -> list[ModelSpec]:
    """The built-in catalog."""
    return list(_BUILTIN)


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name (case-insensitive), or one parsed from an HF ``config.json``.

    A path to a directory is read as ``<dir>/config.json``.
    """
    key = name_or_path.strip().lower()
    by_key = {m.name.lower(): m for m in _BUILTIN}
    if key in by_key:
        return by_key[key]
    if key in _ALIASES:
        return by_key[_ALIASES[key].lower()]
    if key in _HF_LOWER:
        return by_key[_HF_LOWER[key]]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        return load_hf_config(path)
    known = ", ".join(m.name for m in _BUILTIN)
    raise FleetsimInputError(
        "model", name_or_path, f"unknown model; known: {known}, or give a path to a HF config.json"
    )


def load_hf_config(path: str | Path) -> ModelSpec:
    """Parse a Hugging Face ``config.json`` into a ``ModelSpec``.

    Every value is checked for type and range (a boolean or a list is not a layer count;
    heads must divide the hidden size unless ``head_dim`` is given); errors name the key.
    """
    path = Path(path)
    cfg = read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise FleetsimInputError(f"model {path}", type(cfg).__name__, "expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers nest the LM config
        cfg = {**cfg, **cfg["text_config"]}
    stem = path.parent.name if path.name == "config.json" else path.stem.removesuffix("_config")
    name = cfg.get("_name_or_path") or stem or "hf-model"
    try:
        spec = ModelSpec(name=str(name), **_fields_from_hf(cfg, path))
    except ValueError as err:
        if isinstance(err, FleetsimInputError):
            raise
        raise FleetsimInputError(f"model {path}", name, str(err)) from None
    mode = _checkpoint_mode(cfg, spec)
    return quantize(spec, mode) if mode else spec


def _checkpoint_mode(cfg: Mapping[str, Any], spec: ModelSpec) -> str | None:
    """The quantization mode a checkpoint's ``quantization_config`` implies, as vLLM reads it
    (``quant_method``; AWQ/GPTQ ``bits``; ModelOpt ``quant_algo``). FP8 checkpoints keep the
    one-byte ``weight_dtype_bytes`` they always had; unknown methods are priced as BF16."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method in ("awq", "gptq"):
        return {4: "int4_wo", 8: "int8_wo"}.get(quant.get("bits", quant.get("w_bit")))
    if method == "mxfp4" and spec.is_moe:
        return "w4a16_mxfp4"
    if method == "modelopt":
        return {"FP8": "fp8_static", "NVFP4": "nvfp4"}.get(str(quant.get("quant_algo", "")))
    return None


# config.json key -> largest sane value (the smallest is 1 unless noted in _fields_from_hf)
_HF_MAX = {"layers": 100_000, "width": 10_000_000, "heads": 100_000, "vocab": 100_000_000,
           "context": 2**31}


def _int(cfg: Mapping[str, Any], path: Path, keys: tuple[str, ...], hi: int, *, lo: int = 1,
         default: int | None = None) -> int:
    """The first of ``keys`` present (not null) as a checked integer; ``default`` if none."""
    for key in keys:
        if cfg.get(key) is not None:
            return int(check_number(cfg[key], f"model {path}: {key}", lo=lo, hi=hi,
                                    integer=True))
    if default is not None:
        return default
    raise FleetsimInputError(
        f"model {path}: {keys[0]}", None, f"missing key {' / '.join(keys)} in config.json"
    )


def _weight_bytes(cfg: Mapping[str, Any]) -> int:
    quant = cfg.get("quantization_config") or {}
    if not isinstance(quant, Mapping):
        return 2
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8" or "fp8" in str(quant.get("fmt", "")).lower():
        return 1
    return 2  # bf16/fp16; fp32 checkpoints are served in 16-bit by vLLM's dtype=auto


def _fields_from_hf(cfg: Mapping[str, Any], path: Path) -> dict[str, Any]:
    width, heads_max = _HF_MAX["width"], _HF_MAX["heads"]
    heads = _int(cfg, path, ("num_attention_heads", "n_head"), heads_max)
    hidden = _int(cfg, path, ("hidden_size", "n_embd", "d_model"), width)
    head_dim = _int(cfg, path, ("head_dim",), width, default=0)
    if not head_dim:
        if hidden % heads:
            raise FleetsimInputError(
                f"model {path}: num_attention_heads", heads,
                f"hidden_size {hidden} is not a multiple of it; fix it or give head_dim")
        head_dim = hidden // heads
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise FleetsimInputError(f"model {path}: tie_word_embeddings", tie,
                                 "expected true or false")
    out: dict[str, Any] = {
        "num_layers": _int(cfg, path, ("num_hidden_layers", "n_layer", "num_layers"),
                           _HF_MAX["layers"]),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": _int(cfg, path, ("num_key_value_heads",), heads_max, default=heads),
        "head_dim": head_dim,
        "intermediate_size": _int(cfg, path, ("intermediate_size", "ffn_dim"), width),
        "vocab_size": _int(cfg, path, ("vocab_size",), _HF_MAX["vocab"]),
        "max_context_tokens": _int(
            cfg, path, ("max_position_embeddings", "max_sequence_length", "seq_length"),
            _HF_MAX["context"]),
        "weight_dtype_bytes": _weight_bytes(cfg),
        "tie_word_embeddings": tie,
    }
    num_experts = _int(cfg, path, ("num_local_experts", "n_routed_experts", "num_experts"),
                       heads_max, lo=0, default=0)
    if num_experts:
        out["num_experts"] = num_experts
        out["num_experts_per_token"] = _int(cfg, path, ("num_experts_per_tok",), num_experts)
        # Mixtral's experts are intermediate_size wide; Qwen/DeepSeek name it separately.
        out["moe_intermediate_size"] = _int(cfg, path, ("moe_intermediate_size",), width,
                                            default=out["intermediate_size"])
        out["num_shared_experts"] = _int(cfg, path, ("n_shared_experts",), heads_max, lo=0,
                                         default=0)
        dense = cfg.get("first_k_dense_replace")
        if dense is None:
            layers = cfg.get("mlp_only_layers") or []
            if not isinstance(layers, list):
                raise FleetsimInputError(f"model {path}: mlp_only_layers", layers,
                                         "expected a list of layer indices")
            dense = len(layers)
        out["num_dense_layers"] = int(check_number(
            dense, f"model {path}: first_k_dense_replace", lo=0, hi=out["num_layers"],
            integer=True))
    if _int(cfg, path, ("kv_lora_rank",), width, lo=0, default=0):
        nope = _int(cfg, path, ("qk_nope_head_dim",), width)
        rope = _int(cfg, path, ("qk_rope_head_dim",), width)
        out.update(
            kv_lora_rank=_int(cfg, path, ("kv_lora_rank",), width),
            q_lora_rank=_int(cfg, path, ("q_lora_rank",), width, lo=0, default=0),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=_int(cfg, path, ("v_head_dim",), width),
            head_dim=nope + rope,
            num_kv_heads=heads,
        )
    return out
