"""LoongServe's scheduler flags, as its admission rule takes them (``esp.admission``)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_DECODING_S = 1e-6
"""Smallest ``avg_decoding_s`` accepted, seconds (see ``EspConfig.__post_init__``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EspConfig:
    """LoongServe's scheduler flags in the artifact (``test/longserve/5-start-api-server.py``);
    the group planner ``esp`` (``policies/esp.py``) takes them as its args."""

    max_running: int = 1024
    """``--running_max_req_size`` (1,024 for ShareGPT and Mixed, 256 for L-Eval, LV-Eval)."""
    max_wait_steps: int = 10
    """Decode iterations between admissions while requests run (``--max_wait_tokens``)."""
    max_prefill_s: float = 5.0
    """Predicted prefill time a multi-request batch may take (``--max_prefill_time`` 5000 ms)."""
    batch_max_tokens: int = 500_000
    """Input tokens of one prefill iteration (``--batch_max_tokens``)."""
    max_out_of_order: int = 4
    """Admissions in a row that may skip a request (``--max_num_ooe``: Mixed 4, L-Eval and
    LV-Eval 8, ShareGPT 1)."""
    avg_decoding_s: float = 0.022
    """Decode iteration time the admission's wait estimate assumes (``--avg_decoding_time``
    22 ms)."""
    elastic: bool = True
    """False: LoongServe without ESP (every prefill on all instances, no pausing rule)."""

    def __post_init__(self) -> None:
        for name in ("max_running", "batch_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_wait_steps < 0 or self.max_out_of_order < 0:
            raise ValueError(f"max_wait_steps and max_out_of_order must be >= 0, got "
                             f"{self.max_wait_steps} and {self.max_out_of_order}")
        if self.max_prefill_s <= 0 or self.avg_decoding_s <= 0:
            raise ValueError(f"max_prefill_s and avg_decoding_s must be > 0, got "
                             f"{self.max_prefill_s} and {self.avg_decoding_s}")
        # The planner polls every max_wait_steps * avg_decoding_s: a period far below any
        # real decode iteration stalls the simulation (1e-300 s never moves a clock past 1e-284
        # s), so the estimate must be at least a microsecond, far below any GPU's iteration.
        if self.avg_decoding_s < MIN_DECODING_S:
            raise ValueError(f"avg_decoding_s must be >= {MIN_DECODING_S:g} s (a decode "
                             f"iteration's time; LightLLM's default 0.022), got "
                             f"{self.avg_decoding_s:g}")
