"""Issue 24, smaller defects a newcomer hit: the GPU catalog's FP8 column, titles naming
replicas and P/D roles, ``trace info`` formatting, the ITL hint, result-folder permissions
and ``run``'s --model/--gpu/--tp shorthands."""

from __future__ import annotations

import json

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
