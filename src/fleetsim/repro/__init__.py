"""Reproductions of research papers' headline comparisons, one module per paper, registered
by name (``fleetsim repro list``). Importing this package registers them."""

from fleetsim.repro import (  # noqa: E402,F401  (register the entries)
    agent_xpu,
    areal_tik,
    autellix,
    autopoiesis,
    expertplex,
    fastserve,
    heddle,
    hexagent,
    loongserve,
    relibra,
    rlhfuse,
    streamrl,
    tokenlake,
    ultraep,
)
from fleetsim.repro.frame import (
    REPRODUCTIONS,
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    get_reproduction,
    run_reproduction,
    to_document,
)

__all__ = [
    "REPRODUCTIONS",
    "Comparison",
    "Loads",
    "Metric",
    "Paper",
    "ReproContext",
    "Reproduction",
    "get_reproduction",
    "run_reproduction",
    "to_document",
]
