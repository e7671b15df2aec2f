"""`training.precision: fp8` in the stack: refused before anything is paid for on GPUs without
FP8 tensor cores, rendered into the trainer's own flags, estimated faster (assumed), its
emulation kept to tests and the local rehearsal (issue 24). The memory estimate is bf16's by
design (infra/estimates/memory_fit.py says why)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import StackConfigError
from infra.config.trainer_keys import rendered_flag_names
from infra.estimates.duration import FP8_SPEEDUP_BY_GPU, MFU_BY_GPU, estimate_duration
from infra.facts.instances import GPU_COMPUTE_CAPABILITY, INSTANCE_FACTS
from infra.job.flags import format_args, trainer_flags
from infra.job.stack_checks import checked_run_plan
from tests.cli.conftest import assert_one_line_mistake, run_cli
from trainer.config import parse_args
from trainer.flops import MIN_FP8_CAPABILITY


def stack(instance_type: str, count: int = 2, **training: Any) -> dict[str, Any]:
    return {
        "fsdp-eks:gpuNodes": {"instanceType": instance_type, "count": count},
        "fsdp-eks:model": {"preset": "llama3.2-3b"},
        "fsdp-eks:training": {"maxSteps": 200, **training},
        "fsdp-eks:cost": {"maxUsdPerRun": None},
    }


def planned(values: dict[str, Any]) -> Any:
    return checked_run_plan(values, stack_name="precision")


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(StackConfigError) as error:
        planned(values)
    return error.value.problems


@pytest.mark.parametrize(("instance_type", "gpu"), [("g5.12xlarge", "A10G"),
                                                    ("p4d.24xlarge", "A100")])  # fmt: skip
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_naming_the_key(
    instance_type: str, gpu: str
) -> None:
    [message] = problems(stack(instance_type, precision="fp8"))
    assert message.startswith("training.precision 'fp8' needs FP8 tensor cores")
    assert f"the {gpu} of gpuNodes.instanceType {instance_type!r} lacks" in message
    assert "allowed here: bf16, or fp8 on g6e, p5, p5e, p5en, p6-b200 instances" in message


def test_the_plan_refuses_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.fp8.yaml"
    path.write_text(yaml.safe_dump({"config": stack("p4d.24xlarge", precision="fp8")}))
    assert_one_line_mistake(run_cli("plan", str(path)), "training.precision 'fp8' needs FP8")


@pytest.mark.parametrize(
    ("training", "fragment"),
    [
        (
            {"fp8Recipe": "tensorwise"},
            "training.fp8Recipe 'tensorwise': the trainer refuses it: "
            "--fp8_recipe tensorwise applies only to --precision fp8, not bf16 (--precision is "
            "training.precision)",
        ),
        (
            {"precision": "fp8", "compile": False},
            "training.precision 'fp8': the trainer refuses it: --precision fp8 needs --compile 1",
        ),
        (
            {"precision": "fp8", "bf16": False},
            "training.precision 'fp8': the trainer refuses it: --precision fp8 needs --bf16 1",
        ),
        ({"precision": "fp16"}, "training.precision"),
    ],
)
def test_settings_fp8_cannot_run_with_are_refused(training: dict[str, Any], fragment: str) -> None:
    assert any(fragment in p for p in problems(stack("p5.48xlarge", **training)))


def test_the_precision_flags_are_the_stacks_keys_not_extra_args() -> None:
    assert {"precision", "fp8_recipe"} <= rendered_flag_names()
    [message] = problems(stack("p5.48xlarge", extraArgs={"precision": "fp8"}))
    assert "training.extraArgs.precision is set from its own stack key; allowed: " in message
    assert message.endswith("training.precision instead")


@pytest.mark.parametrize(("recipe", "expected"), [(None, "rowwise"), ("rowwise", "rowwise"),
                                                  ("tensorwise", "tensorwise")])  # fmt: skip
def test_fp8_is_rendered_into_flags_the_trainer_accepts(recipe: str | None, expected: str) -> None:
    training: dict[str, Any] = {"precision": "fp8", **({"fp8Recipe": recipe} if recipe else {})}
    flags = trainer_flags(planned(stack("p5.48xlarge", **training)))
    assert flags["precision"] == "fp8"
    parsed = parse_args(format_args(flags))
    assert (parsed.parallel.precision, parsed.parallel.fp8_recipe) == ("fp8", expected)
    assert parsed.parallel.fp8_emulate is False  # only the local rehearsal emulates


def test_bf16_stays_the_default() -> None:
    parsed = parse_args(format_args(trainer_flags(planned(stack("p5.48xlarge")))))
    assert parsed.parallel.precision == "bf16"


def test_every_gpu_has_a_compute_capability_and_the_fp8_ones_a_speedup() -> None:
    """One source for what each GPU can do: the fp8 table covers exactly the GPUs the config
    lets fp8 run on, and the trainer checks the device against the same figure."""
    import trainer.float8

    models = {facts.gpu_model for facts in INSTANCE_FACTS.values()}
    assert models == set(GPU_COMPUTE_CAPABILITY) == set(MFU_BY_GPU)
    fp8_capable = {m for m in models if GPU_COMPUTE_CAPABILITY[m] >= MIN_FP8_CAPABILITY}
    assert fp8_capable == set(FP8_SPEEDUP_BY_GPU) == {"L40S", "H100", "H200", "B200"}
    assert trainer.float8.MIN_FP8_CAPABILITY is MIN_FP8_CAPABILITY


@pytest.mark.parametrize(("recipe", "gain"), [("rowwise", 1.10), ("tensorwise", 1.25)])
def test_fp8_shortens_the_estimate_by_its_assumed_speedup_on_hopper(
    recipe: str, gain: float
) -> None:
    bf16 = estimate_duration(planned(stack("p5.48xlarge")).config)
    fp8 = estimate_duration(planned(stack("p5.48xlarge", precision="fp8", fp8Recipe=recipe)).config)
    assert fp8.mfu.expected == pytest.approx(bf16.mfu.expected * gain)
    assert fp8.mfu.low == bf16.mfu.low  # at worst no gain: the deadline check stays honest
    assert fp8.training_hours == pytest.approx(bf16.training_hours / gain)
    assert f"(fp8 {recipe}, assumed, range" in fp8.summary()
    assert "(bf16, assumed, range" in bf16.summary()
    assert not fp8.mfu.measured and "torchao/float8/README.md" in fp8.mfu.source


def test_no_gain_is_assumed_on_l40s() -> None:
    bf16 = estimate_duration(planned(stack("g6e.12xlarge", count=1)).config)
    fp8 = estimate_duration(planned(stack("g6e.12xlarge", count=1, precision="fp8")).config)
    assert fp8.hours == pytest.approx(bf16.hours)


@pytest.mark.parametrize("flag", ["fp8_emulate", "fail_at_step", "nan_at_step",
                                  "preflight_fail_check"])  # fmt: skip
def test_test_only_trainer_flags_are_refused_in_extra_args(flag: str) -> None:
    """fp8 emulation would lift the FP8-GPU and compile checks and run fp32 matmuls while the
    plan assumes fp8's gain; an injected fault would crash a paid run on purpose."""
    [message] = problems(stack("p5.48xlarge", precision="fp8", extraArgs={flag: 1}))
    assert message.startswith(f"training.extraArgs.{flag} is a test-only trainer flag")


def test_the_plan_shows_the_precision(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.fp8.yaml"
    path.write_text(yaml.safe_dump({"config": stack("p5.48xlarge", precision="fp8",
                                                    fp8Recipe="tensorwise")}))  # fmt: skip
    result = run_cli("plan", str(path))
    assert result.code == 0, result
    assert "fp8 tensorwise matmuls (torchao; the LM head and small layers in bf16)" in result.out
    assert "MFU (fp8 tensorwise, assumed" in result.out


def test_the_local_rehearsal_emulates_fp8(tmp_path: Path) -> None:
    from scripts.cli.support.local_topology import plan_local_run

    run = planned(stack("g6e.12xlarge", count=1, precision="fp8"))
    local = plan_local_run(run, "fp8", out_dir=tmp_path, assets_dir=tmp_path / "assets",
                           steps=4, context=16, batch_size=1, device="cpu", nproc=1)  # fmt: skip
    parsed = parse_args(local.agents[0].args)
    assert parsed.parallel.precision == "fp8"
    assert parsed.parallel.fp8_emulate and parsed.parallel.bf16 and not parsed.parallel.compile
