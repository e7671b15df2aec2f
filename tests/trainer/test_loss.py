"""The chunked loss: the same loss and gradients as Hugging Face's, a fraction of the memory.

Counted, not timed: the memory of the loss path is measured with torch's own
`MemTracker` (`torch.distributed._tools.mem_tracker`) on fake tensors, at the 8B stack's
size (2 x 8192 tokens, hidden 4096, vocabulary 128,256), so no memory is used.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel
from transformers.loss.loss_utils import ForCausalLMLoss

from tests.trainer.torchrun_util import tiny_args
from trainer.config import parse_args
from trainer.loss import chunked_causal_lm_loss, install_chunked_loss
from trainer.models import hf_config_from
from trainer.presets import get_preset
from trainer.tiny_assets import TinyAssets
from trainer.train import Trainer

GIB = 2**30


def tiny_llama() -> PreTrainedModel:
    """The trainer's `tiny` preset with a larger vocabulary, as the trainer configures it."""
    torch.manual_seed(0)
    shape = get_preset("tiny").with_overrides(num_layers=2, vocab_size=4096)
    return AutoModelForCausalLM.from_config(hf_config_from(shape))


@pytest.mark.parametrize("chunk", [1, 97, 256, 10_000])
def test_same_loss_and_gradients_as_hugging_face(chunk: int) -> None:
    """Chunks that divide the tokens, that do not, one token, and one chunk for all."""
    plain = tiny_llama()
    chunked = copy.deepcopy(plain)
    install_chunked_loss(chunked, chunk)
    ids = torch.randint(0, 4096, (2, 128), generator=torch.Generator().manual_seed(1))
    expected = plain(input_ids=ids, labels=ids).loss
    expected.backward()
    loss = chunked(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for (name, ours), theirs in zip(chunked.named_parameters(), plain.parameters(), strict=True):
        assert ours.grad is not None and theirs.grad is not None, name
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6, msg=name)
    # The model is unchanged otherwise: same state dict keys, logits without labels.
    assert list(chunked.state_dict()) == list(plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(chunked(input_ids=ids).logits, plain(input_ids=ids).logits)


def _loss_path_peak(chunk: int) -> int:
    """Peak bytes of the loss's forward and backward alone, from the final hidden states of
    the 8B stack's micro-batch to their gradient, on fake tensors."""
    tokens, hidden_size, vocab = 2 * 8192, 4096, 128_256
    with FakeTensorMode():
        head = nn.Linear(hidden_size, vocab, bias=False, dtype=torch.bfloat16)
        hidden = torch.randn(2, tokens // 2, hidden_size, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (2, tokens // 2))
        tracker = MemTracker()
        tracker.track_external(head, hidden)
        with tracker:
            if chunk:
                loss = chunked_causal_lm_loss(hidden, head, labels, chunk)
            else:
                loss = ForCausalLMLoss(head(hidden), labels, vocab_size=vocab)
            loss.backward()
        peak = tracker.get_tracker_snapshot("peak")
    return int(sum(stats["Total"] for stats in peak.values()))


def test_the_chunked_loss_needs_a_sixth_of_the_memory_at_the_8b_size() -> None:
    default = parse_args([]).parallel.loss_chunk_tokens
    plain, chunked = _loss_path_peak(0), _loss_path_peak(default)
    # The plain path holds 16,384 x 128,256 logits in bf16, fp32, the saved log-softmax and
    # its gradient: 24.6 GiB traced with the head's weight and gradient (2 GiB); the chunked
    # path one slice of them beside the same weight, the gradient summed in fp32 and the
    # hidden states: 4.4 GiB.
    assert plain > 24 * GIB, plain / GIB
    assert chunked < plain / 5, (chunked / GIB, plain / GIB)


def _head_gradient(chunk: int, dtype: torch.dtype) -> torch.Tensor:
    """The head's weight gradient of a loss in `dtype` (0: unsliced), from the same
    bf16-representable weights and hidden states whatever the dtype."""
    generator = torch.Generator().manual_seed(3)
    weight = nn.Parameter((torch.randn(512, 64, generator=generator) * 0.05).bfloat16().to(dtype))
    hidden = torch.randn(1, 1024, 64, generator=generator).bfloat16().to(dtype)
    labels = torch.randint(0, 512, (1, 1024), generator=generator)
    head = nn.Linear(64, 512, bias=False)
    head.weight = weight
    if chunk:
        loss = chunked_causal_lm_loss(hidden, head, labels, chunk)
    else:
        loss = ForCausalLMLoss(head(hidden), labels, vocab_size=512)
    loss.backward()
    assert weight.grad is not None
    return weight.grad.float()


def test_many_slices_do_not_round_the_head_gradient_more_in_bf16() -> None:
    """Summed per slice in bf16 (what autograd does for a weight used once per slice), the
    head's gradient drifts with the number of slices; summed in fp32 it stays as close to the
    fp32 gradient as the unsliced bf16 loss, whatever the slicing."""
    reference = _head_gradient(0, torch.float32)

    def error(chunk: int) -> float:
        return float((_head_gradient(chunk, torch.bfloat16) - reference).norm() / reference.norm())

    unsliced = error(0)
    for chunk in (256, 16, 4):  # 4 to 256 slices
        assert error(chunk) < 1.5 * unsliced, (chunk, error(chunk), unsliced)


def test_a_model_whose_forward_adds_a_router_loss_is_refused_with_the_flag() -> None:
    config = MixtralConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=2,
        output_router_logits=True,
    )
    with pytest.raises(ValueError, match=r"--loss_chunk_tokens 0"):
        install_chunked_loss(MixtralForCausalLM(config), 128)


def _losses(assets: TinyAssets, tmp_path: Path, chunk: int) -> tuple[list[float], str]:
    metrics = tmp_path / f"metrics-{chunk}.jsonl"
    args = tiny_args(
        assets,
        max_steps=4,
        loss_chunk_tokens=chunk,
        metrics_file=metrics,
        checkpoint_dir=tmp_path / f"ckpt-{chunk}",
        checkpoint_freq=0,
    )
    run = Trainer(parse_args(args))
    try:
        run.train()
    finally:
        run.close()
    records: list[dict[str, Any]] = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["loss"] for r in records if r.get("kind") == "train"], run.choices_line()


def test_the_trainer_trains_the_same_with_either_loss(
    tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    chunked, chunked_line = _losses(tiny_assets, tmp_path, 50)  # 4 x 64 tokens: 6 slices
    plain, plain_line = _losses(tiny_assets, tmp_path, 0)
    assert len(chunked) == len(plain) == 4
    assert chunked == pytest.approx(plain, rel=1e-5)
    # The startup line says which loss ran, and the other choices with their reasons.
    assert "loss chunked, 50 tokens per slice" in chunked_line
    assert "loss full logits (--loss_chunk_tokens 0)" in plain_line
    assert "compile off (cpu)" in chunked_line  # unset: on with CUDA only
    assert "activation checkpointing off" in chunked_line
    assert "logging every 1 steps, batch digests every 1" in chunked_line


class _RecomputeInBackward(torch.autograd.Function):
    """The chunked loss as it was before its gradients moved into forward: each slice's
    logits recomputed in backward. The oracle for "same bits, one head matmul fewer"."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:  # fmt: skip
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), chunk):
            logits = nn.functional.linear(hidden[start : start + chunk], weight).float()
            total += nn.functional.cross_entropy(
                logits, targets[start : start + chunk], ignore_index=-100, reduction="sum"
            )
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, targets.numel(), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            piece, wanted = hidden[rows], targets[rows]
            grad_logits = torch.softmax(nn.functional.linear(piece, weight).float(), dim=-1)
            valid = (wanted != -100).unsqueeze(1)
            grad_logits.scatter_add_(
                1, torch.where(valid, wanted.unsqueeze(1), 0), -valid.to(grad_logits.dtype)
            )
            grad_logits = (grad_logits * (valid * grad_total)).to(hidden.dtype)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += grad_logits.t() @ piece
        return grad_hidden, grad_weight, None, None


def _bf16_head_gradients(
    scale: float, recompute: bool, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss and gradients from the same bf16-representable weights and hidden states."""
    from trainer.loss import shifted_labels

    generator = torch.Generator().manual_seed(5)
    weight = nn.Parameter((torch.randn(512, 64, generator=generator) * 0.05).bfloat16().to(dtype))
    hidden = torch.randn(2, 300, 64, generator=generator).bfloat16().to(dtype).requires_grad_()
    labels = torch.randint(0, 512, (2, 300), generator=generator)
    if recompute:
        targets = shifted_labels(labels).reshape(-1)
        total = _RecomputeInBackward.apply(hidden.reshape(-1, 64), weight, targets, 128)
        loss = total / (targets != -100).sum()
    else:
        head = nn.Linear(64, 512, bias=False)
        head.weight = weight
        loss = chunked_causal_lm_loss(hidden, head, labels, 128)
    (loss * scale).backward()
    assert hidden.grad is not None and weight.grad is not None
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_gradients_in_forward_give_the_bits_of_recomputing_in_backward(scale: float) -> None:
    """One micro-batch (scale 1) or a power-of-two accumulation: bit for bit the gradients
    of recomputing each slice's logits in backward, so fixed-seed bf16 runs do not change."""
    ours, theirs = _bf16_head_gradients(scale, False), _bf16_head_gradients(scale, True)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_other_accumulations_differ_by_bf16_rounding_only() -> None:
    """With 3 micro-batches the 1/3 is applied after the bf16 cast of the logits' gradient
    instead of before: a different rounding, as close to the fp32 gradients as before
    (0.26%/0.27% of their norm for the hidden states'/head's gradient, against 0.22%/0.27%)."""
    ours, before = _bf16_head_gradients(1 / 3, False), _bf16_head_gradients(1 / 3, True)
    fp32 = _bf16_head_gradients(1 / 3, True, torch.float32)
    assert torch.equal(ours[0], before[0])  # the loss itself is computed as before

    def error(a: torch.Tensor, exact: torch.Tensor) -> float:
        return float((a.float() - exact).norm() / exact.norm())

    for a, b, exact in zip(ours[1:], before[1:], fp32[1:], strict=True):
        assert error(a, exact) < 1.25 * error(b, exact), (error(a, exact), error(b, exact))


def test_validation_computes_no_gradients() -> None:
    model = tiny_llama()
    install_chunked_loss(model, 64)
    ids = torch.randint(0, 4096, (2, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    assert loss.grad_fn is None and torch.isfinite(loss)
