"""Op-level selective activation checkpointing recomputes only what its policy says.

Counted, not timed: every aten op that backward runs is recorded with a dispatch mode, so a
recomputed matmul or attention shows up as one more call than backward itself needs. A Llama
layer has seven projections (q, k, v, o, gate, up, down); each costs two matmuls in backward
(the input's and the weight's gradient), and a recomputed forward adds its own.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, PreTrainedModel

from trainer.models import hf_config_from
from trainer.parallelize import _ATTENTION_OPS, apply_activation_checkpointing
from trainer.presets import get_preset

LAYERS = 2
PROJECTIONS = 7


class OpCounter(TorchDispatchMode):
    """Counts matmuls and attention forwards dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func == torch.ops.aten.mm.default:
            self.counts["mm"] += 1
        elif func in _ATTENTION_OPS:
            self.counts["attention"] += 1
        return func(*args, **(kwargs or {}))


def tiny_llama() -> PreTrainedModel:
    """The trainer's `tiny` preset (SDPA attention, as the trainer configures it)."""
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(
        hf_config_from(get_preset("tiny").with_overrides(num_layers=LAYERS))
    )


def backward_ops(mode: str | None) -> tuple[Counter[str], PreTrainedModel]:
    model = tiny_llama()
    if mode is not None:
        apply_activation_checkpointing(model, mode, every=1)
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    with OpCounter() as counter:
        loss.backward()
    return counter.counts, model


def test_op_level_checkpointing_recomputes_three_matmuls_and_no_attention_per_layer() -> None:
    plain, _ = backward_ops(None)
    full, _ = backward_ops("full")
    op, _ = backward_ops("op")
    backward_only = plain["mm"]
    # Two matmuls per projection and layer, plus the LM head's.
    assert backward_only == 2 * PROJECTIONS * LAYERS + 2
    assert plain["attention"] == 0
    # Full checkpointing runs every layer's forward again, up to the last tensor backward
    # needs (non-reentrant checkpoint stops early, torch `utils/checkpoint.py`
    # `_StopRecomputationError`): 6 matmuls (not down, whose output backward does not read)
    # and attention.
    assert full["mm"] - backward_only == (PROJECTIONS - 1) * LAYERS
    assert full["attention"] == LAYERS
    # Op-level keeps q, v, gate and down (every second matmul) and attention's output:
    # k, o and up are recomputed, attention is not.
    assert op["mm"] - backward_only == 3 * LAYERS
    assert op["attention"] == 0


@pytest.mark.parametrize("mode", ["full", "op"])
def test_checkpointing_gives_the_gradients_of_none(mode: str) -> None:
    _, plain = backward_ops(None)
    _, checkpointed = backward_ops(mode)
    for (name, ours), theirs in zip(
        checkpointed.named_parameters(), plain.parameters(), strict=True
    ):
        assert ours.grad is not None and theirs.grad is not None, name
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_an_unknown_mode_names_the_flag_and_the_modes() -> None:
    with pytest.raises(
        ValueError, match=r"--activation_checkpointing 'most' .* allowed: full, op, selective"
    ):
        apply_activation_checkpointing(copy.deepcopy(tiny_llama()), "most", every=1)
