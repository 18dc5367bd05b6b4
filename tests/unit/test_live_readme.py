"""The README's live block runs as a script: servers started in the background, then
``fleetsim load`` at once, which waits for them to be ready (as ``vllm bench serve
--ready-check-timeout-sec`` does) instead of failing.

Run on loopback ports chosen now (they replace the README's 18000-18002), with fewer requests
than the README sends (bounded time), and every process the script starts is stopped after."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FLEETSIM = f"{sys.executable} -m fleetsim"


def live_block() -> str:
    section = README[README.index("Three commands: two emulated H100s"):]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "no sh block after the live section's heading"
    return m.group(1)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def as_script(block: str, ports: dict[str, int], num_requests: int) -> str:
    for readme_port, port in ports.items():
        block = block.replace(f":{readme_port}", f":{port}").replace(f"--port {readme_port}",
                                                                     f"--port {port}")
    block = re.sub(r"--max-requests \d+", f"--max-requests {num_requests}", block)
    return block.replace(".venv/bin/fleetsim", FLEETSIM)


def stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to every process of the script's group, SIGKILL to those left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def test_the_live_block_is_three_servers_then_load():
    block = live_block()
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[-1].startswith(".venv/bin/fleetsim load") and not lines[-1].endswith("&")
    assert all(line.rstrip().endswith("&") for line in lines[:-1])
    assert "--ready-check-timeout-sec" not in block  # waiting is the default


@pytest.mark.slow
def test_the_readme_live_block_runs_as_a_script(tmp_path):
    ports = dict(zip(("18000", "18001", "18002"), free_ports(3), strict=True))
    script = as_script(live_block(), ports, num_requests=8)
    assert "18000" not in script and "--max-requests 8" in script
    # The load's JSON (the README prints the table) checks what it measured.
    script = script.rstrip("\n") + " --json --ready-check-timeout-sec 240\n"
    # Output to files: the servers left running keep a pipe open, so no EOF to wait for.
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, stdout=out_file,
                                stderr=err_file, text=True, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                     "COLUMNS": "80"})
    try:
        proc.wait(timeout=300)
    finally:
        # The servers outlive the script (as in a terminal): stop the whole group.
        stop_group(proc)
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    result = json.loads(out[out.index("{"):])
    assert result["completed"] == 8 and result["failed"] == 0
    rows = [json.loads(line) for line in (tmp_path / "traffic.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    # The README's next step, as it says it: replay the recording (no hash block flag: the
    # trace carries it), then compare.
    for cmd in ("run --set workload.trace='\"traffic.jsonl\"' --set hardware.num_replicas=2 "
                "--set cluster.router.name=least_loaded --out sim --json",
                "compare traffic.jsonl sim --json"):
        proc = subprocess.run(["bash", "-c", f"{FLEETSIM} {cmd}"], cwd=tmp_path, text=True,
                              capture_output=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["num_predicted"] == 8
