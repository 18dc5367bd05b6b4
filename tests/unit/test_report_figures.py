"""What the report's figures show: one grid axis as colour, the page header, no Pareto front
across workloads, offered load in requests/s, and a queue length that obeys Little's law."""

from __future__ import annotations

import csv
import html
import json
import re
import shutil

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.report import write_report
from fleetsim.report.figures import offered_rate, queue_series
from fleetsim.report.html import pareto_figures
from fleetsim.report.layout import fit, layout, palette, workload_mix
from fleetsim.report.load import RunData, load_inputs, load_run

pytest.importorskip("matplotlib")


def point(tmp_path, **values):
    return RunData(label=", ".join(f"{k}={v}" for k, v in values.items()), path=tmp_path,
                   summary={}, values={f"x.{k}": v for k, v in values.items()})


def test_the_swept_rate_is_the_colour_and_the_other_axes_are_panels(tmp_path):
    runs = [point(tmp_path, rate_scale=r, gpu=g, max_running=m)
            for r in (0.5, 1, 2, 4) for g in ("a100", "h100") for m in (64, 256)]
    for r in runs:
        r.values = {k.replace("x.rate_scale", "workload.rate_scale"): v
                    for k, v in r.values.items()}
    keys = ("workload.rate_scale", "x.gpu", "x.max_running")
    lay = layout(runs, keys)
    assert lay.colour_key == "workload.rate_scale"
    assert lay.colour_values == (0.5, 1, 2, 4)
    assert [label for label, _ in lay.facets] == [
        "gpu=a100, max_running=64", "gpu=a100, max_running=256",
        "gpu=h100, max_running=64", "gpu=h100, max_running=256"]
    assert all(len(rs) == 4 for _, rs in lay.facets)
    # Each rate keeps its colour in every panel; the ramp follows the rate's order.
    colours = {r.values["workload.rate_scale"]: lay.colour(r) for r in runs}
    assert len(set(colours.values())) == 4
    assert [lay.colour(r) for r in lay.facets[0][1]] == [lay.colour(r) for r in lay.facets[3][1]]
    # As the x axis, the rate leaves the colour to the axis with the most values.
    by_x = layout(runs, keys, x_key="workload.rate_scale")
    assert by_x.colour_key == "x.gpu"
    assert len(by_x.facets) == 2


def test_colours_are_a_ramp_for_numbers_and_hues_for_names():
    ramp = palette([4, 0.5, 2])
    assert ramp[1][:3] == pytest.approx((0.267, 0.005, 0.329), abs=0.01)  # viridis start
    assert ramp[0] != ramp[2]
    hues = palette(["a100", "h100"])
    assert hues[0][:3] == pytest.approx((0.122, 0.467, 0.706), abs=0.01)  # tab10 blue


def test_many_panels_and_colours_are_thinned_and_the_caption_says_so(tmp_path):
    runs = [point(tmp_path, a=a, b=b) for a in range(20) for b in range(6)]
    lay, note = fit(layout(runs, ("x.a", "x.b")), max_facets=4, max_colours=12)
    assert lay.colour_key == "x.a"
    assert len(lay.colour_values) == 12 and len(lay.facets) == 4
    assert note == "Showing 4 of 6 panels and 12 of 20 a values, evenly spaced."
    assert layout(runs[:1], ("x.a", "x.b")).colour_key is None  # a single run: no grid


def test_workload_mix_names_the_differing_field(tmp_path):
    def run(trace, rate, ttft=1.0):
        return RunData(label=trace, path=tmp_path, summary={}, config={
            "workload": {"trace": trace, "rate_scale": rate}, "slo": {"ttft_s": ttft}})

    assert workload_mix([run("a.csv", 1), run("a.csv", 1)]) is None
    why = workload_mix([run("a.csv", 1), run("b.csv", 1)])
    assert "workload.trace: 'a.csv' vs 'b.csv'" in why
    assert "not comparable" in why
    assert workload_mix([run("a.csv", 1), run("a.csv", 2)],
                        ignore=["workload.rate_scale"]) is None
    assert "slo.ttft_s" in workload_mix([run("a.csv", 1), run("a.csv", 1, ttft=2.0)])


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory):
    """One A100 at 8x the conversation trace's rate: the queue grows for the whole run."""
    out = tmp_path_factory.mktemp("over") / "a100"
    assert main(["run", "--out", str(out), "--set", "hardware.gpu=a100",
                 "--set", "workload.rate_scale=8", "--set", "workload.max_requests=400"]) == 0
    return out


def test_queue_length_obeys_littles_law(overloaded):
    """The area under the queue-length curve is the total time requests spent waiting
    (Little's law). The engine counts the queue per step, so it misses only each request's
    wait for the step running when it arrived (a fraction of a step, here about 0.2 s of
    a mean wait near 6 s): never more than the truth, and within a few percent of it."""
    run = load_run(overloaded, "a100")
    series = queue_series(run)
    width = np.diff(run.summary["timeline"]["bin_start_s"])[0]
    with (overloaded / "requests.csv").open() as f:
        total_wait_s = sum(float(r["queueing_delay_s"]) for r in csv.DictReader(f))
    assert total_wait_s > 100 * run.summary["makespan_s"] / 400  # a real queue
    area = float(np.sum(series["waiting"])) * width
    assert 0.94 * total_wait_s < area <= total_wait_s
    busy = np.asarray(run.summary["timeline"]["busy_fraction"]) > 0
    running = series["running"][busy]
    assert np.nanmax(running) <= 256  # engine.max_running
    assert np.all(np.isnan(series["running"][~busy]))


def test_offered_load_is_arrivals_over_their_span(overloaded):
    run = load_run(overloaded, "a100")
    with (overloaded / "requests.csv").open() as f:
        arrivals = [float(r["arrival_s"]) for r in csv.DictReader(f)]
    expected = len(arrivals) / (max(arrivals) - min(arrivals))
    assert offered_rate(run) == pytest.approx(expected, rel=1e-6)
    # Summaries written before offered_requests_per_s: the same number from the ratio.
    del run.summary["overload"]["offered_requests_per_s"]
    assert offered_rate(run) == pytest.approx(expected, rel=1e-6)


def test_header_names_model_trace_slo_version_and_date(overloaded, capsys):
    from fleetsim import __version__

    assert main(["report", str(overloaded), "--out", str(overloaded / "r.html")]) == 0
    capsys.readouterr()
    page = (overloaded / "r.html").read_text()
    header = page[page.index("<table class=meta>"):page.index("</table>")]
    for text in ("Llama-3.1-8B", "1x A100-80GB-SXM, TP 1", "embedded:azure_conv_2023",
                 "TTFT ≤ 1 s, TPOT ≤ 0.05 s", f"fleetsim {__version__}"):
        assert text in header
    assert len(re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", header)) == 2  # written, made


def test_no_pareto_front_across_workloads(overloaded, tmp_path):
    folder = tmp_path / "mixed"
    for name, trace in (("a", "embedded:azure_conv_2023"), ("b", "embedded:azure_code_2023")):
        shutil.copytree(overloaded, folder / name)
        config = json.loads((folder / name / "config.json").read_text())
        config["workload"]["trace"] = trace
        (folder / name / "config.json").write_text(json.dumps(config))
    page = html.unescape(write_report(folder).read_text())
    assert "No Pareto front for 2 runs" in page
    assert "workload.trace: 'embedded:azure_conv_2023' vs 'embedded:azure_code_2023'" in page
    assert 'alt="Pareto front: cost vs goodput"' not in page
    # The same workload twice: a front is drawn.
    shutil.rmtree(folder / "b")
    shutil.copytree(folder / "a", folder / "b")
    figures = list(pareto_figures(load_inputs(folder)))
    assert len(figures) == 1 and 'alt="Pareto front: cost vs goodput"' in figures[0]
