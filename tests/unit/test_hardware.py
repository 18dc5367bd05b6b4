"""GPU catalog: lookups, aliases, user TOML catalogs."""

from __future__ import annotations

import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec, get_gpu, list_gpus

REQUIRED = ("A100-80GB-SXM", "H100-SXM", "H200", "H20", "L40S", "B200")


def test_catalog_has_required_gpus():
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h100", "H100-SXM"),
        ("H100-SXM", "H100-SXM"),
        ("a100", "A100-80GB-SXM"),
        ("A100-80GB", "A100-80GB-SXM"),
        ("h200", "H200"),
        ("l40s", "L40S"),
        ("B200", "B200"),
    ],
)
def test_aliases_case_insensitive(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_gpu_lists_known_names():
    with pytest.raises(FleetsimInputError, match="H100-SXM") as err:
        get_gpu("tpu-v9")
    assert "tpu-v9" in str(err.value)


def test_h100_datasheet_numbers():
    g = get_gpu("h100")
    assert g.peak_bf16_flops == pytest.approx(989e12)
    assert g.hbm_bw_bytes_per_s == pytest.approx(3.35e12)
    assert g.aic_system == "h100_sxm"
    assert get_gpu("h20").aic_system is None


def test_gpuspec_is_frozen_and_slotted():
    g = get_gpu("h100")
    with pytest.raises(AttributeError):
        g.name = "x"  # type: ignore[misc]
    assert not hasattr(g, "__dict__")


GOOD = """
[[gpu]]
name = "MyGPU"
peak_bf16_flops = 1e15
peak_fp8_flops = 2e15
hbm_bytes = 96e9
hbm_bw_bytes_per_s = 4e12
nvlink_bw_bytes_per_s = 4.5e11
network_bw_bytes_per_s = 5e10
num_gpus_per_node = 8
price_per_hour_usd = 2.0
"""


def test_user_toml_gpu(tmp_path):
    path = tmp_path / "gpus.toml"
    path.write_text(GOOD)
    g = get_gpu("mygpu", catalog_path=path)
    assert isinstance(g, GPUSpec)
    assert g.hbm_bytes == 96e9
    assert g.aic_system is None
    assert "MyGPU" in {x.name for x in list_gpus(path)}


def test_user_toml_unknown_key_names_file_and_field(tmp_path):
    path = tmp_path / "gpus.toml"
    path.write_text(GOOD + "hbm_gb = 3\n")
    with pytest.raises(FleetsimInputError, match=r"gpus.toml: gpu\[0\].hbm_gb"):
        list_gpus(path)


def test_user_toml_missing_field_names_file_and_field(tmp_path):
    path = tmp_path / "gpus.toml"
    path.write_text(GOOD.replace("hbm_bytes = 96e9\n", ""))
    with pytest.raises(FleetsimInputError, match=r"gpus.toml: gpu\[0\].hbm_bytes"):
        list_gpus(path)


def test_user_toml_bad_value(tmp_path):
    path = tmp_path / "gpus.toml"
    path.write_text(GOOD.replace("num_gpus_per_node = 8", "num_gpus_per_node = 0"))
    with pytest.raises(FleetsimInputError, match="num_gpus_per_node"):
        list_gpus(path)
