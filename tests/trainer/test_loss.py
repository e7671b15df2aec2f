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
