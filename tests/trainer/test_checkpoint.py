"""Checkpoint round trip, crash safety and pruning, in one process (with and without a gloo
process group; the multi-process FSDP2 resume is exercised by the torchrun tests)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from tests.trainer.checkpoint_probes import Probe
from trainer import checkpoint as ckpt_module
from trainer.checkpoint import (
    COMPLETE_MARKER,
    CheckpointError,
    CheckpointManager,
    UnreadableCheckpointError,
    capture_rng_state,
    find_latest,
    restore_rng_state,
)
from trainer.config import InjectedFaultConfig
from trainer.distributed import exit_without_finalization
from trainer.faults import FaultInjector
from trainer.optim import build_lr_scheduler, build_optimizer, lr_at

DIM = 16


class TinyNet(nn.Module):
    """Small enough to be fast; dropout makes the torch RNG matter to the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, 32)
        self.drop = nn.Dropout(0.2)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.drop(torch.relu(self.inp(x)))))


class CountingLoader:
    """A stand-in for the data loader: a position it must resume from, plus python and numpy
    randomness so those RNGs matter too."""

    def __init__(self) -> None:
        self.position = 0
        self.table = torch.linspace(-1, 1, 64 * DIM).reshape(64, DIM)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [(self.position * 4 + i) % 64 for i in range(4)]
        self.position += 1
        noise = random.random() + float(np.random.rand())
        x = self.table[rows] + noise
        return x, x.sum(dim=1, keepdim=True).sin()

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


class Run:
    """Model + optimizer + schedule + loader, as the trainer holds them."""

    def __init__(self, seed: int, shard: bool) -> None:
        torch.manual_seed(seed)
        self.model = TinyNet()
        if shard:
            fully_shard(self.model)
        self.optimizer = build_optimizer(
            self.model, lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95
        )
        self.scheduler = build_lr_scheduler(
            self.optimizer, warmup_steps=2, max_steps=10, decay_style="cosine", lr=1e-2, min_lr=1e-3
        )
        self.loader = CountingLoader()

    def step(self) -> float:
        x, y = self.loader.next_batch()
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        return loss.item()

    def train_state(self) -> dict[str, Any]:
        return {"data": self.loader.state_dict(), "rng": capture_rng_state()}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _round_trip(ckpt_dir: str | Path, *, shard: bool, async_save: bool = False) -> None:
    _seed_everything(0)
    uninterrupted = Run(seed=0, shard=shard)
    manager = CheckpointManager(ckpt_dir, keep_last=2, async_save=async_save)
    for _ in range(3):
        uninterrupted.step()
    saved = manager.save(
        3,
        model=uninterrupted.model,
        optimizer=uninterrupted.optimizer,
        lr_scheduler=uninterrupted.scheduler,
        train_state=uninterrupted.train_state(),
    )
    # Training goes on while an asynchronous save is in flight: the steps below change the
    # very tensors being saved, so an exact resume proves the save holds step 3's copy.
    expected = [uninterrupted.step() for _ in range(3)]
    manager.wait()
    manager.close()

    _seed_everything(1234)  # a restarted process: different RNG, different init, fresh loader
    resumed = Run(seed=1, shard=shard)
    path = manager.latest()
    assert path == saved
    step, train_state = manager.load(
        path, model=resumed.model, optimizer=resumed.optimizer, lr_scheduler=resumed.scheduler
    )
    assert step == 3
    resumed.loader.load_state_dict(train_state["data"])
    restore_rng_state(train_state["rng"])
    assert resumed.scheduler.last_epoch == 3
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(
        lr_at(4, warmup_steps=2, max_steps=10, decay_style="cosine", lr=1e-2, min_lr=1e-3)
    )
    got = [resumed.step() for _ in range(3)]
    assert got == expected  # exact: same weights, moments, lr, data and dropout masks

    # Negative control: the same resume without the optimizer moments diverges, so the
    # equality above depends on the optimizer state being restored.
    _seed_everything(1234)
    weights_only = Run(seed=1, shard=shard)
    _, state = manager.load(path, model=weights_only.model, optimizer=None, lr_scheduler=None)
    weights_only.loader.load_state_dict(state["data"])
    restore_rng_state(state["rng"])
    assert [weights_only.step() for _ in range(3)] != expected


def test_round_trip_without_process_group_continues_identically(tmp_path):
    assert not dist.is_initialized()
    _round_trip(tmp_path / "ckpt", shard=False)


@pytest.mark.parametrize("async_save", [False, True], ids=["in-process", "upload-process"])
def test_round_trip_fsdp2_gloo_world_of_one_continues_identically(
    tmp_path, gloo_world_of_one, async_save
):
    _round_trip(tmp_path / "ckpt", shard=True, async_save=async_save)
    saved = CheckpointManager(tmp_path / "ckpt", keep_last=2).latest()
    assert saved is not None
    assert json.loads((Path(saved) / COMPLETE_MARKER).read_text())["world_size"] == 1


def _save(manager: CheckpointManager, step: int, run: Run, **kwargs: Any) -> str:
    return manager.save(
        step,
        model=run.model,
        optimizer=run.optimizer,
        lr_scheduler=run.scheduler,
        train_state={"step_seen": step},
        **kwargs,
    )


def test_latest_skips_dirs_without_marker_and_temp_dirs(tmp_path):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=0)
    good = _save(manager, 5, run)
    half = tmp_path / "step-9"
    half.mkdir()
    (half / ".metadata").write_bytes(b"partial")
    (tmp_path / ".tmp-step-12").mkdir()
    (tmp_path / "step-notanumber").mkdir()
    assert manager.latest() == good
    assert find_latest(tmp_path) == good
    assert find_latest(good) == good  # --resume_from_checkpoint may name the step dir itself
    assert find_latest(half) is None
    assert find_latest(str(half) + "/") is None
    assert find_latest(tmp_path / "missing") is None
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        manager.load(half, model=run.model, optimizer=run.optimizer, lr_scheduler=run.scheduler)


def test_crash_during_save_leaves_previous_checkpoint_as_latest(tmp_path, monkeypatch):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=3)
    first = _save(manager, 1, run)
    run.step()

    real_save = ckpt_module.dcp.save

    def dying_save(state, **kwargs):
        real_save(state, **kwargs)  # data fully written...
        raise KeyboardInterrupt("node lost")  # ...but the process dies before publishing

    monkeypatch.setattr(ckpt_module.dcp, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        _save(manager, 2, run)
    monkeypatch.setattr(ckpt_module.dcp, "save", real_save)

    assert (tmp_path / ".tmp-step-2" / ".metadata").is_file()  # the crash left its files...
    assert not (tmp_path / "step-2").exists()
    assert manager.latest() == first  # ...but resume never picks them
    second = _save(manager, 2, run)  # the retried save replaces the stray temp dir
    assert manager.latest() == second
    assert not (tmp_path / ".tmp-step-2").exists()
    _, state = manager.load(
        second, model=run.model, optimizer=run.optimizer, lr_scheduler=run.scheduler
    )
    assert state == {"step_seen": 2}


def test_keep_last_prunes_oldest_and_stray_temp_dirs(tmp_path):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=2)
    (tmp_path / ".tmp-step-0").mkdir(parents=True)  # left by a crashed save of an earlier run
    foreign = tmp_path / "step-100"
    foreign.mkdir()  # no marker: not ours to delete
    for step in (1, 2, 3, 4):
        _save(manager, step, run)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-100", "step-3", "step-4"]
    assert manager.latest() == str(tmp_path / "step-4")

    newest_only = CheckpointManager(tmp_path, keep_last=1)
    _save(newest_only, 5, run)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-100", "step-5"]


def test_saving_the_same_step_twice_keeps_the_newer(tmp_path):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(7, model=run.model, optimizer=None, lr_scheduler=None, train_state={"version": 1})
    manager.save(7, model=run.model, optimizer=None, lr_scheduler=None, train_state={"version": 2})
    _, state = manager.load(tmp_path / "step-7", model=run.model, optimizer=None, lr_scheduler=None)
    assert state == {"version": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["step-7"]


def test_world_size_change_is_an_error_unless_allowed(tmp_path):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=2)
    path = _save(manager, 3, run)
    marker = Path(path) / COMPLETE_MARKER
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps(record | {"world_size": 8}))
    kwargs: dict[str, Any] = {
        "model": run.model,
        "optimizer": run.optimizer,
        "lr_scheduler": run.scheduler,
    }
    fresh = Run(seed=5, shard=False)
    before = [p.detach().clone() for p in fresh.model.parameters()]
    with pytest.raises(CheckpointError, match="written by 8 ranks but this run has 1") as refused:
        manager.load(path, model=fresh.model, optimizer=fresh.optimizer, lr_scheduler=None)
    # The way out is a trainer flag the user can pass, not a Python keyword.
    assert "--allow_world_size_change 1" in str(refused.value)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.model.parameters(), strict=True))
    step, state = manager.load(path, allow_world_size_change=True, **kwargs)
    assert (step, state) == (3, {})


def test_rng_capture_restore_replays_every_generator():
    state = capture_rng_state()
    first = (random.random(), float(np.random.rand()), torch.rand(1).item())
    restore_rng_state(state)
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == first


def test_keep_last_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="keep_last must be >= 0"):
        CheckpointManager(tmp_path, keep_last=-1)


def test_resume_follows_the_current_flags_for_schedule_and_hyperparameters(tmp_path):
    """A resume with a longer --max_steps, a new --lr and --weight_decay uses them; only the
    optimizer moments and the schedule position come from the checkpoint."""
    run = Run(seed=0, shard=False)
    for _ in range(4):
        run.step()
    manager = CheckpointManager(tmp_path, keep_last=1)
    path = _save(manager, 4, run)
    changed = Run(seed=0, shard=False)
    changed.optimizer = build_optimizer(
        changed.model, lr=2e-2, weight_decay=0.01, beta1=0.9, beta2=0.95
    )
    changed.scheduler = build_lr_scheduler(
        changed.optimizer, warmup_steps=2, max_steps=100, decay_style="cosine", lr=2e-2, min_lr=0
    )
    manager.load(
        path, model=changed.model, optimizer=changed.optimizer, lr_scheduler=changed.scheduler
    )
    assert changed.scheduler.last_epoch == 4
    new_lr = lr_at(5, warmup_steps=2, max_steps=100, decay_style="cosine", lr=2e-2, min_lr=0)
    old_lr = lr_at(5, warmup_steps=2, max_steps=10, decay_style="cosine", lr=1e-2, min_lr=1e-3)
    assert new_lr != pytest.approx(old_lr)
    assert [g["lr"] for g in changed.optimizer.param_groups] == pytest.approx([new_lr, new_lr])
    assert [g["weight_decay"] for g in changed.optimizer.param_groups] == [0.01, 0.0]
    # The moments did come from the checkpoint.
    saved_moments = [s["exp_avg"] for s in run.optimizer.state.values()]
    loaded_moments = [s["exp_avg"] for s in changed.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(saved_moments, loaded_moments, strict=True))


# --- two ranks: FSDP2 sharded over 2 gloo processes -------------------------------------------


def _two_rank_worker(rank: int, store: str, ckpt_dir: str, full_state_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        manager = CheckpointManager(ckpt_dir, keep_last=2)
        _seed_everything(100 + rank)  # ranks draw different data and dropout masks
        run = Run(seed=0, shard=True)
        run.loader.position = 10 * rank
        for _ in range(2):
            run.step()
        manager.save(
            2,
            model=run.model,
            optimizer=run.optimizer,
            lr_scheduler=run.scheduler,
            train_state={"rank": rank, **run.train_state()},
        )
        # The full weights as saved (collective gather), for the 1-process reshard check.
        saved_full = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True))
        if rank == 0:
            torch.save(saved_full, full_state_file)
        expected = [run.step() for _ in range(2)]
        _resume_and_compare(manager, rank, expected)

        # A failure on rank 0 while publishing reaches rank 1 as an error, not a hang.
        if rank == 0:
            manager.store.publish = _disk_full  # type: ignore[method-assign]
        with pytest.raises(CheckpointError, match=r"publishing .* failed on rank 0: OSError"):
            manager.save(
                4, model=run.model, optimizer=None, lr_scheduler=None, train_state={"rank": rank}
            )
        assert manager.latest() == str(Path(ckpt_dir) / "step-2")
    finally:
        dist.destroy_process_group()
    # Reached only when every check passed: exit as the trainer does, past the interpreter's
    # teardown, which can abort a process whose gloo threads outlive it (trainer.distributed).
    exit_without_finalization(0)


def _disk_full(step: int, location: str, record: dict[str, Any]) -> str:
    raise OSError("No space left on device")


def _resume_and_compare(manager: CheckpointManager, rank: int, expected: list[float]) -> None:
    _seed_everything(999)
    resumed = Run(seed=1, shard=True)
    step, state = manager.load(
        manager.latest(),  # type: ignore[arg-type]
        model=resumed.model,
        optimizer=resumed.optimizer,
        lr_scheduler=resumed.scheduler,
    )
    assert (step, state["rank"]) == (2, rank)  # each rank gets its own state back
    resumed.loader.load_state_dict(state["data"])
    restore_rng_state(state["rng"])
    assert [resumed.step() for _ in range(2)] == expected


@pytest.mark.slow
def test_two_rank_fsdp2_resume_and_rank0_failure_and_reshard_to_one(tmp_path):
    ckpt_dir, full_file = tmp_path / "ckpt", tmp_path / "full.pt"
    context = torch.multiprocessing.start_processes(
        _two_rank_worker,
        args=(str(tmp_path / "store"), str(ckpt_dir), str(full_file)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 240
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("two-rank checkpoint workers did not finish in 240 s (a hang?)")

    # The 2-rank sharded checkpoint loads into one unsharded process (DCP reshards); the
    # per-rank train_state does not map, which must be asked for explicitly.
    single = Run(seed=7, shard=False)
    manager = CheckpointManager(ckpt_dir, keep_last=2)
    with pytest.raises(CheckpointError, match="written by 2 ranks but this run has 1"):
        manager.load(ckpt_dir / "step-2", model=single.model, optimizer=None, lr_scheduler=None)
    manager.load(
        ckpt_dir / "step-2",
        model=single.model,
        optimizer=single.optimizer,
        lr_scheduler=single.scheduler,
        allow_world_size_change=True,
    )
    saved_full = torch.load(full_file, weights_only=True)
    loaded = single.model.state_dict()
    assert loaded.keys() == saved_full.keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, saved_full[name]), name
    assert single.scheduler.last_epoch == 2


def _tiny_tied_llama(seed: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _shard(model: nn.Module, *, checkpoint_layers: bool) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = model.get_submodule("model.layers")
    assert isinstance(layers, nn.ModuleList)
    for index, layer in enumerate(layers):
        wrapped = checkpoint_wrapper(layer) if checkpoint_layers else layer
        layers[index] = wrapped
        fully_shard(wrapped)
    fully_shard(model)


def test_tied_llama_saved_with_activation_checkpointing_resumes_without_it(
    tmp_path, gloo_world_of_one
):
    """Wrapper prefixes stay out of the checkpoint and tied weights stay tied, so a run may
    switch --activation_checkpointing between restarts."""
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    saver = _tiny_tied_llama(seed=0)
    _shard(saver, checkpoint_layers=True)
    opt = build_optimizer(saver, lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95)
    train(saver, opt, 2)
    manager = CheckpointManager(tmp_path, keep_last=1)
    path = manager.save(2, model=saver, optimizer=opt, lr_scheduler=None, train_state={})
    expected = train(saver, opt, 2)

    resumed = _tiny_tied_llama(seed=1)
    _shard(resumed, checkpoint_layers=False)
    opt2 = build_optimizer(resumed, lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95)
    manager.load(path, model=resumed, optimizer=opt2, lr_scheduler=None)
    assert resumed.lm_head.weight is resumed.model.embed_tokens.weight  # type: ignore[union-attr]
    got = train(resumed, opt2, 2)
    assert got == pytest.approx(expected, rel=1e-6, abs=0)


def test_latest_names_the_skipped_incomplete_dir(tmp_path, caplog):
    (tmp_path / "step-3").mkdir()
    # Attached directly: the trainer's log setup may have stopped propagation to the root.
    checkpoint_logger = logging.getLogger("trainer.checkpoint")
    checkpoint_logger.addHandler(caplog.handler)
    try:
        assert CheckpointManager(tmp_path, keep_last=1).latest() is None
    finally:
        checkpoint_logger.removeHandler(caplog.handler)
    assert f"ignoring {tmp_path / 'step-3'}: no COMPLETE marker" in caplog.text


# --- staging and the upload process (torch's DefaultStager and process executor) --------------


def test_staging_buffers_are_made_once_and_shards_written_by_another_process(
    tmp_path, gloo_world_of_one
):
    """Three saves of FSDP2 shards and AdamW moments: the first allocates the host staging
    buffers, the next two copy into the same ones; every shard file is opened by one other
    process, a child of this one (torch's upload daemon), never by the training process."""
    run = Run(seed=0, shard=True)
    run.step()
    probe = Probe(tmp_path / "writers.log")
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=3, async_save=True)
    try:
        for step in (1, 2, 3):
            _save(manager, step, run, faults=probe)
            run.step()  # the parameters change while the upload runs
        manager.wait()
        children = {child.pid for child in multiprocessing.active_children()}
    finally:
        manager.close()
    records = manager.pop_finished()
    assert [r.step for r in records] == [1, 2, 3]
    # 6 parameters, their 12 AdamW moments and 6 step counts: 24 host storages, once.
    assert [r.new_buffers for r in records] == [24, 0, 0]
    assert len({r.staged_bytes for r in records}) == 1 and records[0].staged_bytes > 0
    assert all(r.durable_s is not None and r.durable_s >= r.staged_s for r in records)
    shard_writers = {pid for path, pid in probe.writers().items() if path.endswith(".distcp")}
    assert len(shard_writers) == 1
    assert os.getpid() not in shard_writers and shard_writers <= children
    assert [s for s, _ in manager.store.complete_steps()] == [1, 2, 3]
    assert manager.staging is None  # released by close()


def test_a_hang_exits_only_once_the_upload_in_flight_is_durable(
    tmp_path, gloo_world_of_one, monkeypatch
):
    """The watchdog's exit path waits for the save in flight (its upload held until a gate
    file appears) and its marker, without any collective, then records the hang and exits."""
    from trainer import train as train_module
    from trainer.train import Trainer

    run = Run(seed=0, shard=True)
    run.step()
    gate = tmp_path / "gate"
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=3, async_save=True)
    exits: list[tuple[str, str | None]] = []
    monkeypatch.setattr(
        train_module.HangWatchdog,
        "exit",
        staticmethod(lambda r: exits.append((r, manager.latest()))),
    )
    written: list[dict[str, Any]] = []
    trainer = SimpleNamespace(
        checkpoints=manager,
        cfg=SimpleNamespace(safety=SimpleNamespace(watchdog_floor_s=120.0)),
        sinks=SimpleNamespace(write=written.append),
        step=7,
    )
    trainer._record_saves = lambda: Trainer._record_saves(trainer)  # type: ignore[arg-type]
    trainer._drain_saves = lambda: Trainer._drain_saves(trainer)  # type: ignore[arg-type]
    try:
        _save(manager, 7, run, faults=Probe(tmp_path / "writers.log", gate=gate))
        hang = threading.Thread(target=Trainer._on_hang, args=(trainer, "no step for 600 s"))
        hang.start()
        hang.join(timeout=3)
        assert hang.is_alive() and exits == []  # held by the upload, not exited
        gate.touch()
        hang.join(timeout=120)
        assert not hang.is_alive()
    finally:
        gate.touch()
        manager.wait()
        manager.close()
    assert exits == [("no step for 600 s", str(tmp_path / "ckpt" / "step-7"))]
    assert [r["kind"] for r in written] == ["checkpoint", "hang"]
    assert written[0]["step"] == 7 and written[0]["durable_s"] > 0


def test_a_full_disk_is_one_error_naming_the_file_and_the_cause(tmp_path, gloo_world_of_one):
    """ENOSPC raised inside DCP's write, in the upload process: DCP's CheckpointException (a
    BaseException) comes back as one CheckpointError line, and nothing is published."""
    run = Run(seed=0, shard=True)
    run.step()
    faults = FaultInjector(InjectedFaultConfig(disk_full_at_step=2), rank=0, world_size=1)
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    try:
        _save(manager, 1, run, faults=faults)
        _save(manager, 2, run, faults=faults)
        with pytest.raises(CheckpointError) as failed:
            manager.wait()
    finally:
        manager.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"writing {tmp_path / '.tmp-step-2'} failed: rank 0: OSError: ")
    assert "[Errno 28] No space left on device: " in message
    assert f"{tmp_path / '.tmp-step-2'}/__0_0.distcp" in message
    assert manager.latest() == str(tmp_path / "step-1")
    records = manager.pop_finished()
    assert [(r.step, r.durable_s is None, r.error == message) for r in records] == [
        (1, False, False),
        (2, True, True),
    ]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_truncated_shard_is_unreadable_and_set_aside_not_deleted(tmp_path):
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(tmp_path, keep_last=3)
    _save(manager, 1, run)
    newest = _save(manager, 2, run)
    _truncate(Path(newest) / "__0_0.distcp")
    with pytest.raises(UnreadableCheckpointError, match=rf"^{newest} cannot be loaded: "):
        manager.load(newest, model=run.model, optimizer=run.optimizer, lr_scheduler=None)
    aside = manager.set_aside(newest)
    assert Path(aside).name.startswith("step-2.unreadable-")
    assert (Path(aside) / "__0_0.distcp").is_file() and (Path(aside) / COMPLETE_MARKER).is_file()
    assert manager.latest() == str(tmp_path / "step-1")
    _save(manager, 3, run)  # pruning leaves what was set aside alone
    assert Path(aside).is_dir()


def test_drain_says_a_save_is_still_in_flight_when_its_wait_times_out(tmp_path):
    """An upload that has not finished when `drain`'s time is up is still in flight: the
    future's TimeoutError is an Exception too, and must not read as "failed, nothing left"."""
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    never_done: Future[Any] = Future()
    manager._in_flight = ckpt_module._InFlight(
        step=5,
        location=str(tmp_path / ".tmp-step-5"),
        started=0.0,
        staged_s=0.0,
        staged_bytes=0,
        new_buffers=0,
        upload=never_done,
    )
    assert manager.drain(0.01) is False
    assert manager.in_flight()
    never_done.set_exception(OSError("lost"))
    assert manager.drain(0.01) is True  # failed: nothing will become durable


def test_a_disk_that_fills_mid_record_is_named_not_the_serializers_position_error(tmp_path):
    """torch.save into a file whose disk fills after the record's zip header: torch raises
    `unexpected pos` with the ENOSPC only as its context; the failure names the ENOSPC."""
    from trainer.checkpoint_upload import describe_failure
    from trainer.faults import _FullStream

    target = tmp_path / "rank-00001.pt"
    with target.open("wb") as file, pytest.raises(RuntimeError, match="unexpected pos") as hit:
        torch.save(torch.zeros(1000), _FullStream(file, str(target)))  # type: ignore[arg-type]
    assert describe_failure(hit.value, rank=1) == (
        f"rank 1: OSError: [Errno 28] No space left on device: '{target}'"
    )
