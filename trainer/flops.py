"""Model FLOPs per token and the GPUs' peak FLOP/s: the arithmetic behind MFU.

Torch-free on purpose: the trainer's metrics (`trainer.metrics`) measure MFU with it, and the
Pulumi program (`infra.estimates.duration`) estimates a run's length with the same figures before
any GPU exists, in an environment without torch.

MFU follows the PaLM appendix convention used by torchtitan: model FLOPs per token are
6 x (parameters that do matmuls for a token) + 12 x layers x heads x head_dim x seq_len for
attention scores and values (forward + backward, causal mask not discounted). Embedding
lookups are not matmuls and are left out; the LM head is counted even when it is tied.
"""

from __future__ import annotations

from typing import Any

# Dense (no sparsity) bf16 tensor-core peak per GPU, from NVIDIA's data sheets. Matched by
# substring of the device name; the first match wins, so specific names go first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989.4e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.05e12),
    ("L40", 181.05e12),
    ("L4", 121.0e12),
    # The A10G (g5) is a different part from the A10: its published dense bf16 figure is
    # 70 TFLOP/s, against the A10 data sheet's 125. Using 125 would halve g5 MFU.
    ("A10G", 70.0e12),
    ("A10", 125.0e12),
)


MIN_FP8_CAPABILITY = (8, 9)
"""The first CUDA compute capability with FP8 tensor cores (Ada: L4, L40S); Hopper is 9.0 and
Blackwell 10.0. torch's `_scaled_mm`, which torchao's float8 matmuls call, refuses anything
older (pytorch `aten/src/ATen/native/cuda/Blas.cpp`, `_scaled_mm_out_cuda`). Here, torch-free,
so that the plan refuses `training.precision: fp8` on such GPUs before any is paid for
(`infra.config.stack`) by the same figure the trainer checks on the device (`trainer.float8`)."""


def peak_flops_of(gpu_name: str) -> float | None:
    """Peak bf16 FLOP/s of the GPU called `gpu_name` (a device name or "H100"), else None."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in gpu_name:
            return flops
    return None


def matmul_params_per_token(config: Any) -> int:
    """Parameters a token is multiplied through: attention, the active MLP experts, LM head."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * int(config.intermediate_size)
    experts = int(getattr(config, "num_local_experts", 0) or 0)
    if experts:
        active = int(config.num_experts_per_tok)
        mlp = active * mlp + hidden * experts  # routed experts plus the router
    return int(config.num_hidden_layers) * (attention + mlp) + int(config.vocab_size) * hidden


def flops_per_token(config: Any, seq_len: int) -> int:
    """Training FLOPs (forward + backward) per token at this sequence length."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    attention_scores = 12 * int(config.num_hidden_layers) * heads * head_dim * seq_len
    return 6 * matmul_params_per_token(config) + attention_scores
