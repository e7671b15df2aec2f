"""The Trainer: one fixed setup sequence, then a loop that reads top-down.

`train()` → `train_step()` → `forward_backward_step()`. The loss is reduced across ranks only
on logging steps: every other step runs without a host-device sync.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer.cadence import Every
from trainer.checkpoint import (
    CheckpointManager,
    UnreadableCheckpointError,
    capture_rng_state,
    find_latest,
    restore_rng_state,
)
from trainer.config import TrainConfig, shape_flag_names
from trainer.data import build_train_loader, build_val_loader, load_tokenizer
from trainer.distributed import (
    all_reduce_mean,
    build_mesh,
    init_distributed,
    shard_coordinate,
    shutdown,
)
from trainer.divergence import DivergenceGuard
from trainer.faults import FaultInjector
from trainer.float8 import (
    Float8Plan,
    after_optimizer_step,
    check_fp8_device,
    check_torch_pairing,
    plan_float8,
)
from trainer.garbage import CollectionCadence
from trainer.log import get_logger, setup_logging
from trainer.loss import install_chunked_loss
from trainer.metrics import (
    MultiSink,
    StepTimer,
    ThroughputModel,
    build_sinks,
    flops_per_token,
    matmul_params_per_token,
    peak_flops,
    peak_memory_gib,
)
from trainer.models import build_model, hf_config_from, load_pretrained, materialize
from trainer.models import pretrained_config as load_pretrained_config
from trainer.optim import build_lr_scheduler, build_optimizer, step_unless_non_finite
from trainer.output_mirror import OutputMirror, default_staging_dir
from trainer.parallelize import (
    ParallelPlan,
    check_replicas_identical,
    parallelize_model,
    parameter_device,
)
from trainer.preemption import StopRequests, control_group
from trainer.preflight import Expectations, run_preflight
from trainer.restarts import account_start, read_records
from trainer.telemetry import start_telemetry
from trainer.validate import Validator
from trainer.watchdog import HangWatchdog

logger = get_logger("train")

# Per-rank batch fingerprints go into the metrics file (evidence that ranks read different
# data) up to this world size; beyond it the lines would be mostly fingerprints.
MAX_RANKS_WITH_DIGESTS = 64


def clip_grad_norm_(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient norm over all shards (and clip to `max_norm` when > 0).

    With FSDP2 the gradients are DTensor shards: the norm of the local pieces is a partial
    result, and `full_tensor()` reduces it over the mesh, so every rank sees (and clips with)
    the norm of the whole model's gradient.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def export_dtype(*, bf16: bool) -> torch.dtype | None:
    """The dtype of exported weights: a bf16 run's forward computes with bf16 weights, so a bf16
    export is the model it trained, at half the size of the fp32 master copy (an fp32 config
    also makes `from_pretrained(dtype="auto")` and servers load it in fp32). The DCP checkpoint
    keeps fp32 for further training. None (fp32 runs) keeps the weights as trained."""
    return torch.bfloat16 if bf16 else None


def quiet_libraries() -> None:
    """Ranks > 0 keep the libraries' progress bars and info chatter out of the job log."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()


def batch_digest(batch: torch.Tensor) -> str:
    """A short fingerprint of a batch's tokens, to show which rank read what."""
    return hashlib.sha1(batch.cpu().numpy().tobytes()).hexdigest()[:12]


@dataclass(frozen=True)
class StepResult:
    """What `train_step` hands to logging; tensors stay on the device until a logging step."""

    loss: torch.Tensor  # this rank's mean loss over the step's micro-batches
    grad_norm: torch.Tensor  # global, before clipping
    lr: float  # the learning rate this step used
    digest: str  # fingerprint of the first micro-batch


class Trainer:
    """Owns every long-lived object of a run; `train()` runs it to `--max_steps`."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        # Device and process groups.
        self.dist = init_distributed(cfg.parallel.device, cpu_offload=cfg.parallel.cpu_offload)
        setup_logging(self.dist.rank)
        if not self.dist.is_main:
            quiet_libraries()
        self.device = self.dist.device
        # Prometheus metrics from here on, so a long setup shows as `starting`.
        self.telemetry = start_telemetry(
            port=cfg.logging.metrics_port,
            rank=self.dist.rank,
            local_rank=self.dist.local_rank,
            checkpoint_dir=cfg.checkpoint.checkpoint_dir,
        )
        # Tests' injected faults (none in a real run), called at fixed points of the loop.
        self.faults = FaultInjector(
            cfg.faults, rank=self.dist.rank, world_size=self.dist.world_size
        )
        # Before anything is built: are these the GPUs and the network the run expects?
        safety = cfg.safety
        run_preflight(
            Expectations(
                gpu_model=safety.expect_gpu,
                gpu_memory_gib=safety.expect_gpu_memory_gib,
                efa_devices=safety.expect_efa_devices,
                busbw_floor_gbps=safety.allreduce_floor_gbps,
                allreduce_mib=64 if self.device.type == "cuda" else 4,
            ),
            device=self.device,
            local_world_size=self.dist.local_world_size,
            mode=safety.preflight,
            inject=cfg.faults.preflight_fail_check,
        )
        self.seed = cfg.optim.seed
        torch.manual_seed(self.seed)

        # Tokenizer and model config (a preset shape, or the pretrained model's own).
        self.tokenizer = load_tokenizer(cfg.tokenizer_name)
        if cfg.model.init_from is not None:
            shaping = shape_flag_names()  # a pretrained model brings its own architecture
            ignored = [f"--{name}" for name in shaping if getattr(cfg.model, name) is not None]
            if ignored:
                logger.warning(
                    "--init_from %s: the architecture comes from its config.json; ignoring %s",
                    cfg.model.init_from,
                    " ".join(ignored),
                )
            self.hf_config = load_pretrained_config(
                cfg.model.init_from, attn_implementation=cfg.model.attn_implementation
            )
        else:
            self.hf_config = hf_config_from(
                cfg.model.shape(), attn_implementation=cfg.model.attn_implementation
            )
        if len(self.tokenizer) > self.hf_config.vocab_size:
            raise ValueError(
                f"--tokenizer {cfg.tokenizer_name!r} has {len(self.tokenizer)} tokens but the "
                f"model's vocab_size is {self.hf_config.vocab_size}; pass a larger --vocab_size"
            )

        # Data: each rank reads its own part; FSDP is data-parallel over every rank.
        self.seq_len = cfg.model.max_context_width
        self.train_loader = build_train_loader(
            cfg.data,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            dp_rank=self.dist.rank,
            dp_world_size=self.dist.world_size,
            seed=self.seed,
        )
        self._train_iter: Iterator[dict[str, torch.Tensor]] | None = None
        val_loader: Iterable[dict[str, torch.Tensor]] | None = None
        if cfg.logging.validation_freq:
            val_loader = build_val_loader(
                cfg.data,
                tokenizer=self.tokenizer,
                seq_len=self.seq_len,
                max_batches=cfg.logging.validation_batches,
                dp_rank=self.dist.rank,
                dp_world_size=self.dist.world_size,
                seed=self.seed,
            )

        # Model on the meta device, sharded, then materialised shard by shard.
        self.compiled = (
            cfg.parallel.compile if cfg.parallel.compile is not None else self.device.type == "cuda"
        )
        self.model = build_model(self.hf_config)
        if cfg.parallel.loss_chunk_tokens:
            install_chunked_loss(self.model, cfg.parallel.loss_chunk_tokens)
        self.mesh = build_mesh(
            self.dist, cfg.parallel.sharding_strategy, cfg.parallel.hsdp_shard_size
        )
        self.float8: Float8Plan | None = None
        if cfg.parallel.precision == "fp8":
            check_torch_pairing()
            check_fp8_device(self.device, emulate=cfg.parallel.fp8_emulate)
            self.float8 = plan_float8(
                cfg.parallel.fp8_recipe or "rowwise",
                emulate=cfg.parallel.fp8_emulate,
                shard_group_size=self.mesh.size(self.mesh.ndim - 1),
                cpu_offload=cfg.parallel.cpu_offload,
            )
        plan = ParallelPlan(
            sharding_strategy=cfg.parallel.sharding_strategy,
            bf16=cfg.parallel.bf16,
            activation_checkpointing=cfg.parallel.activation_checkpointing,
            ac_every=cfg.parallel.ac_every,
            compile=self.compiled,
            cpu_offload=cfg.parallel.cpu_offload,
            float8=self.float8,
        )
        self.fsdp = parallelize_model(self.model, self.mesh, plan)
        # Replicas (hybrid, no_shard) all-reduce gradients once per optimizer step rather
        # than once per micro-batch; reduce-scatter within a shard group still runs each
        # time, so gradient memory stays sharded.
        self.defer_all_reduce = cfg.parallel.sharding_strategy in ("hybrid", "no_shard")
        # Equal seeds on replicas of a shard, different seeds on different shards.
        # Offloaded parameters live in CPU memory; the computation's buffers stay on the GPU.
        materialize(
            self.model,
            device=parameter_device(plan, self.device),
            buffer_device=self.device,
            seed=self.seed + shard_coordinate(self.mesh),
        )
        if cfg.model.init_from is not None:
            load_pretrained(self.model, cfg.model.init_from)
        check_replicas_identical(self.model, self.mesh)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]

        # Optimizer and learning-rate schedule.
        self.optimizer = build_optimizer(
            self.model,
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            beta1=cfg.optim.beta1,
            beta2=cfg.optim.beta2,
        )
        self.lr_scheduler = build_lr_scheduler(
            self.optimizer,
            warmup_steps=cfg.optim.warmup_steps,
            max_steps=cfg.optim.max_steps,
            decay_style=cfg.optim.lr_decay_style,
            lr=cfg.optim.lr,
            min_lr=cfg.optim.min_lr,
        )

        # Checkpoints: resume from the newest complete one that loads, if any.
        self.step = 0
        self.batches_read = 0  # this rank's data batches so far (a checkpoint carries it)
        self.resumed_from: str | None = None
        self.checkpoints: CheckpointManager | None = None
        if cfg.checkpoint.checkpoint_dir is not None:
            self.checkpoints = CheckpointManager(
                cfg.checkpoint.checkpoint_dir,
                keep_last=cfg.checkpoint.keep_last_checkpoints,
                async_save=cfg.checkpoint.async_checkpoint,
                every=cfg.checkpoint.checkpoint_freq,
            )
        self._last_saved_step = -1
        if cfg.checkpoint.resume_from_checkpoint:
            self._resume(cfg.checkpoint.resume_from_checkpoint)

        # Metrics: sinks on rank 0, and what one step processes. Outputs bound for S3 are
        # written locally and mirrored (trainer.output_mirror).
        metrics_file = cfg.logging.metrics_file
        if metrics_file is None and cfg.checkpoint.checkpoint_dir is not None:
            metrics_file = f"{cfg.checkpoint.checkpoint_dir.rstrip('/')}/metrics.jsonl"
        self.outputs = OutputMirror(cfg.checkpoint.staging_dir or default_staging_dir())
        metrics_local = self.outputs.local_path(metrics_file, "metrics.jsonl")
        tensorboard_local = self.outputs.local_path(cfg.logging.tensorboard_dir, "tensorboard")
        self.export_dir = self.outputs.local_path(cfg.checkpoint.export_dir, "export")
        if self.dist.is_main:
            self.outputs.restore_file(metrics_file)
        # What this start cost (read before this start appends to the file).
        earlier = read_records(metrics_local) if self.dist.is_main else []
        self.start = account_start(earlier, resumed_step=self.step, now=time.time())
        files = build_sinks(
            is_main=self.dist.is_main,
            metrics_file=metrics_local,
            tensorboard_dir=tensorboard_local,
        )
        self.sinks = MultiSink([files, self.telemetry])  # every rank's records feed its metrics
        # Each periodic task keeps its own cadence: logging here, validation and saves in
        # their components, the divergence guard's judgement in the guard.
        self.log_due = Every(cfg.logging.logging_freq, last=cfg.optim.max_steps)
        self.validator: Validator | None = None
        if val_loader is not None:
            self.validator = Validator(
                val_loader,
                every=cfg.logging.validation_freq,
                max_batches=cfg.logging.validation_batches,
                device=self.device,
                sinks=self.sinks,
            )
        accumulation = cfg.optim.gradient_accumulation_steps
        self.throughput = ThroughputModel(
            samples_per_step=cfg.data.train_batch_size * accumulation * self.dist.world_size,
            seq_len=self.seq_len,
            world_size=self.dist.world_size,
            flops_per_token=flops_per_token(self.hf_config, self.seq_len),
            peak_flops_per_device=peak_flops(self.device),
        )
        # Updates skipped for a non-finite gradient norm (a device tensor: read when logging),
        # and the rule that rolls back to the last checkpoint when skipping is not enough.
        self.skipped_updates = torch.zeros((), device=self.device)
        self._skipped_logged = 0
        self.divergence = DivergenceGuard(
            rollback_after=cfg.safety.rollback_after_nonfinite,
            spike_factor=cfg.safety.loss_spike_factor,
            device=self.device,
            saves_due=self.checkpoints.due if self.checkpoints is not None else Every(0),
        )
        self.rollbacks = 0
        # SIGTERM (spot interruption, drain, deadline): save at the next step boundary, exit.
        self.stops = StopRequests(control_group())
        # A step that never ends (a stuck GPU, link or read) becomes an exit and a restart.
        self.watchdog: HangWatchdog | None = None
        if cfg.safety.watchdog_factor:
            self.watchdog = HangWatchdog(
                factor=cfg.safety.watchdog_factor,
                floor_s=cfg.safety.watchdog_floor_s,
                on_hang=self._on_hang,
            )
        self._log_summary()
        # Last: setup keeps Python's collector; the loop's cadence starts with a pass and a
        # freeze of everything setup built.
        self.garbage = CollectionCadence(cfg.parallel.gc_every)

    # --- setup helpers

    def _resume(self, location: str) -> bool:
        """Every rank: load the newest complete checkpoint in `location` (a directory of them,
        or one `step-N`). One that fails to load is named, set aside and passed over for the
        one before; a second in a row is an error (then the storage, not one checkpoint, is
        the likely culprit). False when there is none."""
        latest = find_latest(location)
        if latest is None:
            logger.info("no complete checkpoint in %s: starting from step 0", location)
            return False
        manager = self.checkpoints or CheckpointManager(
            location, keep_last=self.cfg.checkpoint.keep_last_checkpoints
        )
        try:
            self._load(latest, manager)
            return True
        except UnreadableCheckpointError as unreadable:
            aside = manager.set_aside(latest)
            logger.error("checkpoint: %s; set aside as %s", unreadable, aside)
        previous = find_latest(location)
        if previous is None:
            logger.warning("no other complete checkpoint in %s: starting from step 0", location)
            return False
        logger.warning("checkpoint: falling back to %s", previous)
        self._load(previous, manager)
        return True

    def _load(self, latest: str, manager: CheckpointManager) -> None:
        """Every rank: weights, optimizer, schedule, data position and RNG of `latest`."""
        step, train_state = manager.load(
            latest,
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            allow_world_size_change=self.cfg.checkpoint.allow_world_size_change,
        )
        if "data" in train_state:
            self.train_loader.load_state_dict(train_state["data"])
        if "rng" in train_state:
            restore_rng_state(train_state["rng"])
        default_read = step * self.cfg.optim.gradient_accumulation_steps if train_state else 0
        self.batches_read = int(train_state.get("batches_read", default_read))
        # The weights changed in place: float8 all-gather would otherwise cast them with the
        # scales of the weights a rollback just discarded.
        after_optimizer_step(self.model, self.float8)
        self._train_iter = None
        self.step = self._last_saved_step = step
        self.resumed_from = latest
        self.faults.on_load()
        logger.info("resumed from %s at step %d", latest, step)

    def _log_summary(self) -> None:
        cfg = self.cfg
        total_params = sum(p.numel() for p in self.model.parameters())
        tokens_per_step = self.throughput.samples_per_step * self.seq_len
        logger.info(
            "run: model=%s params=%.3fB (matmul %.3fB/token) | world=%d device=%s backend=%s "
            "| batch %d seq x %d accum x %d ranks = %d tokens/step | steps %d→%d | "
            "%.3g FLOPs/token",
            cfg.model.init_from or cfg.model.preset_name,
            total_params / 1e9,
            matmul_params_per_token(self.hf_config) / 1e9,
            self.dist.world_size,
            self.device,
            self.dist.backend,
            cfg.data.train_batch_size,
            cfg.optim.gradient_accumulation_steps,
            self.dist.world_size,
            tokens_per_step,
            self.step,
            cfg.optim.max_steps,
            self.throughput.flops_per_token,
        )
        logger.info("%s", self.choices_line())
        if self.start.attempt > 1:
            logger.warning("%s", self.start.summary())
        # The whole configuration, so a log or metrics file explains its own run: once, at
        # its first start; a restart runs the same flags (they name the run directory).
        if self.start.attempt == 1:
            logger.info("config: %s", json.dumps(cfg.to_dict(), sort_keys=True))
        else:
            logger.info("config: as at start 1 (the run line of the metrics file holds it)")
        self.sinks.write(
            {
                "kind": "run",
                "step": self.step,
                "world_size": self.dist.world_size,
                "parameters": total_params,
                "flops_per_token": self.throughput.flops_per_token,
                "resumed_from": self.resumed_from,
                "start": self.start.as_dict(),
                "config": cfg.to_dict(),
            }
        )

    # --- the loop

    def train(self) -> None:
        """Run from the current step to exactly `--max_steps`, then save and export."""
        cfg = self.cfg
        timer = StepTimer(start_step=self.step, max_steps=cfg.optim.max_steps)
        self.telemetry.set_state("training")
        with self._progress_bar() as progress:
            while self.step < cfg.optim.max_steps:
                self.stops.begin_step()
                result = self.train_step()
                self.step += 1
                step = self.step
                self.telemetry.step_completed(step)
                mean_loss = self._log_if_due(step, result, timer, progress)
                # Before any save too: never save what a rollback is about to discard.
                reason = self.divergence.judge(step, result.loss, mean_loss)
                if reason is not None:
                    self._roll_back(step, reason)
                    timer = StepTimer(start_step=self.step, max_steps=cfg.optim.max_steps)
                    if self.watchdog is not None:
                        self.watchdog.beat(self.step)
                    if self.stops.agreed():  # this step's agreement is still owed
                        self._stop(self.step)
                    continue
                if self.validator is not None and self.validator.should_validate(step):
                    self.validator.validate(self.model, step)
                self.save_if_due(step)
                self._record_saves()
                self.garbage.after_step(step)
                if progress is not None:
                    progress.update(1)
                if self.watchdog is not None:
                    self.watchdog.beat(step)
                self.faults.after_step(step, self.stops, settle=self._drain_saves)
                if self.stops.agreed():
                    self._stop(step, result)
        # No step follows: the final save and the export (minutes for a large model) are not
        # a hang, and a watchdog exit here would restart a finished run into the same export.
        if self.watchdog is not None:
            self.watchdog.close()
        self.garbage.close()  # nor a step that collects: Python's own collector again
        self._save_last(self.step)
        self._record_saves()
        if self.export_dir is not None:
            self.export(Path(self.export_dir))
        if self.dist.is_main:
            self.outputs.sync()
        self.telemetry.set_state("finished")

    def _on_hang(self, reason: str) -> None:
        """On the watchdog's thread: let a save in flight land, record the hang, exit."""
        self._drain_saves()
        self.sinks.write({"kind": "hang", "step": self.step, "reason": reason})
        HangWatchdog.exit(reason)

    def _drain_saves(self) -> None:
        """Before an exit that is not a stop: wait for a save in flight to become durable,
        up to the watchdog's floor (which covers a save). No collective (the other ranks may
        be the stuck ones): the upload runs in its own process and rank 0 publishes it from
        its own thread, so this needs nothing from a stuck loop."""
        if self.checkpoints is not None and not self.checkpoints.drain(
            self.cfg.safety.watchdog_floor_s
        ):
            logger.error("checkpoint: a save still uploading; exiting without it")
        self._record_saves()

    def _roll_back(self, step: int, reason: str) -> None:
        """Every rank: back to the last complete checkpoint, past every batch read since it.

        Those batches (the ones an earlier rollback to the same checkpoint skipped included)
        are the likely cause, so each rollback to one checkpoint skips more than the one
        before, and a bad patch of data just beyond the first window is not met again."""
        self.telemetry.set_state("rolling_back")
        if self.checkpoints is not None:
            self.checkpoints.wait()  # a save in flight is the newest good state
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        if latest is None or self.rollbacks >= self.cfg.safety.max_rollbacks:
            why = "no checkpoint to roll back to" if latest is None else "too many rollbacks"
            raise RuntimeError(f"step {step}: {reason}, and {why}: stopping the run")
        assert self.checkpoints is not None
        self.rollbacks += 1
        read_before = self.batches_read
        if not self._resume(self.checkpoints.checkpoint_dir):
            raise RuntimeError(f"step {step}: {reason}, and no checkpoint loads: stopping the run")
        window = read_before - self.batches_read
        batches = self._train_batches()
        for _ in range(window):
            next(batches)
        self.batches_read += window
        self.divergence.reset()
        self.garbage.settle()  # what setup loaded and froze was just replaced
        self.sinks.write(
            {
                "kind": "rollback",
                "step": step,
                "to_step": self.step,
                "skipped_batches": window,
                "reason": reason,
            }
        )
        logger.warning(
            "step %d: %s: rolled back to step %d, skipping the %d batch(es) read since",
            step,
            reason,
            self.step,
            window,
        )
        self.telemetry.set_state("training")

    def _stop(self, step: int, result: StepResult | None = None) -> None:
        """Every rank agreed to stop after `step`: save it (unless just saved), record, raise.
        `result`: the step's, whose state the guard judges first (None: a state just loaded)."""
        if result is not None and self.checkpoints is not None:
            reason = self.divergence.judge_before_save(step, result.loss)
            if reason is not None:  # the last checkpoint is the state to stop with
                self._roll_back(step, reason)
                step = self.step
        stop = self.stops.stop(step)
        self.telemetry.set_state("stopping")
        saved = self.checkpoints is not None
        self._save_last(step)
        self._record_saves()
        self.sinks.write({"kind": "stop", "step": step, "signal": stop.signal_name, "saved": saved})
        logger.warning(
            "%s: stopped after step %d%s", stop.signal_name, step, ", checkpoint saved" * saved
        )
        raise stop

    def train_step(self) -> StepResult:
        """One optimizer step over `gradient_accumulation_steps` micro-batches."""
        accumulation = self.cfg.optim.gradient_accumulation_steps
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        digest = ""
        for micro in range(accumulation):
            if self.defer_all_reduce and accumulation > 1:
                self.fsdp.set_requires_all_reduce(micro == accumulation - 1)
            waiting = time.perf_counter()
            batch = next(self._train_batches())
            self.telemetry.data_waited(time.perf_counter() - waiting)
            self.batches_read += 1
            if micro == 0:
                digest = batch_digest(batch["input_ids"])
            scale = self.faults.loss_scale(
                step=self.step + 1, batch=self.batches_read, micro=micro, scale=1.0 / accumulation
            )
            loss = self.forward_backward_step(batch, scale=scale)
            loss_sum += loss
        grad_norm = clip_grad_norm_(self.parameters, self.cfg.optim.grad_clip)
        lr = float(self.optimizer.param_groups[0]["lr"])
        # A non-finite step is skipped on every rank alike; the schedule moves on regardless.
        skipped = step_unless_non_finite(self.optimizer, grad_norm)
        self.skipped_updates += skipped
        self.divergence.observe(skipped)
        after_optimizer_step(self.model, self.float8)
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=loss_sum, grad_norm=grad_norm, lr=lr, digest=digest)

    def choices_line(self) -> str:
        """The settings that decide GPU efficiency, and why each is what it is."""
        parallel, logging_cfg = self.cfg.parallel, self.cfg.logging
        mesh = dict(zip(self.mesh.mesh_dim_names or (), self.mesh.shape, strict=True))
        checkpointing = parallel.activation_checkpointing + (
            f" every {parallel.ac_every}"
            if parallel.activation_checkpointing == "selective"
            else ""
        )
        compile_why = "--compile" if parallel.compile is not None else f"{self.device.type}"
        precision = "bf16" if parallel.bf16 else "fp32"
        if self.float8 is not None:
            # Without compile the scale and cast kernels run unfused: the config refuses
            # fp8 with --compile 0 except under test emulation.
            precision = self.float8.describe() + ("" if self.float8.emulate else ", needs compile")
        loss = (
            f"chunked, {parallel.loss_chunk_tokens} tokens per slice"
            if parallel.loss_chunk_tokens
            else "full logits (--loss_chunk_tokens 0)"
        )
        return (
            f"choices: sharding {parallel.sharding_strategy} over {mesh} | activation "
            f"checkpointing {checkpointing} | precision {precision} | compile "
            f"{'on' if self.compiled else 'off'} ({compile_why}) | loss {loss} | logging every "
            f"{logging_cfg.logging_freq} steps, batch digests every {logging_cfg.digest_freq} | "
            f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}"
        )

    def forward_backward_step(
        self, batch: dict[str, torch.Tensor], *, scale: float
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its (scaled, detached) loss."""
        input_ids = batch["input_ids"].to(self.device, non_blocking=True)
        labels = batch["labels"].to(self.device, non_blocking=True)
        # Packed sequences of exactly seq_len tokens: nothing to pad, nothing to mask. The
        # model shifts labels itself and averages over the seq_len - 1 predicted tokens.
        outputs = self.model(input_ids=input_ids, labels=labels)
        loss = outputs.loss * scale
        loss.backward()
        return loss.detach()

    def _train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._train_iter is None:
            self._train_iter = iter(self.train_loader)
        return self._train_iter

    # --- validation, logging, checkpoints

    def _log_train(self, step: int, result: StepResult, timer: StepTimer) -> float:
        # The one sync point of a logging step: the mean loss over ranks.
        mean_loss = float(all_reduce_mean(result.loss).item())
        extra: dict[str, Any] = {
            "micro_batch_shape": [self.cfg.data.train_batch_size, self.seq_len]
        }
        first_log = step - self.cfg.logging.logging_freq <= timer.start_step
        digest_due = first_log or step % self.cfg.logging.digest_freq == 0
        if digest_due and self.dist.world_size <= MAX_RANKS_WITH_DIGESTS:
            digests: list[str | None] = [None] * self.dist.world_size
            dist.all_gather_object(digests, result.digest)
            extra["batch_digests"] = digests
        skipped = int(self.skipped_updates.item())
        if skipped > self._skipped_logged:
            logger.warning(
                "step %d: %d update(s) skipped for a non-finite gradient norm since the last "
                "log line (%d in this run)",
                step,
                skipped - self._skipped_logged,
                skipped,
            )
            self._skipped_logged = skipped
        extra["skipped_updates"] = skipped
        elapsed, steps = timer.lap(step)
        step_time = elapsed / max(steps, 1)
        record = self.throughput.record(
            step=step,
            loss=mean_loss,
            lr=result.lr,
            grad_norm=float(result.grad_norm.item()),
            elapsed_s=elapsed,
            steps=steps,
            peak_mem_gib=peak_memory_gib(self.device),
            eta_s=timer.eta_seconds(step, step_time),
            extra=extra,
        )
        logger.info(record.log_line())
        self.sinks.write(record.to_json())
        if self.dist.is_main:
            self.outputs.sync_if_due()
        return mean_loss

    def _log_if_due(
        self, step: int, result: StepResult, timer: StepTimer, progress: Any
    ) -> float | None:
        """The step's log line and metrics on a logging step: the loss over ranks, else None."""
        if not self.log_due(step):
            return None
        mean_loss = self._log_train(step, result, timer)
        if progress is not None:
            progress.set_postfix_str(f"loss {mean_loss:.4f}", refresh=False)
        return mean_loss

    def save_if_due(self, step: int) -> None:
        """A periodic save when the checkpoint manager's cadence says one is due."""
        if self.checkpoints is not None and self.checkpoints.due(step):
            self.save(step)

    def save(self, step: int, *, blocking: bool = False) -> None:
        """Collective: model, optimizer, schedule, and this rank's data position and RNG.
        In the background (--async_checkpoint) unless `blocking`."""
        assert self.checkpoints is not None
        train_state: dict[str, Any] = {
            "data": self.train_loader.state_dict(),
            "rng": capture_rng_state(),
            "step": step,
            "batches_read": self.batches_read,
        }
        resume_state = self.telemetry.set_state("checkpointing")
        try:
            self.checkpoints.save(
                step,
                model=self.model,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_state=train_state,
                blocking=blocking,
                faults=self.faults,
            )
        finally:  # the save before it, failed or not, is in the metrics before any exit
            self._record_saves()
            self.telemetry.set_state(resume_state)
        self._last_saved_step = step
        if self.dist.is_main:
            self.outputs.sync()

    def _save_last(self, step: int) -> None:
        """Collective, before the process ends (a stop, or the run's end): the save in flight
        lands (a stop's SIGTERM does not end its upload process: trainer.checkpoint_upload),
        and `step` is saved unless that save was of it. Written by this process; a save lost
        all the same (its upload process killed) is replaced by this one."""
        if self.checkpoints is None:
            return
        if not self.checkpoints.wait():
            self._last_saved_step = -1
        if self._last_saved_step != step:
            self.save(step, blocking=True)

    def _record_saves(self) -> None:
        """Each save that became durable (or failed) since the last call: a metrics line
        with its cost (rank 0, whose thread publishes them)."""
        if self.checkpoints is not None:
            for record in self.checkpoints.pop_finished():
                self.sinks.write(record.as_dict())

    def export(self, out_dir: Path) -> None:
        """Collective: a Hugging Face safetensors model that `transformers` loads back."""
        from trainer.export import export_hf

        export_hf(
            self.model,
            hf_config=self.hf_config,
            tokenizer=self.tokenizer,
            out_dir=out_dir,
            dtype=export_dtype(bf16=self.cfg.parallel.bf16),
        )

    @contextlib.contextmanager
    def _progress_bar(self) -> Iterator[Any]:
        """tqdm on rank 0 of interactive runs, with log lines printed above the bar."""
        wanted = self.cfg.logging.progress_bar
        if wanted is None:
            wanted = sys.stderr.isatty()
        if not (wanted and self.dist.is_main):
            yield None
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        with (
            logging_redirect_tqdm(loggers=[get_logger()]),
            tqdm(
                total=self.cfg.optim.max_steps,
                initial=self.step,
                unit="step",
                dynamic_ncols=True,
            ) as bar,
        ):
            yield bar

    def close(self) -> None:
        self.garbage.close()  # first: a later close that raises leaves no collector off
        if self.watchdog is not None:
            self.watchdog.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
        self.stops.close()
        self.sinks.close()
        if self.dist.is_main:
            self.outputs.sync()  # the records of a run that ends in an error, too
        shutdown()
