"""Agent.xpu's online scheduler (Wei et al., arXiv:2506.24045; mechanisms from both abstracts,
details ours where the text was not reachable, marked [R]).

- Affinity: each stage runs on the accelerator the device model finds faster for the kernel
  actually run (a ``chunk_tokens`` prefill chunk at the profile context; a decode step), as
  the offline profiler building the heterogeneous execution graph would. On the Core Ultra
  this puts prefill on the NPU and decode on the iGPU (v2: "decoupling prefill and decode").
- Elastic binding: an idle accelerator may take a prefill chunk of another request (v1
  "elastic accelerator mapping"; v2 "elastic operator binding"). Decode never leaves its
  accelerator [R]: decode streams every weight, and the NPU draws a third of the iGPU's DDR.
- Preemption: reactive work is always placed first; proactive work only fills what is left,
  and a job is never interrupted, so a reactive request waits at most one job (one chunk) of
  proactive work (v1 "kernel-level preemption", v2 "fine-grained preemption").
- Slack-aware piggybacking: proactive decodes join a reactive decode step while that step
  stays within ``reactive_slack`` of its reactive-only time (v2) [R: the slack value].
- Bandwidth-aware dispatch: while a reactive decode runs, proactive work starts on the other
  accelerator only if the DDR share it takes slows that decode by at most ``reactive_slack``
  (v1 "bandwidth-aware dispatch"; v2 "reduce bandwidth contention") [R: the test].
- Proactive decodes are batched on the decode accelerator (v2 "stage-divergent batching").
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.hardware.soc import SoCSpec
from fleetsim.perf.soc import ModelCost, OpCost, op_s
from fleetsim.soc.engine import Job, Part, Request, SoCView, part_rates


def fastest(soc: SoCSpec, cost: OpCost) -> str:
    """The accelerator on which ``cost`` runs sooner, alone (ties: by name)."""
    best = min(soc.accelerators, key=lambda a: (
        op_s(a, cost, a.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s)), a.name))
    return best.name


@dataclass(slots=True)
class AgentXpu:
    soc: SoCSpec
    cost: ModelCost
    chunk_tokens: int = 256
    reactive_slack: float = 0.10
    """How much proactive work may slow a reactive decode step (piggybacking, DDR)."""
    profile_context_tokens: int = 1024
    prefill_accelerator: str = ""
    decode_accelerator: str = ""

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if not 0 <= self.reactive_slack <= 1:
            raise ValueError(f"reactive_slack must be in [0, 1], got {self.reactive_slack}")
        n = self.profile_context_tokens
        self.prefill_accelerator = fastest(self.soc, self.cost.prefill(self.chunk_tokens, n))
        self.decode_accelerator = fastest(self.soc, self.cost.decode([n]))

    # ---- job builders ----------------------------------------------------------------

    def _chunk(self, r: Request, acc: str) -> Job:
        n = min(self.chunk_tokens, r.num_prompt_tokens - r.num_prefilled)
        return Job(parts=(Part(acc, self.cost.prefill(n, r.num_prefilled)),), prefill=r,
                   num_prefill_tokens=n)

    def _decode(self, batch: list[Request]) -> Job:
        cost = self.cost.decode([r.context_tokens for r in batch])
        return Job(parts=(Part(self.decode_accelerator, cost),), decode=tuple(batch))

    def _step_s(self, batch: list[Request]) -> float:
        acc = self.soc.accelerator(self.decode_accelerator)
        cost = self.cost.decode([r.context_tokens for r in batch])
        return op_s(acc, cost, acc.max_draw_bytes_per_s(self.soc.ddr_bw_bytes_per_s))

    def _piggyback(self, reactive: list[Request], proactive: list[Request]) -> list[Request]:
        batch = list(reactive)
        limit = self._step_s(reactive) * (1.0 + self.reactive_slack)
        for r in proactive:
            if self._step_s([*batch, r]) > limit:
                break
            batch.append(r)
        return batch

    def _spares_reactive_decode(self, job: Job, reactive_decodes: list[Job]) -> bool:
        """Whether starting proactive ``job`` keeps every reactive decode within the slack."""
        for decode in reactive_decodes:
            alone = part_rates(self.soc, decode.parts)[0]
            shared = part_rates(self.soc, [*decode.parts, *job.parts])[0]
            if alone > shared * (1.0 + self.reactive_slack):
                return False
        return True

    # ---- the plan ----------------------------------------------------------------------

    def plan(self, view: SoCView) -> list[Job]:
        idle = set(view.idle)
        jobs: list[Job] = []
        reactive = [r for r in view.ready if r.reactive]
        proactive = [r for r in view.ready if not r.reactive]
        prefill_order = [self.prefill_accelerator,
                         *(a.name for a in self.soc.accelerators
                           if a.name != self.prefill_accelerator)]
        # 1. reactive decodes, with proactive ones piggybacked within the slack
        reactive_decoding = [r for r in reactive if not r.needs_prefill]
        proactive_decoding = [r for r in proactive if not r.needs_prefill]
        if reactive_decoding and self.decode_accelerator in idle:
            batch = self._piggyback(reactive_decoding, proactive_decoding)
            jobs.append(self._decode(batch))
            idle.discard(self.decode_accelerator)
            proactive_decoding = [r for r in proactive_decoding if r not in batch]
        # 2. reactive prefill chunks, on the affine accelerator first, elastic to the other
        for r in (r for r in reactive if r.needs_prefill):
            acc = next((a for a in prefill_order if a in idle), None)
            if acc is None:
                break
            jobs.append(self._chunk(r, acc))
            idle.discard(acc)
        # 3. proactive work backfills, throttled while a reactive decode runs
        reactive_decodes = [j for j in (*view.running, *jobs)
                            if j.prefill is None and j.reactive]
        if proactive_decoding and self.decode_accelerator in idle:
            job = self._decode(proactive_decoding)
            if self._spares_reactive_decode(job, reactive_decodes):
                jobs.append(job)
                idle.discard(self.decode_accelerator)
        waiting = [r for r in proactive if r.needs_prefill]
        for acc in prefill_order:
            if acc not in idle or not waiting:
                continue
            job = self._chunk(waiting[0], acc)
            if self._spares_reactive_decode(job, reactive_decodes):
                jobs.append(job)
                idle.discard(acc)
                waiting.pop(0)
        return jobs
