"""Issue 24, smaller defects a newcomer hit: the GPU catalog's FP8 column, titles naming
replicas and P/D roles, ``trace info`` formatting, the ITL hint, result-folder permissions
and ``run``'s --model/--gpu/--tp shorthands."""

from __future__ import annotations

import json
import os
import stat

import pytest

from fleetsim.cli import main
from fleetsim.hardware import get_gpu


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- the GPU catalog against vendor datasheets ---------------------------------------------
# Dense (no sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's datasheets (A100 80GB SXM,
# H100 SXM5, H200 SXM, H20 product brief, H800 SXM5, L40S, HGX B200 / 8, GB200 NVL72 / 72).
# None: the datasheet lists no FP8 (Ampere has no FP8 tensor cores).
DATASHEET_TFLOPS = {
    "a100": (312, None), "h100": (989, 1979), "h200": (989, 1979), "h20": (148, 296),
    "h800": (989, 1979), "l40s": (362, 733), "b200": (2250, 4500), "gb200": (2500, 5000),
}


@pytest.mark.parametrize("name", sorted(DATASHEET_TFLOPS))
def test_catalog_peaks_match_the_datasheets(name):
    bf16, fp8 = DATASHEET_TFLOPS[name]
    g = get_gpu(name)
    assert g.peak_bf16_flops == bf16 * 1e12
    assert g.peak_fp8_flops == (None if fp8 is None else fp8 * 1e12)
    # FP8 checkpoints still run on the A100, weight-only at the BF16 rate.
    assert g.fp8_gemm_flops == (fp8 or bf16) * 1e12


def test_gpus_table_says_the_a100_has_no_fp8(capsys):
    code, out, _ = cli(capsys, "gpus")
    assert code == 0
    a100 = next(line for line in out.splitlines() if "A100" in line)
    assert "no FP8 units" in a100 and "312" in a100 and a100.count("312") == 1
    code, out, _ = cli(capsys, "gpus", "--format", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["A100-80GB-SXM"]["peak_fp8_flops"] is None


def test_catalog_entry_without_fp8_loads_and_a_bad_one_is_refused(tmp_path):
    from fleetsim.hardware.gpu import load_gpu_catalog

    base = ("[[gpu]]\nname='X'\npeak_bf16_flops=1e15\nhbm_bytes=8e10\nhbm_bw_bytes_per_s=2e12\n"
            "nvlink_bw_bytes_per_s=3e11\nnetwork_bw_bytes_per_s=2.5e10\nnum_gpus_per_node=8\n"
            "price_per_hour_usd=1.0\n")
    path = tmp_path / "g.toml"
    path.write_text(base)
    assert load_gpu_catalog(path)[0].peak_fp8_flops is None
    path.write_text(base + "peak_fp8_flops=-1\n")
    with pytest.raises(ValueError, match="peak_fp8_flops must be > 0"):
        load_gpu_catalog(path)


# ---- titles: replicas, TP and P/D roles ------------------------------------------------
FAST = ["--set", "workload.max_requests=20"]


@pytest.mark.parametrize(("sets", "title"), [
    (["hardware.num_replicas=2"], "on 2x H100-SXM, TP 1 —"),
    (["hardware.num_replicas=4"], "on 4x H100-SXM, TP 1 —"),
    (["hardware.tp=2"], "on 1x H100-SXM, TP 2 (2 GPUs) —"),
    (['cluster.pools=[{name="p",gpu="h200",role="prefill"},'
      '{name="d",gpu="a100",role="decode",num_replicas=2}]'],
     "on prefill 1x H200, TP 1 + decode 2x A100-80GB-SXM, TP 1 —"),
])
def test_run_title_names_replicas_tp_and_roles(tmp_path, capsys, sets, title):
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = cli(capsys, "run", "--out", str(tmp_path / "o"), *FAST, *args)
    assert code == 0, err
    assert title in " ".join(out.split())


def test_report_header_names_pools_and_roles(tmp_path):
    from fleetsim.report.html import _hardware
    from fleetsim.report.load import RunData

    summary = {"gpu": "H200 + A100-80GB-SXM", "tp": 1, "num_replicas": 3, "pools": [
        {"name": "p", "gpu": "H200", "role": "prefill", "num_replicas": 1, "tp": 1},
        {"name": "d", "gpu": "A100-80GB-SXM", "role": "decode", "num_replicas": 2, "tp": 1}]}
    run = RunData(path=tmp_path, label="r", summary=summary, config=None)
    assert _hardware(run) == "prefill 1x H200, TP 1 + decode 2x A100-80GB-SXM, TP 1"


# ---- the ITL row says how to turn ITL on -----------------------------------------------
def test_itl_row_without_tracking_says_how_to_turn_it_on(tmp_path, capsys):
    code, out, _ = cli(capsys, "run", "--out", str(tmp_path / "o"), *FAST)
    assert code == 0
    assert "ITL, all gaps (s) ¹" in out
    assert "turn it on with --set engine.track_itl=true" in out
    code, out, _ = cli(capsys, "run", "--out", str(tmp_path / "t"), *FAST,
                       "--set", "engine.track_itl=true")
    assert code == 0 and "track_itl" not in out and "¹" not in out


# ---- trace info for people ---------------------------------------------------------------
def test_trace_info_table_has_labels_units_one_format_and_no_none(capsys):
    code, out, _ = cli(capsys, "trace", "info", "embedded:azure_conv_2023")
    assert code == 0
    for raw in ("None", "prompt_tokens_p50", "mean_rate_per_s", "iat_cv", "hash_block"):
        assert raw not in out
    assert "requests" in out and "4,424" in out
    assert "899.9 s" in out and "4.92 req/s" in out
    assert "prefix-block hashes" in out and "none in this trace" in out
    prompt = next(line.split() for line in out.splitlines() if line.strip().startswith("prompt"))
    assert prompt[1:] == ["1,173", "1,047", "2,423", "4,109", "7,930"]  # one format per kind
    code, out, _ = cli(capsys, "trace", "info", "embedded:mooncake_conversation_10min")
    assert "512 tokens" in out and "48,671 (34,850)" in out and "28.4%" in out
    code, out, _ = cli(capsys, "trace", "info", "embedded:azure_conv_2023", "--format", "json")
    assert json.loads(out)["hash_block_tokens"] is None  # the data keeps its raw keys


# ---- result folders and reports follow the umask ------------------------------------------
@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    saved = os.umask(0o022)
    os.umask(saved)
    yield set_mask
    os.umask(saved)


@pytest.mark.parametrize(("mask", "folder", "file"), [(0o022, 0o755, 0o644),
                                                      (0o002, 0o775, 0o664),
                                                      (0o077, 0o700, 0o600)])
def test_results_and_reports_follow_the_umask(tmp_path, capsys, umask, mask, folder, file):
    from fleetsim.results import write_file

    umask(mask)
    out = tmp_path / "o"
    assert cli(capsys, "run", "--out", str(out), *FAST)[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == folder
    assert stat.S_IMODE((out / "summary.json").stat().st_mode) == file
    report = tmp_path / "r.html"
    write_file(report, "<html></html>")  # what report --out, --plot and --vllm-json use
    assert stat.S_IMODE(report.stat().st_mode) == file


# ---- run --model/--gpu/--tp ---------------------------------------------------------------
def test_run_model_gpu_tp_flags_are_the_config_keys(tmp_path, capsys):
    out = tmp_path / "o"
    code, _, err = cli(capsys, "run", "--out", str(out), *FAST, "--model",
                       "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h200", "--tp", "2")
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert config["hardware"]["gpu"] == "h200" and config["hardware"]["tp"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"] == "H200" and summary["tp"] == 2
    # the flags win over --set of the same key
    code, _, err = cli(capsys, "run", "--out", str(out), "--force", *FAST,
                       "--set", "hardware.gpu=a100", "--gpu", "h100")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["hardware"]["gpu"] == "h100"


@pytest.mark.parametrize(("flags", "message"), [
    (["--tp", "abc"], "--tp: got 'abc'; expected an integer >= 1"),
    (["--tp", "0"], "--tp: got '0'; must be >= 1"),
    (["--gpu", "zz"], "got 'zz'; unknown GPU; known: A100-80GB-SXM"),
    (["--model", "zzz"], "got 'zzz'; unknown model"),
])
def test_run_shorthand_bad_values_are_one_line_exit_2(tmp_path, capsys, flags, message):
    code, _, err = cli(capsys, "run", "--out", str(tmp_path / "o"), *FAST, *flags)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


# ---- progress bars with an ETA ------------------------------------------------------------
@pytest.fixture
def terminal(monkeypatch):
    """stderr treated as a terminal (rich honours TTY_COMPATIBLE), so the bars are drawn."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "200")


def test_sweep_progress_shows_an_eta(tmp_path, capsys, terminal):
    spec = tmp_path / "s.toml"
    spec.write_text('[base.workload]\nmax_requests = 20\n[grid]\n"workload.rate_scale" = [1, 2]\n')
    code, _, err = cli(capsys, "sweep", str(spec), "--workers", "1", "--out", str(tmp_path / "o"))
    assert code == 0 and "ETA" in err and "/2" in err


def test_plan_progress_shows_an_eta(tmp_path, capsys, terminal):
    code, _, err = cli(capsys, "plan", "--gpus", "h100", "--tp", "1", "--max-gpus", "1",
                       "--requests-per-gpu", "60", "--max-runs", "3", *FAST)
    assert code in (0, 1) and "ETA" in err and "/1" in err


def test_report_progress_shows_an_eta(tmp_path, capsys, terminal):
    pytest.importorskip("matplotlib")
    out = tmp_path / "o"
    assert cli(capsys, "run", "--out", str(out), *FAST)[0] == 0
    code, _, err = cli(capsys, "report", str(out))
    assert code == 0 and "ETA" in err and "/5" in err


def test_repro_progress_shows_an_eta(capsys, terminal, monkeypatch):
    import argparse

    from fleetsim.repro import cli as repro_cli
    from fleetsim.repro import get_reproduction

    def fake_run(repro, quick, overrides, progress=None, subruns=None):  # labels, no simulation
        for label in ("a", "b", "c"):
            progress(label)
        return None, None

    monkeypatch.setattr("fleetsim.repro.frame.run_reproduction", fake_run)
    args = argparse.Namespace(quick=True, overrides=[], workers=None)
    repro_cli._run(get_reproduction("fastserve"), args)
    assert "ETA" in capsys.readouterr()[1]


# ---- plan verifies its picks at the rate it reports ---------------------------------------
def test_plan_pick_is_verified_on_the_whole_workload_with_a_caveat(tmp_path, capsys):
    """The README's --requests-per-gpu 300 put one H100 at about 34 req/s, where a search on
    the whole embedded trace finds about 18: the pick is rerun at its rate on the whole
    workload, and the miss is said."""
    out = tmp_path / "plan"
    code, stdout, _ = cli(capsys, "plan", "--gpus", "h100", "--tp", "1", "--max-gpus", "1",
                          "--requests-per-gpu", "300", "--out", str(out))
    assert code == 0
    row = json.loads((out / "plan.json").read_text())["points"][0]
    v = row["verified"]
    assert v["rate_per_s"] == row["goodput_requests_per_s"] > 25
    assert v["num_requests"] == 4424 and v["attainment"] < 0.9 and not v["met"]
    assert "caveat: 1x H100-SXM tp1:" in stdout and "300 requests per GPU" in stdout
    assert "SLO met on the whole workload" in stdout
    pytest.importorskip("matplotlib")
    assert cli(capsys, "report", str(out))[0] == 0
    page = (out / "report.html").read_text()
    assert "SLO met on the whole workload" in page and "the goodput is overstated" in page


def test_plan_on_the_configs_own_slice_is_not_reverified(tmp_path, capsys):
    code, stdout, _ = cli(capsys, "plan", "--gpus", "h100", "--tp", "1", "--max-gpus", "1",
                          "--json", "--set", "workload.max_requests=300")
    assert code == 0
    assert "verified" not in json.loads(stdout)["points"][0] and "caveat" not in stdout
