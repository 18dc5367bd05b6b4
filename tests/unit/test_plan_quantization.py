"""plan's quantization axis: each shape once per mode, modes a GPU lacks skipped with a note,
the vllm serve lines carrying the mode's flags, bad modes one line and exit 2."""

from __future__ import annotations

import json

import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.models import get_model
from fleetsim.search.plan import enumerate_shapes
from fleetsim.search.quant_axis import parse_quantization_axis, with_quantization

_70B = ["--set", "model=llama-3.1-70b", "--set", "workload.max_requests=40"]


def test_axis_names_and_order():
    model = get_model("llama-3.1-70b")
    assert parse_quantization_axis("bf16, fp8,auto,fp8", model) == ["bf16", "fp8"]
    # vLLM's method names are accepted as they are
    assert parse_quantization_axis("awq", model) == ["awq"]
    with pytest.raises(FleetsimInputError, match="--quantization.*w4afp8.*dense"):
        parse_quantization_axis("bf16,w4afp8", model)
    with pytest.raises(FleetsimInputError, match="--quantization"):
        parse_quantization_axis(" , ", model)


def test_each_shape_once_per_mode_its_gpu_runs():
    model = get_model("llama-3.1-70b")
    shapes = enumerate_shapes(["h100", "a100", "b200"], [4], 4)
    out, notes = with_quantization(shapes, ["bf16", "fp8", "nvfp4"], model)
    names = {s.name for s in out}
    assert {"1x H100-SXM tp4 bf16", "1x H100-SXM tp4 fp8", "1x A100-80GB-SXM tp4 bf16",
            "1x B200 tp4 nvfp4", "1x B200 tp4 fp8"} <= names
    assert not any("A100" in n and ("fp8" in n or "nvfp4" in n) for n in names)
    assert not any("H100" in n and "nvfp4" in n for n in names)
    assert len(out) == 3 + 2 + 1  # bf16 everywhere, fp8 off A100, nvfp4 on B200 only
    assert len(notes) == 3  # fp8 on A100, nvfp4 on H100 and on A100
    assert any(n.startswith("skipped fp8: A100") and "FP8 tensor cores" in n for n in notes)
    # a P/D shape is skipped when either pool's GPU lacks the mode
    pd = [s for s in enumerate_shapes(["h100", "a100"], [4], 8, pd=True) if s.is_pd]
    out, _ = with_quantization(pd, ["fp8"], model)
    assert out and all(p.gpu == "H100-SXM" for s in out for p in s.pools)


def test_shape_apply_sets_the_mode_and_bf16_clears_it():
    model = get_model("llama-3.1-70b")
    config = load_config(None, ["model=llama-3.1-70b", "quantization=fp8"])
    (shape,) = enumerate_shapes(["h100"], [4], 4)
    assert shape.apply(config).quantization == "fp8"  # no axis: the config's own
    (bf16, fp8), _ = with_quantization([shape], ["bf16", "fp8"], model)
    assert bf16.apply(config).quantization is None
    assert fp8.apply(load_config(None, ["model=llama-3.1-70b"])).quantization == "fp8"
    assert bf16.family() != fp8.family()  # searches never seed one mode from the other


def test_the_mode_changes_kv_capacity_and_step_time():
    """Each candidate is run with its mode: fp8 weights leave more KV room and decode faster."""
    from fleetsim.run import run

    model = get_model("llama-3.1-70b")
    config = load_config(None, ["model=llama-3.1-70b", "workload.max_requests=40"])
    (shape,) = enumerate_shapes(["h100"], [4], 4)
    (bf16, fp8), _ = with_quantization([shape], ["bf16", "fp8"], model)
    s16, s8 = (run(s.apply(config)).summary for s in (bf16, fp8))
    assert s8["pools"][0]["num_kv_blocks"] > 1.2 * s16["pools"][0]["num_kv_blocks"]
    assert s8["tpot_s"]["mean"] < s16["tpot_s"]["mean"]


def test_plan_over_bf16_fp8_on_h100_picks_and_prints_the_flags(capsys):
    code = main(["plan", "--gpus", "h100", "--tp", "4", "--max-gpus", "4", "--max-runs", "2",
                 "--quantization", "bf16,fp8", "--set", "engine.kv_cache_dtype=fp8", *_70B])
    out = capsys.readouterr().out
    assert code == 0
    assert "1x H100-SXM tp4 fp8" in out and "1x H100-SXM tp4 bf16" in out
    lines = out.splitlines()
    # fp8 decodes faster at the same goodput: it is on the tokens/s/user front, and its
    # vllm serve line (printed under its name) carries both flags
    serve = lines[lines.index("1x H100-SXM tp4 fp8:") + 1]
    assert serve.strip().startswith("vllm serve meta-llama/Llama-3.1-70B")
    assert "--tensor-parallel-size 4" in serve
    assert "--quantization fp8 --kv-cache-dtype fp8" in serve
    assert "skipped" not in out


def test_plan_json_rows_name_their_mode(capsys):
    code = main(["plan", "--gpus", "h100,a100", "--tp", "4", "--max-gpus", "4", "--max-runs",
                 "1", "--quantization", "bf16,fp8", "--json", *_70B])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert code in (0, 1)
    modes = {(r["shape"].split()[1], r.get("quantization")) for r in result["points"]}
    assert modes == {("H100-SXM", "bf16"), ("H100-SXM", "fp8"), ("A100-80GB-SXM", "bf16")}
    for r in result["points"]:
        for line in r.get("vllm_serve", []):
            assert ("--quantization fp8" in line) == (r["quantization"] == "fp8")
    (note,) = result["skipped"]
    assert note.startswith("skipped fp8: A100-80GB-SXM has no FP8 tensor cores")
    assert "fleetsim: skipped fp8: A100" in captured.err


def test_a100_with_fp8_is_skipped_with_a_note(capsys):
    code = main(["plan", "--gpus", "h100,a100", "--tp", "4", "--max-gpus", "4", "--max-runs",
                 "1", "--quantization", "fp8", *_70B])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "skipped fp8: A100-80GB-SXM has no FP8 tensor cores" in out
    assert "A100-80GB-SXM tp4 fp8" not in out


@pytest.mark.parametrize(("value", "needle"), [
    ("bf16,fp9", "'fp9'; unknown mode; use bf16 or one of fp8"),
    ("w4afp8", "dense"),
    (",", "e.g. bf16,fp8"),
])
def test_bad_modes_are_one_line_exit_2(capsys, value, needle):
    assert main(["plan", "--gpus", "h100", "--tp", "4", "--quantization", value, *_70B]) == 2
    err = capsys.readouterr().err
    assert "--quantization" in err and needle in err and err.count("\n") == 1


def test_only_unsupported_modes_is_one_line_exit_2(capsys):
    assert main(["plan", "--gpus", "a100", "--tp", "4", "--quantization", "fp8", *_70B]) == 2
    err = capsys.readouterr().err
    assert "no GPU of --gpus runs fp8" in err and err.count("\n") == 1
