"""fp8 numerics and checkpoints end to end: `torchrun --nproc_per_node=2 -m trainer` on the CPU
with gloo and torchao's emulation (`--fp8_emulate`: the float8-rounded operands multiplied in
fp32, so the numbers are those of FP8 training and the speed is not).

Tolerance: every logged loss within 1% of the bf16 run's (docs/benchmarks.md "fp8 numerics").
Why 1%: docs/design/tests.md#test_float8_torchrun
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from tests.trainer.torchrun_util import RunResult, run_trainer, tiny_args
from trainer.tiny_assets import TinyAssets

pytestmark = pytest.mark.slow

STEPS = 12
TOLERANCE = 0.01


def _run(assets: TinyAssets, root: Path, name: str, **extra: Any) -> RunResult:
    run_dir = root / name
    # A constant learning rate: a segment run to an earlier --max_steps follows the same
    # schedule as the whole run.
    values = {"max_steps": STEPS, "bf16": 1, "warmup": 0, "lr_decay_style": "constant", **extra}
    args = tiny_args(assets, **values)
    result = run_trainer(args, metrics_file=run_dir / "metrics.jsonl", timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    return result


def _export_layout(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    layout = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - a safe_open handle is not a mapping
                tensor = handle.get_tensor(key)
                layout[key] = (str(tensor.dtype), tuple(tensor.shape))
    return layout


@pytest.fixture(scope="module")
def bf16_run(tiny_assets: TinyAssets, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("bf16")
    result = _run(
        tiny_assets,
        root,
        "run",
        checkpoint_dir=root / "ckpt",
        checkpoint_freq=STEPS // 2,
        export_dir=root / "export",
    )
    return root, result


def test_fp8_rowwise_trains_within_one_percent_of_bf16(
    tiny_assets: TinyAssets, tmp_path: Path, bf16_run: Any
) -> None:
    _, bf16 = bf16_run
    fp8 = _run(tiny_assets, tmp_path, "fp8", precision="fp8", fp8_emulate=1)
    reference, losses = bf16.losses(), fp8.losses()
    assert sorted(losses) == sorted(reference) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - reference[s]) / reference[s] for s in reference)
    assert worst < TOLERANCE, (worst, losses, reference)
    # The float8 layers did run: fp8 rounding moves the very first loss, bf16's does not.
    assert losses[1] != reference[1]
    assert losses[STEPS] < losses[1] - 1.0  # and it learns as bf16 does
    assert "precision fp8 rowwise, bf16 all-gather, emulated (testing)" in fp8.output
    assert "float8: 28 linear layers converted" in fp8.output  # 7 projections x 4 layers


def test_a_bf16_checkpoint_resumes_in_fp8_and_back_and_exports_as_bf16_would(
    tiny_assets: TinyAssets, tmp_path: Path, bf16_run: Any
) -> None:
    """bf16 to step 6; tensorwise fp8 (weights all-gathered in float8 over the 2 ranks) from
    there to 9; bf16 again from fp8's checkpoint to 12. Each start loads the other precision's
    checkpoint; the export is the same plain Hugging Face checkpoint a bf16 run writes."""
    bf16_root, bf16 = bf16_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(bf16_root / "ckpt" / f"step-{STEPS // 2}", ckpt / f"step-{STEPS // 2}")
    common: dict[str, Any] = {
        "checkpoint_dir": ckpt,
        "resume_from_checkpoint": ckpt,
        "checkpoint_freq": 3,
    }
    fp8 = _run(
        tiny_assets,
        tmp_path,
        "fp8",
        precision="fp8",
        fp8_emulate=1,
        fp8_recipe="tensorwise",
        max_steps=9,
        **common,
    )
    assert f"resumed from {ckpt / 'step-6'} at step 6" in fp8.output
    assert "fp8 tensorwise, float8 all-gather, emulated (testing)" in fp8.output
    back = _run(tiny_assets, tmp_path, "back", export_dir=tmp_path / "export", **common)
    assert f"resumed from {ckpt / 'step-9'} at step 9" in back.output
    reference = bf16.losses()
    resumed = {**fp8.losses(), **back.losses()}
    assert sorted(resumed) == list(range(STEPS // 2 + 1, STEPS + 1))
    for step, loss in resumed.items():
        assert abs(loss - reference[step]) / reference[step] < TOLERANCE, (step, resumed)

    exported, plain = tmp_path / "export", bf16_root / "export"
    assert _export_layout(exported) == _export_layout(plain)
    assert {dtype for dtype, _ in _export_layout(exported).values()} == {"torch.bfloat16"}
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert "quantization_config" not in model.config.to_dict()
    assert all(type(m) is torch.nn.Linear for m in model.modules() if "Linear" in type(m).__name__)


# --- weights gathered in float8 (tensorwise over the 2 ranks): checkpoints and rollbacks

ROLLBACK_STEPS = 7
"""A checkpoint at step 3, a rollback to it at step 6, steps 4-7 again (saved at 6 and 7)."""


def _rollback_run(assets: TinyAssets, root: Path, name: str, **extra: Any) -> RunResult:
    return _run(
        assets,
        root,
        name,
        precision="fp8",
        fp8_emulate=1,
        fp8_recipe="tensorwise",
        max_steps=ROLLBACK_STEPS,
        checkpoint_dir=root / name / "ckpt",
        checkpoint_freq=3,
        keep_last_checkpoints=0,
        export_dir=root / name / "export",
        **extra,
    )


def _after_rollback(result: RunResult) -> list[tuple[int, float]]:
    [rollback] = [r for r in result.metrics if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["skipped_batches"]) == (6, 3, 3)
    records = result.train_records()
    steps = [r["step"] for r in records]
    return [(r["step"], r["loss"]) for r in records[steps.index(6) + 1 :]]


@pytest.fixture(scope="module")
def fp8_rollbacks(tiny_assets: TinyAssets, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two tensorwise fp8 runs that roll back from step 6 to step 3, skipping the batches of
    steps 4-6. `moved`: step 4 trains, steps 5-6 are non-finite, so the weights at the rollback
    (and the float8 scales computed from them) are step 4's. `still`: steps 4-6 are all
    non-finite and skipped, so the weights never left step 3's. Everything after the rollback
    is the same in both, scales included once the load refreshes them. `moved` saves in the
    background (steps 3 and 6; step 7, the last, in-process), `still` in-process
    (--async_checkpoint 0)."""
    root = tmp_path_factory.mktemp("fp8-rollbacks")
    moved = _rollback_run(
        tiny_assets, root, "moved", nan_at_step=5, nan_steps=2, rollback_after_nonfinite=2
    )
    still = _rollback_run(
        tiny_assets,
        root,
        "still",
        nan_at_step=4,
        nan_steps=3,
        rollback_after_nonfinite=3,
        async_checkpoint=0,
    )
    return root, moved, still


def test_a_rollback_gathers_the_restored_weights_with_their_own_float8_scales(
    fp8_rollbacks: Any,
) -> None:
    """The scale of each weight gathered in float8 is computed once per step and kept on the
    weight's shard; a rollback that restored the weights in place without recomputing it
    gathered step 3's weights with step 4's scales, and its losses drifted from `still`'s."""
    _, moved, still = fp8_rollbacks
    assert "fp8 tensorwise, float8 all-gather, emulated (testing)" in moved.output
    after = _after_rollback(moved)
    assert [step for step, _ in after] == list(range(4, ROLLBACK_STEPS + 1))
    assert after == _after_rollback(still)


def _checkpoint_weights(location: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model weights as full tensors, read in this process without the trainer
    (DCP's own converter to a torch.save file)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    converted = location.parent / f"{location.name}.pt"
    dcp_to_torch_save(location, converted)
    model: dict[str, torch.Tensor] = torch.load(converted, weights_only=True)["model"]
    return model


def _exported_weights(directory: Path) -> dict[str, torch.Tensor]:
    weights = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - a safe_open handle is not a mapping
                weights[key] = handle.get_tensor(key)
    return weights


def test_fp8_tensorwise_checkpoints_hold_the_weights_and_resume_in_bf16(
    tiny_assets: TinyAssets, tmp_path: Path, bf16_run: Any, fp8_rollbacks: Any
) -> None:
    """Weights gathered in float8 are checkpointed as a bf16 run's: values, not the
    uninitialised memory their staging made of torchao's wrapper, and files without torchao's
    classes. The last (in-process) save of each run is the weights it exported; a bf16 run
    resumes from the background save of step 6 and trains step 7 as the fp8 run did; the
    export is the plain Hugging Face checkpoint a bf16 run writes."""
    root, moved, _ = fp8_rollbacks
    for run in ("moved", "still"):
        ckpt = root / run / "ckpt"
        for shard in ckpt.glob("step-*/*.distcp"):
            assert b"torchao" not in shard.read_bytes(), shard
        exported = _exported_weights(root / run / "export")
        saved = _checkpoint_weights(ckpt / f"step-{ROLLBACK_STEPS}")
        assert set(exported) <= set(saved)
        for key, values in exported.items():
            assert torch.equal(saved[key].to(values.dtype), values), (run, key)

    plain = bf16_run[0] / "export"
    assert _export_layout(root / "moved" / "export") == _export_layout(plain)

    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "moved" / "ckpt" / "step-6", ckpt / "step-6")
    resumed = _run(
        tiny_assets,
        tmp_path,
        "bf16",
        max_steps=ROLLBACK_STEPS,
        checkpoint_dir=ckpt,
        resume_from_checkpoint=ckpt,
    )
    assert f"resumed from {ckpt / 'step-6'} at step 6" in resumed.output
    assert "set aside" not in resumed.output
    fp8_loss = dict(_after_rollback(moved))[ROLLBACK_STEPS]
    bf16_loss = resumed.losses()[ROLLBACK_STEPS]
    assert abs(bf16_loss - fp8_loss) / fp8_loss < TOLERANCE, (bf16_loss, fp8_loss)
