"""LoongServe's scheduler (elastic sequence parallelism, SOSP'24, arXiv:2404.09526) as a group
planner (``serving/groups.py``): a group of instances, each member one batch of requests on a
set of instances, its degree of parallelism the set's size.

It follows ``router/manager.py::_step`` of the public code (``LoongServe/LoongServe``),
mapped onto members:

1. admission (``esp.admission``): when no member has work, or ``max_wait_steps`` decode
   iterations (``avg_decoding_s`` each, the scheduler's own estimate) after the last
   prefill iteration ended, new requests are taken from the group's queue; a refused
   admission is retried after each finish and every ``max_wait_steps`` iterations;
2. the prefill iteration (``_schedule_new_req_list_with_decoding``): decode members are
   paused, first those needed for room, then each whose instances speed the prefill up more
   than pausing slows the batch down (``esp.rules.should_pause``); the DP
   (``esp.dp.plan_prefill``) splits the new requests into batches over the idle and lent
   instances, each batch a member of its instances; a paused member merges into the batch
   that takes its instances (its requests, with their KV, join it), as the code merges paused
   batches into the new batch that shares their instances;
3. while a prefill iteration runs, instances no batch holds take the waiting requests whose
   prefill is predicted to end before the iteration does (``generate_greedy_req_list``, the
   code's greedy refill; ``refill_idle``);
4. between admissions (each ``max_wait_steps`` iterations): a decoding member keeps only the
   instances its KV and the next iterations' tokens need (the code's proactive scale-down,
   ``esp.rules.place_scaled_down``), or takes idle instances when its KV grows past them
   (scale-up); a member with no work gives its instances back.

The scheduler predicts with ``T_k = A_k + B_k sum(l) + C_k sum(l^2)`` (``esp.cost.
AnalyticalModel``), fitted, as the artifact does, to profiled prefills: here the profile is
the group's own step model, read through the view on the first plan.

Before a prefill iteration, decode members are merged to free instances while that pays
(``_minimize_decoding_occupied_instances``; the move's time is weighed, not charged).

The code decides every iteration; here the planner polls every ``max_wait_steps`` iterations
and after each arrival and finish, and leaves out the polls that cannot change anything
(every busy member in one prefill step: ``esp_steps.skip_polls``), keeping their times and
their effect on the next admission, so the results are those of polling throughout.

Not modelled (each a difference from the code, stated in docs/reproductions.md): members
decode independently rather than in one lock step; a member's KV is one pool over its
instances (the step model spreads it evenly); preemption when KV runs out is the member's
batching policy's (recompute), inside the member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsim.esp.admission import Admission
from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import AnalyticalModel, fit_analytical
from fleetsim.memo import BoundedMemo
from fleetsim.policies.esp_steps import EspState, plan_leaving_out_polls
from fleetsim.policies.group_planners import register_group_planner
from fleetsim.serving.contract import GroupPlan, GroupView

# (step model key, instances, KV tokens per instance) -> the fit: profiling is ~84 prefills
# priced by the step model, the same in every run of one layout (a sweep's rates, the
# benchmark's warm-up); bounded, as a sweep over step models could grow it.
_FITS: BoundedMemo[tuple[object, int, int], AnalyticalModel] = BoundedMemo(64)


def _fit(view: GroupView, num_instances: int, cap: int) -> AnalyticalModel:
    """LoongServe's analytical model, fitted to the group's step model (once per key)."""
    key = view.step_model_key
    fit = _FITS.get((key, num_instances, cap)) if key is not None else None
    if fit is None:
        fit = fit_analytical(
            lambda lengths, k: view.step_time_s(k, [(x, 0) for x in lengths], 0, 0),
            num_instances, cap)
        if key is not None:
            _FITS.put((key, num_instances, cap), fit)
    return fit


@register_group_planner("esp")
@dataclass(slots=True)
class EspPlanner:
    """LoongServe's admission, pause rule, prefill DP and scaling, as a group planner. The
    fields are the artifact's server flags (``test/longserve/5-start-api-server.py``), read
    once: the per-plan work is ``policies/esp_steps.py``'s (compiled), on ``state``."""

    max_running: int = 1024
    """``--running_max_req_size`` (1,024 for ShareGPT and Mixed, 256 for L-Eval, LV-Eval)."""
    max_wait_steps: int = 10
    """Decode iterations between admissions while requests run (``--max_wait_tokens``)."""
    max_prefill_s: float = 5.0
    """Predicted prefill time a multi-request batch may take (``--max_prefill_time``)."""
    batch_max_tokens: int = 500_000
    """Input tokens of one prefill iteration (``--batch_max_tokens``)."""
    max_out_of_order: int = 4
    """Admissions in a row that may skip a request (``--max_num_ooe``)."""
    avg_decoding_s: float = 0.022
    """Decode iteration time the scheduler assumes (``--avg_decoding_time`` 22 ms)."""
    elastic: bool = True
    """False: LoongServe without ESP (one member of every instance, a fixed degree)."""
    refill_idle: bool = True
    """Refill instances idle during a prefill iteration with short prefills that end before
    it (``generate_greedy_req_list``)."""
    state: EspState = field(init=False, repr=False)
    """What it keeps between plans: the admission rule, the fitted predictor, its counters."""

    def __post_init__(self) -> None:
        config = EspConfig(max_running=self.max_running, max_wait_steps=self.max_wait_steps,
                           max_prefill_s=self.max_prefill_s,
                           batch_max_tokens=self.batch_max_tokens,
                           max_out_of_order=self.max_out_of_order,
                           avg_decoding_s=self.avg_decoding_s, elastic=self.elastic)
        self.state = EspState(Admission(config), max_running=self.max_running,
                              max_wait_steps=self.max_wait_steps,
                              max_prefill_s=self.max_prefill_s,
                              batch_max_tokens=self.batch_max_tokens,
                              avg_decoding_s=self.avg_decoding_s, elastic=self.elastic,
                              refill_idle=self.refill_idle)

    def report(self) -> dict[str, object]:
        """What it did: prefill batches, members paused, degrees of parallelism used."""
        st = self.state
        return {"num_prefill_batches": st.num_prefill_batches, "num_paused": st.num_paused,
                "num_refills": st.num_refills, "num_merges": st.num_merges,
                "dop_histogram": dict(sorted(st.dop_histogram.items())),
                "analytical_model_mean_rel_error": (
                    st.predictor.mean_rel_error if st.predictor is not None else None)}

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        st = self.state
        if st.predictor is None:
            st.predictor = _fit(view, view.num_instances,
                                view.num_kv_blocks_per_instance * view.block_size)
        return plan_leaving_out_polls(st, view, now_s)
