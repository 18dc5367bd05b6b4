"""The models of the RL papers that fleetsim's catalog lacks (values from each model's Hugging
Face ``config.json``), and a resolver that falls back to the catalog (``fleetsim models``) or a
``config.json`` path."""

from __future__ import annotations

from fleetsim.models import ModelSpec, get_model

RL_MODELS: dict[str, ModelSpec] = {
    # Qwen/Qwen2.5-7B config.json (StreamRL's smallest model; verl's GRPO examples)
    "qwen2.5-7b": ModelSpec(name="Qwen2.5-7B", num_layers=28, hidden_size=3584,
                            num_attention_heads=28, num_kv_heads=4, head_dim=128,
                            intermediate_size=18944, vocab_size=152064,
                            max_context_tokens=131072),
    # Qwen/Qwen2.5-14B config.json (DeepCoder-14B's base, DeepSeek-R1-Distill-Qwen-14B)
    "qwen2.5-14b": ModelSpec(name="Qwen2.5-14B", num_layers=48, hidden_size=5120,
                             num_attention_heads=40, num_kv_heads=8, head_dim=128,
                             intermediate_size=13824, vocab_size=152064,
                             max_context_tokens=131072),
    # Qwen/Qwen2.5-32B config.json (DAPO's model; StreamRL)
    "qwen2.5-32b": ModelSpec(name="Qwen2.5-32B", num_layers=64, hidden_size=5120,
                             num_attention_heads=40, num_kv_heads=8, head_dim=128,
                             intermediate_size=27648, vocab_size=152064,
                             max_context_tokens=131072),
    # huggyllama/llama-13b config.json (LLaMA-1; RLHFuse's models). LLaMA-1 was trained at
    # 2,048 tokens; RLHFuse generates up to 2,048 after the prompt, so the context is that of
    # the RLHF runs, not of the base config: 4,096 (as LLaMA-2 of the same shapes).
    "llama-13b": ModelSpec(name="LLaMA-13B", num_layers=40, hidden_size=5120,
                           num_attention_heads=40, num_kv_heads=40, head_dim=128,
                           intermediate_size=13824, vocab_size=32000, max_context_tokens=4096),
    # huggyllama/llama-30b config.json (the paper's "33B")
    "llama-33b": ModelSpec(name="LLaMA-33B", num_layers=60, hidden_size=6656,
                           num_attention_heads=52, num_kv_heads=52, head_dim=128,
                           intermediate_size=17920, vocab_size=32000, max_context_tokens=4096),
    # huggyllama/llama-65b config.json
    "llama-65b": ModelSpec(name="LLaMA-65B", num_layers=80, hidden_size=8192,
                           num_attention_heads=64, num_kv_heads=64, head_dim=128,
                           intermediate_size=22016, vocab_size=32000, max_context_tokens=4096),
}


def resolve_model(name: str) -> ModelSpec:
    """An RL paper's model by name, else ``fleetsim.models.get_model`` (catalog or path)."""
    key = name.strip().lower()
    if key in RL_MODELS:
        return RL_MODELS[key]
    for spec in RL_MODELS.values():
        if spec.name.lower() == key:
            return spec
    return get_model(name)
