"""A step that does not log makes no host-device sync: counted, not timed.

The trainer runs in this process (a one-rank group) with fused AdamW, its default on GPUs
and on the CPU alike (`trainer.optim.FUSED_DEVICE_TYPES`). Every
`Tensor.item()`, `Tensor.tolist()` and `all_gather_object` is recorded with the step it
happened in; only the CPU-side stop flag (`trainer.preemption`, a CPU tensor by design) is
not a device sync and is left out. The run serves its Prometheus metrics (trainer.telemetry)
while it is counted: each step still updates them, and the count is the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

import trainer.train
from tests.trainer.torchrun_util import free_port, tiny_args
from trainer.config import parse_args
from trainer.telemetry_names import LABELS
from trainer.tiny_assets import TinyAssets
from trainer.train import Trainer


def test_only_logging_steps_sync(
    tiny_assets: TinyAssets, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = tiny_args(
        tiny_assets,
        max_steps=6,
        logging_freq=3,
        digest_freq=100,
        metrics_file=tmp_path / "metrics.jsonl",
        metrics_port=free_port(),
    )
    run = Trainer(parse_args(args))
    assert run.optimizer.defaults["fused"]
    assert run.telemetry._server is not None  # served while counted
    syncs: list[tuple[str, int]] = []
    item, tolist, gather = torch.Tensor.item, torch.Tensor.tolist, dist.all_gather_object

    def counted_item(self: torch.Tensor) -> Any:
        if self is not run.stops._flag:
            syncs.append(("item", run.step))
        return item(self)

    def counted_tolist(self: torch.Tensor) -> Any:
        syncs.append(("tolist", run.step))
        return tolist(self)

    def counted_gather(*args: Any, **kwargs: Any) -> Any:
        syncs.append(("all_gather_object", run.step))
        return gather(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    monkeypatch.setattr(trainer.train.dist, "all_gather_object", counted_gather)
    try:
        run.train()
        # Disarmed before the final save and export, which are no steps.
        assert run.watchdog is not None and not run.watchdog._thread.is_alive()
    finally:
        monkeypatch.undo()
        run.close()
    # A sync inside step k's work happens while `run.step` is k - 1; logging happens at k.
    assert {step for _, step in syncs} <= {3, 6}, syncs
    # The first log line also gathers every rank's batch fingerprint; the next does not.
    assert [kind for kind, step in syncs if kind == "all_gather_object"] == ["all_gather_object"]
    # Every step reached the metrics, the logging steps' figures too, and the run finished.
    registry = run.telemetry.metrics.registry
    assert isinstance(registry, CollectorRegistry)  # in-process: its own registry
    labels = dict(zip(LABELS, run.telemetry.labels.values(), strict=True))
    assert registry.get_sample_value("fsdp_train_step", labels) == 6
    assert registry.get_sample_value("fsdp_train_loss", labels) is not None
    assert registry.get_sample_value("fsdp_run_state", {**labels, "state": "finished"}) == 1


def test_by_default_nine_steps_in_ten_make_no_sync() -> None:
    logging = parse_args([]).logging
    assert (logging.logging_freq, logging.digest_freq) == (10, 100)


def test_a_rollback_is_decided_on_the_device_and_read_at_the_next_logging_step(
    tiny_assets: TinyAssets, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 5 and 6 are non-finite, step 7 is fine again: the run of two latches on the
    device, no step syncs to look at it, and logging step 8 (which syncs anyway) reads it and
    rolls back to the step-4 checkpoint."""
    args = tiny_args(
        tiny_assets,
        max_steps=8,
        logging_freq=4,
        digest_freq=100,
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_freq=4,
        nan_at_step=5,
        nan_steps=2,
        rollback_after_nonfinite=2,
        metrics_file=tmp_path / "metrics.jsonl",
    )
    run = Trainer(parse_args(args))
    in_step: list[bool] = [False]
    syncs: list[tuple[str, int]] = []
    train_step, item, tolist = run.train_step, torch.Tensor.item, torch.Tensor.tolist

    def step_watched() -> Any:
        in_step[0] = True
        try:
            return train_step()
        finally:
            in_step[0] = False

    def counted_item(self: torch.Tensor) -> Any:
        if in_step[0] and self is not run.stops._flag:
            syncs.append(("item", run.step + 1))
        return item(self)

    def counted_tolist(self: torch.Tensor) -> Any:
        if in_step[0]:
            syncs.append(("tolist", run.step + 1))
        return tolist(self)

    monkeypatch.setattr(run, "train_step", step_watched)
    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    try:
        run.train()
    finally:
        monkeypatch.undo()
        run.close()
    assert syncs == []
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [rollback] = [r for r in records if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["skipped_batches"]) == (8, 4, 4)
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 8]


def test_a_spike_on_a_checkpoint_step_that_does_not_log_is_judged_before_the_save(
    tiny_assets: TinyAssets, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 15 saves but does not log (logging every 2 steps), and its loss is scaled x100
    (finite): the guard averages the loss itself before the save, rolls back to the step-10
    checkpoint, and the spiked state is never saved. Steps that neither log nor save still
    make no sync."""
    args = tiny_args(
        tiny_assets,
        max_steps=16,
        logging_freq=2,
        digest_freq=100,
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_freq=5,
        loss_spike_factor=3,
        metrics_file=tmp_path / "metrics.jsonl",
    )
    run = Trainer(parse_args(args))
    spiked: list[int] = []
    loss_scale = run.faults.loss_scale

    def spike_at_15(*, step: int, batch: int, micro: int, scale: float) -> float:
        if step == 15 and not spiked:
            spiked.append(step)
            return 100 * scale
        return loss_scale(step=step, batch=batch, micro=micro, scale=scale)

    monkeypatch.setattr(run.faults, "loss_scale", spike_at_15)
    saved: list[int] = []
    save = run.save

    def watched_save(step: int, *, blocking: bool = False) -> None:
        saved.append(step)
        save(step, blocking=blocking)

    monkeypatch.setattr(run, "save", watched_save)
    syncs: list[int] = []
    item = torch.Tensor.item

    def counted_item(self: torch.Tensor) -> Any:
        if self is not run.stops._flag:
            syncs.append(run.step)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    try:
        run.train()
    finally:
        monkeypatch.undo()
        run.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [rollback] = [r for r in records if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"]) == (15, 10)
    assert "above 3 x its recent average" in rollback["reason"]
    # 5 and 10, then (after the rollback to 10) 15 again and the final 16.
    assert saved == [5, 10, 15, 16]
    # Syncs only on logging steps, save steps and the step a rollback returned to.
    assert {step for step in syncs} <= {2, 4, 5, 6, 8, 10, 12, 14, 15, 16}, syncs


def test_a_stop_after_a_spiked_step_stops_with_the_last_good_checkpoint(
    tiny_assets: TinyAssets, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM after step 12; step 13, the one the run stops after, neither logs nor saves
    periodically and its loss is scaled x100. The stop judges it before its save: a rollback
    to step 10, and the run stops there without saving the spiked state."""
    from trainer.preemption import PreemptedError

    args = tiny_args(
        tiny_assets,
        max_steps=16,
        logging_freq=2,
        digest_freq=100,
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_freq=5,
        loss_spike_factor=3,
        signal_at_step=12,
        metrics_file=tmp_path / "metrics.jsonl",
    )
    run = Trainer(parse_args(args))
    loss_scale = run.faults.loss_scale

    def spike_at_13(*, step: int, batch: int, micro: int, scale: float) -> float:
        factor = 100 if step == 13 and run.faults.first_attempt else 1
        return factor * loss_scale(step=step, batch=batch, micro=micro, scale=scale)

    monkeypatch.setattr(run.faults, "loss_scale", spike_at_13)
    try:
        with pytest.raises(PreemptedError) as stopped:
            run.train()
    finally:
        run.close()
    assert stopped.value.step == 10
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [rollback] = [r for r in records if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"]) == (13, 10)
    [stop] = [r for r in records if r["kind"] == "stop"]
    assert stop["step"] == 10
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-10", "step-5"]
