"""The plan's memory estimate (`infra.estimates.memory_fit`) against torch's own FSDP2 memory
tracer.

The real model, sharded by the trainer, traced for two steps with `FSDPMemTracker` (torch
`distributed/_tools/fsdp2_mem_tracker.py`) on fake tensors and a fake process group, so large
presets trace in seconds on the CPU with 3 layers (70B: 2 and 4, extrapolated).
How, and what is not traced: docs/design/tests.md#test_memory_tracer
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from infra.estimates.memory_fit import RunShape, estimate
from trainer.distributed import DistInfo, build_mesh
from trainer.loss import install_chunked_loss
from trainer.models import build_model, decoder_layers, hf_config_from
from trainer.optim import build_optimizer
from trainer.parallelize import ParallelPlan, checkpointed_layer_indices, parallelize_model
from trainer.presets import PRESETS, ModelShape, get_preset

TOLERANCE = 0.15
"""The estimate must be within ±15% of the traced peak (the published presets are within 5%;
the allowance for the CUDA context and fragmentation is not part of either figure)."""

TINY_TOLERANCE = 0.25
"""The 1M-parameter debug presets (`tiny`, `tiny-moe`, hidden size 64-128) peak at a few MiB, of
which terms the closed form leaves out (rotary tables, attention statistics, index tensors:
per token, not per hidden unit) are a fifth; they run on CPUs and in smoke tests only."""

GPUS_PER_NODE = 8
WORLD = 32  # 4 nodes of 8 GPUs, as llama31-8b-p5 runs


@contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _mesh(strategy: str, world_size: int, hsdp_shard_size: int = 0) -> Any:
    info = DistInfo(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=min(GPUS_PER_NODE, world_size),
        device=torch.device("cpu"),
        backend="fake",
    )
    return build_mesh(info, strategy, hsdp_shard_size)


def trace_peak(shape: ModelShape, run: RunShape, strategy: str, *, ac_every: int = 0) -> int:
    """Traced peak bytes of two training steps of the trainer's model, sharded as `strategy`."""
    world = WORLD if strategy != "hybrid" else 2 * GPUS_PER_NODE
    with fake_world(world):
        mesh = _mesh(strategy, world)
        plan = ParallelPlan(
            sharding_strategy=strategy,
            activation_checkpointing=(
                "off"
                if run.checkpointed_layers == 0
                else "op"
                if run.ac_keeps_matmuls
                else "selective"
                if ac_every
                else "full"
            ),
            ac_every=ac_every or 1,
        )
        with FakeTensorMode():
            model = build_model(hf_config_from(shape))
            if run.loss_chunk_tokens:
                install_chunked_loss(model, run.loss_chunk_tokens)
            parallelize_model(model, mesh, plan)  # the same module, now FSDP2's
            model.to_empty(device="cpu")
            optimizer = build_optimizer(
                model, lr=1e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, fused=False
            )
            ids = torch.randint(0, shape.vocab_size, (run.micro_batch_size, run.context_width))
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((ids,))
            with tracker:
                for step in range(2):
                    outputs = model(input_ids=ids, labels=ids)
                    outputs.loss.backward()
                    del outputs
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step == 0:
                        # Per-module stats only (the peak stays): the tracker refuses a
                        # second forward of the root otherwise.
                        tracker.reset_mod_stats()
            peak = tracker.get_tracker_snapshot("peak")
    return int(peak[torch.device("cpu")]["Total"])


def run_of(shape: ModelShape, strategy: str, *, batch: int, context: int, ac: int) -> RunShape:
    """The estimator's view of the traced run (what `infra.estimates.memory_fit.run_shape`
    derives)."""
    world = WORLD if strategy != "hybrid" else 2 * GPUS_PER_NODE
    shard = {"full": world, "shard_grad_op": world, "hybrid": GPUS_PER_NODE, "no_shard": 1}
    return RunShape(
        shape=shape,
        micro_batch_size=batch,
        context_width=context,
        shard_size=shard[strategy],
        reshard_after_forward=strategy in ("full", "hybrid"),
        checkpointed_layers=ac,
    )


def assert_close(shape: ModelShape, run: RunShape, strategy: str, **trace: Any) -> float:
    traced = trace_peak(shape, run, strategy, **trace)
    estimated = sum(estimate(run).values())
    error = estimated / traced - 1
    tolerance = TINY_TOLERANCE if shape.hidden_size <= 128 else TOLERANCE
    assert abs(error) <= tolerance, (
        f"estimate {estimated / 2**20:.0f} MiB vs traced {traced / 2**20:.0f} MiB "
        f"({error:+.1%}) for {shape.model_type} {run}"
    )
    return error


def test_tiny_full_sharding_matches_the_tracer() -> None:
    shape = get_preset("tiny")
    run = run_of(shape, "full", batch=4, context=512, ac=0)
    assert_close(shape, run, "full")


# Each preset with its first three layers, at a micro-batch x context like the stacks' (the 70B
# and the 1M-parameter models with checkpointing, the others without, so both paths are seen).
CASES = [
    (name, strategy)
    for name in sorted(PRESETS)
    for strategy in ("full", "hybrid")
    if not name.startswith("tiny") or strategy == "full"
] + [("tiny", "hybrid"), ("tiny-moe", "hybrid")]


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "strategy"), CASES)
def test_every_preset_matches_the_tracer(preset: str, strategy: str) -> None:
    shape = get_preset(preset).with_overrides(num_layers=3)
    checkpointed = 3 if "70b" in preset or preset.startswith("tiny") else 0
    run = run_of(shape, strategy, batch=2, context=1024, ac=checkpointed)
    assert_close(shape, run, strategy)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["shard_grad_op", "no_shard"])
def test_strategies_that_keep_layers_gathered_match_the_tracer(strategy: str) -> None:
    shape = get_preset("llama3.2-1b").with_overrides(num_layers=4)
    run = run_of(shape, strategy, batch=4, context=1024, ac=4 if strategy == "no_shard" else 0)
    assert_close(shape, run, strategy)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "checkpointed"),
    [("llama3.1-8b", 0), ("llama3.1-8b", 3), ("llama3.2-1b", 3), ("llama3.2-3b", 0)],
)
def test_the_chunked_loss_matches_the_tracer(preset: str, checkpointed: int) -> None:
    """The trainer's default loss (`trainer.loss`): one slice's logits, none after the loss."""
    shape = get_preset(preset).with_overrides(num_layers=3)
    run = replace(
        run_of(shape, "full", batch=2, context=4096, ac=checkpointed), loss_chunk_tokens=1024
    )
    assert_close(shape, run, "full")
    plain = replace(run, loss_chunk_tokens=0)
    assert sum(estimate(run).values()) < sum(estimate(plain).values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "strategy"),
    [("llama3.1-8b", "full"), ("llama3.1-8b", "hybrid"), ("llama3.2-3b", "full")],
)
def test_op_level_checkpointing_matches_the_tracer(preset: str, strategy: str) -> None:
    """`--activation_checkpointing op` with the chunked loss: what `auto` picks for the shipped
    stacks. (The 32k-vocabulary multi-head models, llama2-7b and mistral-7b, are overestimated
    by 13-18% there: on the safe side, and outside this test's tolerance.)"""
    shape = get_preset(preset).with_overrides(num_layers=3)
    run = replace(
        run_of(shape, strategy, batch=2, context=4096, ac=3),
        ac_keeps_matmuls=True,
        loss_chunk_tokens=1024,
    )
    assert_close(shape, run, strategy)


@pytest.mark.slow
def test_selective_checkpointing_matches_the_tracer() -> None:
    shape = get_preset("llama3.1-8b").with_overrides(num_layers=4)
    every = 2
    checkpointed = len(checkpointed_layer_indices(shape.num_layers, "selective", every))
    run = run_of(shape, "full", batch=1, context=4096, ac=checkpointed)
    assert_close(shape, run, "full", ac_every=every)


@pytest.mark.slow
def test_a_70b_model_extrapolated_from_two_and_four_layers() -> None:
    """Per-layer terms are linear in the layer count: trace 2 and 4 layers, extend the line
    to llama3.1-70b's 80 layers, and compare with the estimate for the whole model."""
    full_shape = get_preset("llama3.1-70b")
    base = run_of(full_shape, "full", batch=1, context=8192, ac=full_shape.num_layers)
    peaks = {}
    for layers in (2, 4):
        shape = full_shape.with_overrides(num_layers=layers)
        peaks[layers] = trace_peak(
            shape, replace(base, shape=shape, checkpointed_layers=layers), "full"
        )
    per_layer = (peaks[4] - peaks[2]) / 2
    extrapolated = peaks[2] + per_layer * (full_shape.num_layers - 2)
    estimated = sum(estimate(base).values())
    assert abs(estimated / extrapolated - 1) <= TOLERANCE, (estimated, extrapolated)


def test_experts_are_sharded_over_every_rank_not_padded() -> None:
    """With 8 experts over 32 ranks, FSDP2's dim-0 sharding would give 8 ranks one expert each
    and 24 ranks padding; `trainer.parallelize.shard_placement` shards dim 1 instead."""
    shape = get_preset("tiny-moe").with_overrides(num_local_experts=8, num_experts_per_tok=2)
    with fake_world(WORLD):
        mesh = _mesh("full", WORLD)
        with FakeTensorMode():
            model = build_model(hf_config_from(shape))
            parallelize_model(model, mesh, ParallelPlan())
            layer: Any = decoder_layers(model)[0]
            experts = layer.mlp.experts.gate_up_proj
            assert isinstance(experts, DTensor)
            assert experts.placements == (Shard(1),)
            assert experts.to_local().shape[0] == 8
            attention = layer.self_attn.q_proj.weight
            assert isinstance(attention, DTensor)
            assert attention.placements == (Shard(0),)
