"""Server and load flags are checked before anything runs (one line, exit 2), bodies that
break the JSON parser are a 400, and ``fleetsim load`` waits for its server to be ready."""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack

import httpx
import pytest

from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError
from fleetsim.live.bench import wait_ready
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.gateway import Gateway
from fleetsim.live.server import ServerThread

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"


@pytest.mark.parametrize(("argv", "field"), [
    (["emulate", "--log-level", "bogus"], "--log-level"),
    (["gateway", "--backend", "http://[::1"], "--backend"),
    (["gateway", "--backend", "http://127.0.0.1:99999"], "--backend"),
    (["gateway", "--backend", "http://127.0.0.1:abc"], "--backend"),
    (["gateway", "--backend", "http://127.0.0.1:0"], "--backend"),
    (["gateway", "--backend", "http://127.0.0.1:8001", "--log-level", "loud"], "--log-level"),
    (["load", "embedded:azure_conv_2023", "--url", "http://127.0.0.1:99999"], "--url"),
    (["load", "embedded:azure_conv_2023", "--url", "localhost:8000"], "--url"),
    # Checked before the load runs: port 9 (discard) never answers, so a check after the
    # load (or after waiting for readiness) would fail with another message.
    (["load", "embedded:azure_conv_2023", "--url", "http://127.0.0.1:9",
      "--hash-block-tokens", "0"], "--hash-block-tokens"),
    (["load", "embedded:azure_conv_2023", "--url", "http://127.0.0.1:9",
      "--ready-check-timeout-sec", "-1"], "--ready-check-timeout-sec"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, field, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"fleetsim: error: {field}:"), err


def test_deeply_nested_json_is_a_400_not_a_500():
    body = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        r = httpx.post(f"{url}/v1/completions", content=body, timeout=20.0)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"


def test_load_fails_in_one_line_when_the_server_never_gets_ready(capsys):
    with ServerThread(lambda: Gateway(["http://127.0.0.1:9"])) as url:
        # A gateway with no backend up answers 503, which is "not ready", not "no model".
        assert httpx.get(f"{url}/v1/models", timeout=20.0).status_code == 503
        with pytest.raises(FleetsimInputError, match=r"not ready after 0.3 s \(HTTP 503\)"):
            wait_ready(url, 0.3)
        assert main(["load", "embedded:azure_conv_2023", "--url", url, "--max-requests", "1",
                     "--ready-check-timeout-sec", "0"]) == 2
    assert "--ready-check-timeout-sec" in capsys.readouterr().err


def test_load_waits_for_a_backend_that_starts_later(capsys, monkeypatch):
    """The gateway is up at once, its backend (nothing listens on its port yet) only once
    ``load`` has found it not ready, as in the README's block: ``load`` waits, then runs,
    where it used to fail listing the models."""
    import fleetsim.live.bench as live_bench

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    late: list[ServerThread] = []

    class Clock:  # the load's clock, which starts the backend during its first wait
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            if not late:
                late.append(ServerThread(lambda: emulated_backend(speed=50.0), port=port))
                late[0].start()
            time.sleep(seconds)

    monkeypatch.setattr(live_bench, "time", Clock)
    with ExitStack() as stack:
        stack.callback(lambda: late and late[0].stop())
        url = stack.enter_context(ServerThread(lambda: Gateway([f"http://127.0.0.1:{port}"])))
        assert httpx.get(f"{url}/v1/models", timeout=20.0).status_code == 503
        assert main(["load", "embedded:azure_conv_2023", "--url", url, "--max-requests", "3",
                     "--rate-scale", "50", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["completed"] == 3 and result["failed"] == 0
    assert "waiting up to 600 s" in captured.err and late
