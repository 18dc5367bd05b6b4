"""The report and the ``moe compare`` figure as a reader sees them: each page rendered by a
real headless Chromium (the system's, driven by playwright), every figure decoded and not
blank, and no console errors.

Needs /usr/bin/chromium (Debian's ``chromium`` package; ``.ci/run`` installs it) and
playwright (the ``test`` extra; its own browser download is not used). Without them the
test skips, except where ``CI`` is set: there a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.report import write_report
from fleetsim.sweep import make_spec, run_sweep

pytest.importorskip("matplotlib")

VIEWPORT = {"width": 1200, "height": 900}


def chromium_or_skip() -> str:
    path = os.environ.get("FLEETSIM_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    missing = [] if path else ["chromium (apt-get install -y chromium)"]
    try:
        import playwright.sync_api  # noqa: F401
    except ModuleNotFoundError:
        missing.append("playwright (pip install -e '.[test]')")
    if missing:
        why = f"browser check needs {' and '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so this check may not be skipped: {why}")
        pytest.skip(why)
    assert path is not None
    return path


def not_blank(pixels: np.ndarray) -> float:
    """(H, W, 3) uint8 -> the share of pixels unlike the most common colour (the background)."""
    rgb = pixels[..., :3].astype(np.uint32).reshape(-1, 3)
    packed = rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]
    colours, counts = np.unique(packed, return_counts=True)
    assert len(colours) > 16, "a figure of one or two flat colours"
    return 1.0 - counts.max() / counts.sum()


def render(browser: Any, url: str) -> dict:
    """Open ``url``; return console errors, each image's state, the page's text, and one
    full-page screenshot with each image's pixels cut out of it."""
    from PIL import Image

    errors: list[str] = []
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("requestfailed", lambda r: errors.append(f"failed to load {r.url}"))
        page.goto(url, wait_until="load")
        images = page.evaluate(
            "Array.from(document.images).map(i => { const r = i.getBoundingClientRect();"
            " return {alt: i.alt, complete: i.complete, width: i.naturalWidth,"
            " height: i.naturalHeight, box: [r.left + scrollX, r.top + scrollY,"
            " r.width, r.height]}; })")
        shot = page.screenshot(full_page=True)
        text = page.locator("body").inner_text()
    finally:
        page.close()
    pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"))
    for image in images:
        x, y, w, h = (round(v) for v in image["box"])
        image["pixels"] = pixels[y:y + h, x:x + w]
    return {"errors": errors, "images": images, "pixels": pixels, "text": text}


@pytest.fixture(scope="module")
def browser():
    """The system Chromium, started once for the module."""
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    """A sweep over rate with a capacity plan beside it: every section has a figure."""
    root = tmp_path_factory.mktemp("browser")
    spec = make_spec({"workload": {"max_requests": 40}, "hardware": {"gpu": "a100"}},
                     {"workload.rate_scale": [1, 4]})
    run_sweep(spec, root / "sweep", backend="inline")
    (root / "plan").mkdir()
    (root / "plan" / "plan.json").write_text(json.dumps({
        "target": 0.9, "front": [0, 1], "points": [
            {"shape": "1x h100", "usd_per_hour": 3.0, "goodput_requests_per_s": 4.0},
            {"shape": "2x h100", "usd_per_hour": 6.0, "goodput_requests_per_s": 8.0}]}))
    return write_report(root, root / "report.html", made_on="2026-01-01 00:00 UTC")


@pytest.mark.slow
def test_report_renders_in_a_browser_with_every_figure_drawn(browser, report_page):
    seen = render(browser, report_page.as_uri())
    assert seen["errors"] == []
    alts = [i["alt"] for i in seen["images"]]
    for title in ("Latency CDFs", "SLO attainment vs offered load",
                  "Queue length and batch size over time", "Pareto front: cost vs goodput"):
        assert title in alts
    for image in seen["images"]:
        alt = image["alt"]
        assert image["complete"] and image["width"] > 300 and image["height"] > 200, alt
        assert image["box"][2] <= VIEWPORT["width"], alt  # fits the page
        assert image["pixels"].shape[0] > 100, alt  # on the screenshot
        assert not_blank(image["pixels"]) > 0.03, alt
    assert not_blank(seen["pixels"]) > 0.03
    for text in ("Llama-3.1-8B", "embedded:azure_conv_2023", "TTFT ≤ 1 s, TPOT ≤ 0.05 s",
                 "2026-01-01 00:00 UTC"):
        assert text in seen["text"]


@pytest.mark.slow
def test_moe_compare_figure_renders_in_a_browser(browser, tmp_path, capsys):
    png = tmp_path / "moe.png"
    assert main(["moe", "compare", "--scenario", "zipf", "--num-gpus", "16",
                 "--gpus-per-node", "8", "--num-experts", "64", "--microbatches", "4",
                 "--layers", "2", "--plot", str(png)]) == 0
    capsys.readouterr()
    page = tmp_path / "moe.html"
    page.write_text('<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>moe</title>'
                    f'</head><body><img alt="moe compare" src="{png.name}"></body></html>')
    seen = render(browser, page.as_uri())
    assert seen["errors"] == []
    [image] = seen["images"]
    assert image["complete"] and image["width"] > 800 and image["height"] > 300
    assert not_blank(image["pixels"]) > 0.03
    assert Path(png).stat().st_size > 0
