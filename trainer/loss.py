"""The causal-LM loss without the whole vocabulary's fp32 logits alive at once.

Hugging Face's `ForCausalLM` forward (transformers `models/llama/modeling_llama.py`,
`LlamaForCausalLM.forward`) applies the LM head to every position, then its loss
(`loss/loss_utils.py`, `ForCausalLMLoss`) upcasts the whole bf16 logits tensor to fp32 and
takes a cross-entropy over it. For the 8B stack (2 x 8192 tokens per micro-batch, vocabulary
128,256) that is 4 GiB of bf16 logits, 8 GiB of fp32 logits and as much again for the saved
log-softmax and its gradient at the start of backward: ~27 GiB transient of an 80 GiB card
(`infra.estimates.memory_fit`), which is what forces full activation checkpointing or a smaller
batch.

The chunked path computes the same mean token loss in slices of `chunk_tokens` positions: one
autograd function (`_SlicedHeadCrossEntropy`) runs each slice's head matmul, fp32 upcast and
cross-entropy in forward, keeps only the final hidden states (saved anyway), and in backward
recomputes one slice's logits at a time, so what is alive is one slice's logits and the head's
fp32 gradient. The price is one more LM-head forward per step (2 x hidden x vocab FLOPs per
token, ~2% of a Llama 3.1 8B step).

It runs inside the model's own forward (`install_chunked_loss` rebinds the instance's
`forward`): FSDP2's root unit gathers the LM head in its forward pre-hook (torch
`distributed/fsdp/_fully_shard/_fsdp_state.py`, `_pre_forward`), which fires on `model(...)`
whatever `forward` is, and the state dict's keys stay the model's own.
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
    """Summed cross-entropy of `hidden @ weight.T` against `targets`, one slice of positions
    at a time in forward and again in backward, where each slice's logits are recomputed.

    Numerically it follows `ForCausalLMLoss` over `LlamaForCausalLM`'s head: the matmul in the
    compute dtype, the softmax in fp32, the logits' gradient cast back to the compute dtype
    before the matmuls of backward (as autograd does through `.float()`). The head's weight
    gradient is summed over the slices in fp32 and cast once at the end: summing it in bf16,
    as autograd would for a weight used once per slice, rounds the running sum at every slice
    (0.7% relative error at 16 slices, 3% at 256, against 0.5% for the unsliced loss)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), chunk):
            logits = functional.linear(hidden[start : start + chunk], weight).float()
            total += functional.cross_entropy(
                logits, targets[start : start + chunk], ignore_index=IGNORE_INDEX, reduction="sum"
            )
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(
        ctx: Any, grad_total: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        hidden, weight, targets = ctx.saved_tensors
        wants_hidden, wants_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_weight else None
        for start in range(0, targets.numel(), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            piece, wanted = hidden[rows], targets[rows]
            # d(sum of cross-entropies)/d(logits) = softmax - one-hot, zero on ignored rows;
            # by scatter and multiply, not boolean indexing (a host-device sync on GPUs).
            grad_logits = torch.softmax(functional.linear(piece, weight).float(), dim=-1)
            valid = (wanted != IGNORE_INDEX).unsqueeze(1)
            grad_logits.scatter_add_(
                1, torch.where(valid, wanted.unsqueeze(1), 0), -valid.to(grad_logits.dtype)
            )
            grad_logits = (grad_logits * (valid * grad_total)).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += grad_logits.t() @ piece
        return grad_hidden, grad_weight, None, None


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
    total = _SlicedHeadCrossEntropy.apply(flat_hidden, head.weight, targets, chunk_tokens)
    # Every row's last position is ignored; packed rows have no other ignored label, but
    # count them as `ForCausalLMLoss` does (reduction "mean" over non-ignored targets).
    return total / (targets != IGNORE_INDEX).sum()


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
