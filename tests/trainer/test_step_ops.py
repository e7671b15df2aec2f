"""The uncompiled step's kernels, counted against the loop a user writes around Hugging Face's
model (scripts/bench/step_ops.py; the figures are in docs/benchmarks.md, "Kernels of one
step"). Counted, not timed: without compile every aten op is a GPU kernel."""

from __future__ import annotations

import pytest

from scripts.bench.step_ops import Shape, StepOps, plain_step_ops, trainer_step_ops

SHAPE = Shape(num_layers=2, vocab_size=2048, seq_len=64, batch_size=2, loss_chunk_tokens=32)
PARAMS_PER_LAYER = 9  # q, k, v, o, gate, up, down, two norms


@pytest.fixture(scope="module")
def counts() -> dict[str, StepOps]:
    import torch.distributed as dist

    from trainer.distributed import init_distributed, shutdown

    assert not dist.is_initialized()
    init_distributed("cpu")
    try:
        return {
            "plain": plain_step_ops(SHAPE),
            "full": trainer_step_ops(SHAPE, "full"),
            "shard_grad_op": trainer_step_ops(SHAPE, "shard_grad_op"),
        }
    finally:
        shutdown()


def test_the_trainer_does_the_matmul_work_of_the_plain_loop_and_no_more(
    counts: dict[str, StepOps],
) -> None:
    """The chunked loss used to recompute each slice's logits in backward: one LM-head
    forward more per step than Hugging Face's path (2 x tokens x hidden x vocab FLOPs)."""
    assert counts["full"].matmul_flops == counts["plain"].matmul_flops
    # Split into slices, the head's three matmuls are more, smaller ones: 3 per slice.
    slices = SHAPE.batch_size * SHAPE.seq_len // SHAPE.loss_chunk_tokens
    assert counts["full"].matmuls == counts["plain"].matmuls + 3 * (slices - 1)


def test_eager_norms_and_rotary_cost_the_same_in_both(counts: dict[str, StepOps]) -> None:
    assert counts["full"].norm_and_rope == counts["plain"].norm_and_rope


def test_keeping_gathered_weights_casts_each_parameter_once_per_step(
    counts: dict[str, StepOps],
) -> None:
    """On one rank FSDP2 unshards by casting each fp32 parameter to bf16 and copying it into
    its unsharded buffer (torch `_fsdp_param_group.py`, `FSDPParamGroup.wait_for_unshard`);
    full sharding does that again in backward for every layer but the last (resharded after
    forward), shard_grad_op keeps forward's copies."""
    regathered = (SHAPE.num_layers - 1) * PARAMS_PER_LAYER
    full, kept = counts["full"], counts["shard_grad_op"]
    assert full.casts - kept.casts == regathered
    assert full.copies - kept.copies == regathered
    assert kept.matmul_flops == full.matmul_flops
