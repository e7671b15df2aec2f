"""`--precision fp8`: which layers torchao's float8 training takes, where it is refused, and
the torch/torchao pairing in uv.lock (the end-to-end numerics are in test_float8_torchrun.py).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import torchao
from torch import nn

from tests.trainer.torchrun_util import REPO_ROOT, tiny_args
from trainer import float8
from trainer.config import parse_args
from trainer.float8 import (
    TORCHAO_TORCH_RANGE,
    Float8Error,
    Float8Plan,
    check_fp8_device,
    check_torch_pairing,
    convert_to_float8,
    plan_float8,
    torch_release,
)
from trainer.models import build_model, hf_config_from
from trainer.presets import get_preset
from trainer.tiny_assets import TinyAssets


def _converted(preset: str, recipe: str, *, emulate: bool = False) -> dict[str, int]:
    """Converted layers of a preset built on the meta device, counted by their last name."""
    model = build_model(hf_config_from(get_preset(preset)))
    names = convert_to_float8(model, Float8Plan(recipe=recipe, emulate=emulate))
    counts: dict[str, int] = {}
    for name in names:
        counts[name.rsplit(".", 1)[-1]] = counts.get(name.rsplit(".", 1)[-1], 0) + 1
    return counts


@pytest.mark.parametrize(
    ("preset", "recipe", "expected"),
    [
        # k/v projections are [1024, 3072]: below torchao's rowwise and tensorwise thresholds.
        ("llama3.2-3b", "rowwise", ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        ("llama3.2-3b", "tensorwise", ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        # 1B: hidden 2048 is at rowwise's out_features floor; tensorwise takes q and o too.
        ("llama3.2-1b", "rowwise", ("gate_proj", "up_proj")),
        ("llama3.2-1b", "tensorwise", ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        ("llama3.1-8b", "rowwise", ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        # Mixtral's experts are fused parameters, its router [8, 4096] not a multiple of 16.
        ("mixtral-8x7b", "rowwise", ("q_proj", "o_proj")),
    ],
)
def test_the_filter_takes_the_large_decoder_projections_and_never_the_head(
    preset: str, recipe: str, expected: tuple[str, ...]
) -> None:
    layers = get_preset(preset).num_layers
    assert _converted(preset, recipe) == dict.fromkeys(expected, layers)


def test_conversion_keeps_weights_ties_and_state_dict_keys() -> None:
    """Float8Linear reuses each layer's Parameter: the state dict is a bf16 model's."""
    config = hf_config_from(get_preset("tiny"))
    plain, converted = build_model(config), build_model(config)
    names = convert_to_float8(converted, Float8Plan(recipe="rowwise", emulate=True))
    from torchao.float8.float8_linear import Float8Linear

    # Emulation converts every projection (the tiny shapes are far below the size filter),
    # never the head.
    assert len(names) == 7 * config.num_hidden_layers
    assert all(isinstance(converted.get_submodule(name), Float8Linear) for name in names)
    assert type(converted.lm_head) is nn.Linear
    assert list(converted.state_dict()) == list(plain.state_dict())
    tied = build_model(hf_config_from(get_preset("llama3.2-1b").with_overrides(num_layers=1)))
    convert_to_float8(tied, Float8Plan(recipe="tensorwise"))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_float8_all_gather_only_for_tensorwise_over_several_ranks_without_offload() -> None:
    def gathers(recipe: str, shard_group_size: int, cpu_offload: bool = False) -> bool:
        plan = plan_float8(
            recipe, emulate=False, shard_group_size=shard_group_size, cpu_offload=cpu_offload
        )
        return plan.all_gather

    assert gathers("tensorwise", 8)
    assert not gathers("tensorwise", 1)
    assert not gathers("rowwise", 8)
    assert not gathers("tensorwise", 8, cpu_offload=True)
    with pytest.raises(ValueError, match="--fp8_recipe 'mx'"):
        Float8Plan(recipe="mx")


def test_a_copy_of_torchao_s_float8_weight_drops_its_precomputed_scale() -> None:
    """Why CPU offload gathers in bf16: FSDP2 copies an offloaded shard to the GPU before its
    all-gather (`FSDPParam.all_gather_inputs`), an `aten._to_copy` like this dtype change;
    torchao keeps its wrapper through it, without the scale precomputed for the weight."""
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    weight = WeightWithDynamicFloat8CastTensor(
        torch.ones(16, 16), LinearMMConfig(), torch.float8_e4m3fn, torch.tensor(2.0)
    )
    assert weight._precomputed_scale is not None
    copied = weight.to(torch.float64)
    assert isinstance(copied, WeightWithDynamicFloat8CastTensor)
    assert copied._precomputed_scale is None


def test_a_device_without_fp8_tensor_cores_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Float8Error, match=r"this run is on cpu; use --precision bf16"):
        check_fp8_device(torch.device("cpu"), emulate=False)
    check_fp8_device(torch.device("cpu"), emulate=True)  # tests' emulation
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10G")
    for capability, refused in (((8, 6), True), ((8, 0), True), ((8, 9), False), ((9, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: c)
        if refused:
            with pytest.raises(Float8Error, match=r"NVIDIA A10G is 8\.\d; use --precision bf16"):
                check_fp8_device(torch.device("cuda", 0), emulate=False)
        else:
            check_fp8_device(torch.device("cuda", 0), emulate=False)


@pytest.mark.parametrize(
    ("version", "runs"),
    [
        ("2.13.0", True),
        ("2.11.0a0+b4e4ee81d3.nv26.03", True),  # an NGC base image's torch
        ("2.10.0", False),
        ("2.14.0", False),
    ],
)
def test_torch_outside_the_pinned_torchao_range_is_one_line(version: str, runs: bool) -> None:
    if runs:
        check_torch_pairing(version)
    else:
        with pytest.raises(Float8Error, match=rf"this is torch {re.escape(version)};"):
            check_torch_pairing(version)


def _locked_versions() -> dict[str, str]:
    lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def test_uv_lock_pairs_torchao_with_a_torch_it_runs_with() -> None:
    """The lock's torch is in the range the pinned torchao runs with; the installed torchao is
    the locked one; and the range's floor is what that torchao's own import check demands
    (torchao/__init__.py), so a torchao bump that raises its floor fails here first."""
    locked = _locked_versions()
    assert locked["torchao"] == torchao.__version__
    low, high = TORCHAO_TORCH_RANGE
    assert low <= torch_release(locked["torch"]) <= high, locked["torch"]
    floor = re.search(
        r'min_torch_version = _parse_version\("([\d.]+)"\)', inspect.getsource(torchao)
    )
    assert floor is not None, "torchao's import-time torch check moved: re-read torchao/__init__"
    assert torch_release(floor.group(1)) == low
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert f"torchao=={locked['torchao']}" in pyproject["dependency-groups"]["trainer"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--precision", "fp8", "--compile", "0"], "--precision fp8 needs --compile 1"),
        (["--precision", "fp8", "--bf16", "0"], "--precision fp8 needs --bf16 1"),
        (["--fp8_emulate", "1"], "--fp8_emulate applies only to --precision fp8"),
        (["--fp8_recipe", "mxfp8"], "invalid choice: 'mxfp8'"),
    ],
)
def test_bad_precision_flags_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(flags)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_emulation_may_run_uncompiled() -> None:
    cfg = parse_args(["--precision", "fp8", "--fp8_emulate", "1", "--compile", "0"])
    assert (cfg.parallel.precision, cfg.parallel.fp8_recipe) == ("fp8", "rowwise")


@pytest.mark.slow
def test_fp8_on_a_cpu_ends_in_one_line_not_a_traceback(
    tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    args = tiny_args(tiny_assets, bf16=1, precision="fp8", max_steps=1, warmup=1)
    done = subprocess.run(
        [sys.executable, "-m", "trainer", *args, "--metrics_file", str(tmp_path / "m.jsonl")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(REPO_ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
             "HF_DATASETS_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("trainer: error: --precision fp8 needs a GPU with FP8 tensor cores")
    assert "this run is on cpu; use --precision bf16" in last


def test_module_docstring_names_the_thresholds_torchao_applies() -> None:
    """The docstring's thresholds are torchao's, read from the pinned source."""
    from torchao.float8 import float8_linear_utils

    source = inspect.getsource(float8_linear_utils._auto_filter_for_rowwise)
    assert "N <= 2048" in source and "K <= 1024" in source and "N <= 4096 and K <= 2048" in source
    assert "out_features <= 2048, or in_features <= 1024" in (float8.__doc__ or "")
