"""The causal-LM loss without the whole vocabulary's fp32 logits alive at once.

Hugging Face's `ForCausalLMLoss` (transformers `loss/loss_utils.py`) upcasts all bf16 logits to
fp32 (~27 GiB transient for the 8B stack). The chunked path computes the same mean token loss
in slices of `chunk_tokens` positions, gradients included in forward (`_SlicedHeadCrossEntropy`),
so one slice's logits are alive at a time. `install_chunked_loss` rebinds the model's `forward`,
so FSDP2's root pre-hook still gathers the LM head and the state dict keys stay the model's.
Why and sources: docs/design/trainer.md#loss
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from transformers.modeling_outputs import CausalLMOutputWithPast

IGNORE_INDEX = -100
"""The label Hugging Face's loss ignores; the last position of each row predicts nothing."""


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """Next-token targets as `ForCausalLMLoss` builds them: shifted left, padded with
    `IGNORE_INDEX`, so position t is scored against token t + 1."""
    return functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


class _SlicedHeadCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T` against `targets` over `count` predicted
    positions, one slice of positions at a time, with the gradients computed in forward
    from each slice's logits.

    Numerically it follows `ForCausalLMLoss` over `LlamaForCausalLM`'s head; the head's weight
    gradient is summed over slices in fp32 and cast once at the end.
    Why: docs/design/trainer.md#_slicedheadcrossentropy"""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        count: torch.Tensor,
        chunk: int,
        with_grads: bool,
    ) -> torch.Tensor:
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if with_grads else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if with_grads else None
        # d(mean)/d(sum): what autograd's division by `count` would hand the sum's backward.
        per_position = torch.ones((), dtype=torch.float32, device=hidden.device) / count
        for start in range(0, targets.numel(), chunk):
            rows = slice(start, start + chunk)
            piece, wanted = hidden[rows], targets[rows]
            logits = functional.linear(piece, weight).float()
            total += functional.cross_entropy(
                logits, wanted, ignore_index=IGNORE_INDEX, reduction="sum"
            )
            if grad_hidden is None or grad_weight is None:
                continue
            # d(sum of cross-entropies)/d(logits) = softmax - one-hot, zero on ignored rows;
            # by scatter and multiply, not boolean indexing (a host-device sync on GPUs).
            grad_logits = torch.softmax(logits, dim=-1)
            del logits
            valid = (wanted != IGNORE_INDEX).unsqueeze(1)
            grad_logits.scatter_add_(
                1, torch.where(valid, wanted.unsqueeze(1), 0), -valid.to(grad_logits.dtype)
            )
            grad_logits = (grad_logits * (valid * per_position)).to(hidden.dtype)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += grad_logits.t() @ piece
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(
        ctx: Any, grad_mean: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is None or grad_weight is None:
            raise RuntimeError("the chunked loss was computed without gradients (no_grad)")
        if getattr(ctx, "scaled", False):
            raise RuntimeError("the chunked loss's backward can run once (retain_graph)")
        ctx.scaled = True
        wants_hidden, wants_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden.mul_(grad_mean)  # in place: no second copy
        # Scaled and cast to the weight's dtype in one pass over the fp32 sum (the cast autograd
        # would make of an fp32 gradient anyway); computed in fp32 and rounded once, so the
        # same bits as scaling first and casting after.
        weight_grad = None
        if wants_weight:
            weight_grad = torch.mul(
                grad_weight, grad_mean, out=torch.empty_like(grad_weight, dtype=ctx.weight_dtype)
            )
        return (
            grad_hidden if wants_hidden else None,
            weight_grad,
            None,
            None,
            None,
            None,
        )


def chunked_causal_lm_loss(
    hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean next-token cross-entropy of `head(hidden)` against `labels` over the predicted
    positions, computed `chunk_tokens` positions at a time.

    Equal to `ForCausalLMLoss(head(hidden), labels)` up to the order of the fp32 summation
    (and, in bf16, closer to the fp32 gradient: see `_SlicedHeadCrossEntropy`)."""
    if head.bias is not None:
        raise ValueError("the chunked loss supports LM heads without a bias (Llama, Mistral)")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = shifted_labels(labels).reshape(-1)
    # Every row's last position is ignored; packed rows have no other ignored label, but
    # count them as `ForCausalLMLoss` does (reduction "mean" over non-ignored targets).
    count = (targets != IGNORE_INDEX).sum()
    with_grads = torch.is_grad_enabled() and (
        flat_hidden.requires_grad or head.weight.requires_grad
    )
    loss: torch.Tensor = _SlicedHeadCrossEntropy.apply(
        flat_hidden, head.weight, targets, count, chunk_tokens, with_grads
    )
    return loss


def _forward_with_chunked_loss(
    self: Any,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> CausalLMOutputWithPast:
    """`XForCausalLM.forward` for training: the decoder, then the chunked loss; logits only
    when there are no labels (the LM head over every position, as the original returns)."""
    outputs = self.model(input_ids=input_ids, **kwargs)
    hidden = outputs.last_hidden_state
    if labels is None:
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))
    loss = chunked_causal_lm_loss(hidden, self.lm_head, labels, self._loss_chunk_tokens)
    return CausalLMOutputWithPast(loss=loss)


def install_chunked_loss(model: nn.Module, chunk_tokens: int) -> None:
    """Make `model(input_ids=..., labels=...)` compute its loss in chunks (see the module).

    For causal LMs built as a decoder `model.model` and a bias-free `model.lm_head`, with no
    auxiliary loss added to the forward's (Mixtral's router loss is off unless
    `output_router_logits`)."""
    config = getattr(model, "config", None)
    if getattr(config, "output_router_logits", False):
        raise ValueError(
            "--loss_chunk_tokens: the chunked loss does not add the router's auxiliary loss "
            "(output_router_logits); pass --loss_chunk_tokens 0"
        )
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Linear) or head.bias is not None or not hasattr(model, "model"):
        raise ValueError(
            f"--loss_chunk_tokens: {type(model).__name__} is not a decoder with a bias-free "
            "`lm_head`; pass --loss_chunk_tokens 0"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    model._loss_chunk_tokens = chunk_tokens
    model.forward = types.MethodType(_forward_with_chunked_loss, model)
