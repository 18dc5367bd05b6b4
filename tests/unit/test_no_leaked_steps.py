"""Steps do not outlive their end: the compiled kernel moves a cut window's end event (the
step keeps a handle on it, the event holds the step in its payload), and the run keeps the
cyclic collector off, so a cycle left behind would be freed by nothing until the run ends:
at a million requests that was 2.9 GB instead of 0.67 (measured)."""

from __future__ import annotations

import gc

from fleetsim.config import config_from_dict
from fleetsim.run import run
from fleetsim.serving.window import Step


def test_no_step_is_left_alive_by_a_reference_cycle():
    config = config_from_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "num_replicas": 4},
        "cluster": {"router": {"name": "power_of_two"}},
        "workload": {"trace": None, "arrival": "poisson", "rate_per_s": 8.0,
                     "num_requests": 400,
                     "prompt_tokens": {"kind": "fixed", "value": 300},
                     "output_tokens": {"kind": "fixed", "value": 200}},
    })
    gc.collect()
    gc.disable()  # (as the run does: only reference counting frees what it leaves)
    try:
        result = run(config)
        alive = sum(1 for o in gc.get_objects() if type(o) is Step)
    finally:
        gc.enable()
    assert result.summary["num_finished"] == 400
    # Windows were cut by arrivals (hundreds of steps in all); at most a few steps (one
    # per replica, and the engine's own marker) may remain.
    assert result.records.num_steps > 1000
    assert alive <= 8, alive
