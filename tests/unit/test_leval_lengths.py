"""L-Eval's request lengths (``fleetsim.workloads.leval``) against its published Table 1, and
LoongServe's entry against the authors' notebook (``repro/loongserve.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.workloads import leval


def test_table_transcription_matches_the_published_totals():
    # the abstract's 20 sub-tasks and 508 documents; the repository README's 2,197 pairs
    assert len(leval.TASKS) == 20
    assert sum(t.num_documents for t in leval.TASKS) == 508
    assert sum(t.num_instructions for t in leval.TASKS) == 2197
    assert max(t.max_input_tokens for t in leval.TASKS) == 210_541  # NarrativeQA's longest
    assert leval.mean_prompt_tokens() == pytest.approx(16_365, abs=1)


@pytest.mark.parametrize("task", leval.TASKS, ids=lambda t: t.name)
def test_each_task_draws_its_published_mean_within_its_range(task):
    c = leval.power_exponent(task)
    mean = leval._mean_fraction(c, leval.MIN_INPUT_TOKENS / task.max_input_tokens)
    assert mean * task.max_input_tokens == pytest.approx(task.mean_input_tokens, rel=1e-6)
    prompt, out = leval.lengths(200_000, np.random.default_rng(1))
    # the task's requests, picked out by its output length where that is unique
    outs = [leval.output_tokens(t) for t in leval.TASKS]
    if outs.count(leval.output_tokens(task)) == 1:
        mine = prompt[out == leval.output_tokens(task)]
        assert mine.min() >= leval.MIN_INPUT_TOKENS
        assert mine.max() <= task.max_input_tokens
        se = mine.std() / np.sqrt(len(mine))
        assert abs(mine.mean() - task.mean_input_tokens) < 5 * se + 1


def test_requests_follow_the_instruction_shares_and_answer_lengths():
    prompt, out = leval.lengths(100_000, np.random.default_rng(2))
    se = prompt.std() / np.sqrt(len(prompt))
    assert abs(prompt.mean() - leval.mean_prompt_tokens()) < 5 * se
    # summaries (hundreds of tokens) are 2% of requests, one-letter answers about a third
    share_one = np.mean(out == 1)
    expected_one = sum(w for w, t in zip(leval.request_weights(), leval.TASKS, strict=True)
                       if leval.output_tokens(t) == 1)
    assert share_one == pytest.approx(expected_one, abs=0.01)
    assert out.max() == max(leval.output_tokens(t) for t in leval.TASKS)


def test_loongserve_leval_is_the_published_model_not_the_stated_range():
    from fleetsim.workloads.long_context import lengths
    prompt, _ = lengths("leval", 6000, np.random.default_rng(3))
    # the earlier log-uniform over the stated 3k-200k range averaged 46.9k tokens
    assert prompt.mean() < 20_000
    assert abs(prompt.mean() - leval.mean_prompt_tokens()) < 5 * prompt.std() / np.sqrt(6000)


def test_paper_ratio_is_the_notebooks_mixed_panel():
    from fleetsim.repro.frame import get_reproduction
    from fleetsim.repro.loongserve import PUBLISHED
    entry = get_reproduction("loongserve")
    mixed = PUBLISHED["mixed"]
    assert entry.paper_ratio == pytest.approx(mixed["loongserve"][0] / mixed["lightllm-sf"][0],
                                              abs=0.01)
    assert "6-data-analyse-evaluation.ipynb" in entry.paper_ratio_source
    # the abstract's 5.81x is the same notebook's L-Eval panel against DistServe (its rates
    # are printed to 3 places)
    leval_ = PUBLISHED["leval"]
    assert leval_["loongserve"][0] / leval_["distserve"][0] == pytest.approx(5.81, abs=0.02)


def test_published_notes_give_each_systems_absolute_error():
    from fleetsim.repro.loongserve import PUBLISHED, published_notes
    rates = (0.1, 0.2, 0.4)
    # per-token curves (s/token) crossing 70 ms at 0.3 (loongserve), at 0.15 (others)
    ls = {"0.1": (0.01, 0.01, 0.01), "0.2": (0.03, 0.01, 0.01), "0.4": (0.11, 0.01, 0.01)}
    other = {"0.1": (0.05, 0.01, 0.01), "0.2": (0.09, 0.01, 0.01), "0.4": (0.2, 0.01, 0.01)}
    curves = {"mixed": {s: (ls if s == "loongserve" else other) for s in PUBLISHED["mixed"]}}
    notes = published_notes(curves, {"mixed": rates})
    per_token = next(n for n in notes if "per-token" in n)
    assert "loongserve 0.300 vs 0.553 (-46%)" in per_token
    assert "lightllm-sf 0.150 vs 0.144 (+4%)" in per_token
    assert "vs lightllm-sf 3.84x" in per_token
    output = next(n for n in notes if "output-token" in n)
    assert "loongserve >= 0.4 vs inf (never crossed)" in output
    input_token = next(n for n in notes if "input-token" in n)  # never crossed 90 ms here
    assert "lightllm-sf >= 0.4 vs 0.153 (>= +161%)" in input_token


def test_a_curve_past_every_slo_stops_without_moving_its_crossings():
    from fleetsim.metrics.slo import crossing_rate as _max_rate
    from fleetsim.repro.loongserve import _past_every_slo
    rates = (0.1, 0.2, 0.4, 0.8)
    # Mixed SLOs 70 / 90 / 360 ms; the output column crosses only at 0.4
    full = [(0.01, 0.02, 0.1), (0.08, 0.1, 0.2), (0.2, 0.3, 0.4), (0.05, 0.05, 0.05)]
    curve: dict[str, tuple[float, float, float]] = {}
    for rate, value in zip(rates, full, strict=True):
        if _past_every_slo(curve, "mixed"):
            break
        curve[f"{rate:g}"] = value
    assert list(curve) == ["0.1", "0.2", "0.4"]  # 0.8 not run
    slos = (0.07, 0.09, 0.36)
    for col, slo in enumerate(slos):
        kept = [v[col] for v in curve.values()]
        assert _max_rate(rates, kept, slo) == _max_rate(rates, [v[col] for v in full], slo)
    assert not _past_every_slo({"0.1": (0.2, 0.3, 0.1)}, "mixed")  # output column not yet


def test_ablation_stops_a_variant_below_90_percent_without_moving_its_crossing(monkeypatch):
    from fleetsim.metrics.slo import crossing_rate
    from fleetsim.repro import loongserve_ablation as ab
    rates = ab.RATES[1.0]
    # the fixed layouts fall below 90% at the fourth rate and would recover after it
    scripted = {v: [1.0, 0.97, 0.93, 0.6, 0.95, 0.95] for v in ab.VARIANTS}
    scripted["loongserve"] = [1.0] * len(rates)
    calls: list[tuple[str, int]] = []

    def fake_run(variant, wl, layouts):
        calls.append((variant, len(wl.arrival_s)))
        return {"variant": variant}

    def fake_attainment(requests, fit):
        variant = requests["variant"]
        return scripted[variant][sum(1 for v, _ in calls if v == variant) - 1]

    class FakeLayouts:
        fit = {2: None}

    monkeypatch.setattr(ab, "run_variant", fake_run)
    monkeypatch.setattr(ab, "ablation_attainment", fake_attainment)
    curves = ab.ablation(FakeLayouts(), 0, alphas=(1.0,))[1.0]
    assert len(curves["loongserve"]) == len(rates)
    assert curves["no-esp tp8"] == [1.0, 0.97, 0.93, 0.6]  # the last two rates not run
    assert crossing_rate(rates, curves["no-esp tp8"], ab.ATTAINMENT, rising=False) == (
        pytest.approx(crossing_rate(rates, scripted["no-esp tp8"], ab.ATTAINMENT,
                                    rising=False)))
    note = ab.ablation_notes({1.0: curves})[0]
    assert "no-esp tp8 100%/97%/93%/60%/-/-" in note
