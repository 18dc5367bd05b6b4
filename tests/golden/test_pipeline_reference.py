"""The pipeline period (``perf/pipeline.cyclic_period_s``) against a reference: an independent
event-by-event simulation of vLLM V1's batch-queue loop, ``m`` micro-batches cycling through
the CPU (schedule + output processing) and ``pp`` stages, each one server in FIFO order, with
the sends between stages as pure delays. The steady-state time between two passes of a
micro-batch must be the closed form's."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from fleetsim.perf.pipeline import cyclic_period_s


def reference_period_s(stage_s, cpu_s, send_s, m, cycles=60):
    """Simulate; return the mean time between passes of micro-batch 0 over the last half."""
    servers = ["cpu", *range(len(stage_s))]
    service = {"cpu": cpu_s, **dict(enumerate(stage_s))}
    free_at = dict.fromkeys(servers, 0.0)
    events = [(0.0, j, j, "cpu") for j in range(m)]  # (ready time, order, batch, server)
    heapq.heapify(events)
    order = m
    passes = []  # times micro-batch 0 re-enters the CPU
    while len(passes) < cycles:
        ready, _, j, server = heapq.heappop(events)
        start = max(ready, free_at[server])  # FIFO: events pop in ready order
        done = free_at[server] = start + service[server]
        if server == "cpu":
            if j == 0:
                passes.append(ready)
            nxt, at = 0, done
        elif server < len(stage_s) - 1:
            nxt, at = server + 1, done + send_s[server]
        else:
            nxt, at = "cpu", done
        heapq.heappush(events, (at, order, j, nxt))
        order += 1
    half = passes[len(passes) // 2:]
    return (half[-1] - half[0]) / (len(half) - 1)


CASES = [  # (stages, cpu, sends, m): balanced, uneven, CPU-bound, one micro-batch, bubbles
    ([1.0, 1.0], 0.1, [0.01], 2),
    ([1.0, 1.0], 0.1, [0.01], 1),
    ([1.0, 1.1, 1.1, 0.9], 0.2, [0.05, 0.3, 0.05], 4),
    ([1.0, 1.1, 1.1, 0.9], 0.2, [0.05, 0.3, 0.05], 3),
    ([0.2, 0.2, 0.2], 0.5, [0.0, 0.0], 3),
    ([2.0, 0.5, 0.5, 0.5], 0.05, [0.01, 0.01, 0.01], 4),
    ([1.0], 0.3, [], 1),
]


@pytest.mark.parametrize(("stage_s", "cpu_s", "send_s", "m"), CASES)
def test_period_equals_the_batch_queue_simulation(stage_s, cpu_s, send_s, m):
    expected = reference_period_s(stage_s, cpu_s, send_s, m)
    assert cyclic_period_s(stage_s, cpu_s, sum(send_s), m) == pytest.approx(expected, rel=1e-9)


def test_period_on_random_pipelines():
    rng = np.random.default_rng(7)
    for _ in range(150):
        pp = int(rng.integers(1, 7))
        m = int(rng.integers(1, pp + 1))
        stage_s = rng.uniform(0.2, 2.0, pp).tolist()
        cpu_s = float(rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(0.5, 3.0)]))
        send_s = rng.uniform(0, 0.3, pp - 1).tolist()
        expected = reference_period_s(stage_s, cpu_s, send_s, m, cycles=80)
        got = cyclic_period_s(stage_s, cpu_s, sum(send_s), m)
        assert got == pytest.approx(expected, rel=1e-9), (stage_s, cpu_s, send_s, m)
