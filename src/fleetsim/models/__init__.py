"""LLM architecture specs and the built-in catalog (also loadable from HF config.json)."""

from __future__ import annotations

from fleetsim.models.catalog import get_model, list_models, load_hf_config
from fleetsim.models.spec import ModelSpec

__all__ = ["ModelSpec", "get_model", "list_models", "load_hf_config"]
