"""``emulate`` and ``gateway`` as vLLM and llm-d users expect them: vLLM's metric series,
``/ready`` and ``/version``, request ids, the backend's name, single ``date``/``server``
headers, and active health checks."""

from __future__ import annotations

import re
import time
from contextlib import ExitStack

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fleetsim import __version__
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.gateway import Gateway
from fleetsim.live.metrics import one_two_five_buckets
from fleetsim.live.server import LiveApp, ServerThread

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"
TIMEOUT_S = 20.0
# What llm-d's endpoint picker scrapes of a vLLM pod (queue depth, running batch, KV use).
LLM_D_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc")


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """/metrics as a scraper reads it: series name -> {sorted label items: value}."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_an_llm_d_style_scrape_finds_the_vllm_series():
    with ServerThread(lambda: emulated_backend(speed=5.0, served_model=MODEL)) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                          timeout=TIMEOUT_S)
        stream = c.completions.create(model=MODEL, prompt="hold " * 300, max_tokens=2000,
                                      stream=True)
        next(iter(stream))
        during = scrape(url)
        stream.close()
        for i in range(3):
            c.completions.create(model=MODEL, prompt=f"hi {i}", max_tokens=4)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and \
                sum(scrape(url).get("vllm:request_success_total", {}).values()) < 4:
            time.sleep(0.05)
        after = scrape(url)
    labels = (("engine", "0"), ("model_name", MODEL))
    for name in LLM_D_GAUGES:
        assert labels in during[name], (name, during.get(name))
    assert during["vllm:num_requests_running"][labels] == 1
    assert 0 < during["vllm:kv_cache_usage_perc"][labels] <= 1
    assert after["vllm:num_requests_running"][labels] == 0
    success = after["vllm:request_success_total"]
    assert success[(*labels[:1], ("finished_reason", "length"), *labels[1:])] == 3
    assert success[(*labels[:1], ("finished_reason", "abort"), *labels[1:])] == 1
    assert after["vllm:time_to_first_token_seconds_count"][labels] == 4
    assert after["vllm:e2e_request_latency_seconds_count"][labels] == 4
    assert after["vllm:generation_tokens_total"][labels] >= 12
    assert after["vllm:prompt_tokens_total"][labels] > 300


def test_buckets_as_vllm_builds_them():
    assert one_two_five_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert one_two_five_buckets(131072)[-1] == 100000


def test_ready_version_and_request_ids():
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        assert httpx.get(f"{url}/ready", timeout=TIMEOUT_S).status_code == 200
        v = httpx.get(f"{url}/version", timeout=TIMEOUT_S).json()
        assert v["version"] == __version__
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT_S,
                       headers={"X-Request-Id": "abc-1"})
        assert r.headers["x-request-id"] == "abc-1" and r.json()["id"] == "cmpl-abc-1"
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT_S)
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
        r = httpx.post(f"{url}/v1/completions", json={**body, "model": "nope"},
                       timeout=TIMEOUT_S, headers={"X-Request-Id": "abc-2"})
        assert r.status_code == 404 and r.headers["x-request-id"] == "abc-2"


class Sick(LiveApp):
    """A backend whose /health says 503 and whose completions fail."""

    def __init__(self) -> None:
        async def health(request):
            return JSONResponse({"status": "unavailable"}, status_code=503)

        async def fail(request):
            return JSONResponse({"error": {"message": "down"}}, status_code=500)

        self.asgi = Starlette(routes=[Route("/health", health),
                                      Route("/v1/completions", fail, methods=["POST"])])


def test_gateway_headers_and_active_health_checks():
    with ExitStack() as stack:
        good = stack.enter_context(ServerThread(lambda: emulated_backend(speed=50.0)))
        sick = stack.enter_context(ServerThread(Sick))
        gw = ServerThread(lambda: Gateway([sick, good], router="round_robin",
                                          health_check_interval_s=0.05))
        url = stack.enter_context(gw)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and gw.call(lambda: gw.app.backends[0].health_ok):
            time.sleep(0.02)
        for i in range(6):  # round robin would send half to the sick one
            r = httpx.post(f"{url}/v1/completions", timeout=TIMEOUT_S,
                           json={"model": MODEL, "prompt": f"hi {i}", "max_tokens": 2},
                           headers={"X-Request-Id": f"r{i}"})
            assert r.status_code == 200
            assert r.headers["x-fleetsim-backend"] == good
            assert r.headers["x-request-id"] == f"r{i}"
            for name in ("date", "server"):
                assert len(r.headers.get_list(name)) <= 1, r.headers
        metrics = scrape(url)
        assert metrics["fleetsim:retries_total"][()] == 0
        assert metrics["fleetsim:num_backends_healthy"][()] == 1


def test_gateway_models_503_without_a_backend_then_the_union():
    with ExitStack() as stack:
        gw = ServerThread(lambda: Gateway(["http://127.0.0.1:9"]))
        url = stack.enter_context(gw)
        r = httpx.get(f"{url}/v1/models", timeout=TIMEOUT_S)
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        # The first active check (at start) finds nothing listening: not ready.
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and \
                httpx.get(f"{url}/ready", timeout=TIMEOUT_S).status_code != 503:
            time.sleep(0.02)
        assert httpx.get(f"{url}/ready", timeout=TIMEOUT_S).status_code == 503


def test_n_and_batched_prompts_as_vllm_answers_them():
    """Prompt p's j-th completion is choice p * n + j; usage counts each prompt once."""
    from fleetsim.live.tokens import count_tokens

    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        body = {"model": MODEL, "prompt": ["a b", "c d e f"], "n": 2, "max_tokens": 3}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT_S).json()
        assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
        assert all(c["finish_reason"] == "length" for c in r["choices"])
        assert r["usage"]["prompt_tokens"] == count_tokens("a b") + count_tokens("c d e f")
        assert r["usage"]["completion_tokens"] == 12
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                          timeout=TIMEOUT_S)
        tokens: dict[int, int] = {}
        finished: dict[int, str] = {}
        usage = None
        for chunk in c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=4,
                stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    tokens[choice.index] = tokens.get(choice.index, 0) + 1
                if choice.finish_reason:
                    finished[choice.index] = choice.finish_reason
        assert tokens == {0: 4, 1: 4, 2: 4} and finished == {0: "length", 1: "length",
                                                               2: "length"}
        assert usage.completion_tokens == 12
        metrics = scrape(url)
    labels = (("engine", "0"), ("model_name", MODEL))
    assert metrics["vllm:e2e_request_latency_seconds_count"][labels] == 7  # 4 + 3 choices


def test_echo_and_random_response_modes():
    body = {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 5}
    with ServerThread(lambda: emulated_backend(speed=50.0, response_mode="echo")) as url:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT_S).json()
        assert r["choices"][0]["text"] == " 11 12 13 11 12"
    with ServerThread(lambda: emulated_backend(speed=50.0, response_mode="random")) as url:
        texts = [httpx.post(f"{url}/v1/completions", json={**body, "seed": seed},
                            timeout=TIMEOUT_S).json()["choices"][0]["text"]
                 for seed in (1, 1, 2)]
    assert texts[0] == texts[1] != texts[2]
    assert all(len(t.split()) == 5 for t in texts)


def test_emulate_listens_on_the_host_it_is_given():
    import os
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "fleetsim", "emulate", "--host", "localhost",
                             "--speed", "50"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(60)
        assert line and "listening on http://" in line[0], line
        url = line[0].rsplit(" ", 1)[1].strip()
        assert re.fullmatch(r"http://(127\.0\.0\.1|\[::1\]):\d+", url), url
        assert httpx.get(f"{url}/version", timeout=TIMEOUT_S).json()["version"] == __version__
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
