"""Model shape presets with the published architecture of each supported model.

This module is imported by the Pulumi program to validate stack configs and to render the
trainer's command line, so it must stay free of torch / transformers: plain dataclasses only.
The figures come from the models' published Hugging Face `config.json` files (vocabulary,
rope theta and scaling, grouped-query heads, tied embeddings, context length).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

ModelType = Literal["llama", "mistral", "mixtral"]

# Llama 3.1 and 3.2 stretch an 8k-trained rope to 128k context with the "llama3" frequency
# scaling; the factor differs between the two releases (8 for 3.1, 32 for 3.2).
_LLAMA31_ROPE_SCALING: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA32_ROPE_SCALING: dict[str, Any] = {**_LLAMA31_ROPE_SCALING, "factor": 32.0}


@dataclass(frozen=True)
class ModelShape:
    """The architecture of a decoder-only causal LM, independent of any framework.

    `num_local_experts == 0` means a dense MLP; Mixtral-style models route each token to
    `num_experts_per_tok` of `num_local_experts` experts.
    """

    model_type: ModelType
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool = False
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.model_type not in ("llama", "mistral", "mixtral"):
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; "
                "allowed: 'llama', 'mistral', 'mixtral'"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.num_heads <= 0 or self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a positive multiple of "
                f"num_heads={self.num_heads}"
            )
        if self.num_key_value_heads <= 0 or self.num_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)"
            )
        if self.model_type == "mixtral":
            if self.num_local_experts < 1 or not (
                1 <= self.num_experts_per_tok <= self.num_local_experts
            ):
                raise ValueError(
                    "a mixtral model needs num_local_experts >= 1 and "
                    "1 <= num_experts_per_tok <= num_local_experts, got "
                    f"{self.num_local_experts} and {self.num_experts_per_tok}"
                )
        elif self.num_local_experts:
            raise ValueError(
                f"num_local_experts={self.num_local_experts} is only valid for model_type "
                f"'mixtral', not {self.model_type!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def with_overrides(self, **overrides: Any) -> ModelShape:
        """A copy with the given fields replaced; `None` values mean "keep the preset's"."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _llama2(hidden: int, inter: int, layers: int, heads: int, kv_heads: int) -> ModelShape:
    return ModelShape(
        model_type="llama",
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    )


def _llama3(
    hidden: int,
    inter: int,
    layers: int,
    heads: int,
    *,
    tied: bool,
    rope_scaling: dict[str, Any],
) -> ModelShape:
    return ModelShape(
        model_type="llama",
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        rope_scaling=dict(rope_scaling),
    )


PRESETS: dict[str, ModelShape] = {
    "llama2-7b": _llama2(4096, 11008, 32, 32, 32),
    "llama2-13b": _llama2(5120, 13824, 40, 40, 40),
    "llama2-70b": _llama2(8192, 28672, 80, 64, 8),
    "llama3.1-8b": _llama3(4096, 14336, 32, 32, tied=False, rope_scaling=_LLAMA31_ROPE_SCALING),
    "llama3.1-70b": _llama3(8192, 28672, 80, 64, tied=False, rope_scaling=_LLAMA31_ROPE_SCALING),
    "llama3.2-1b": _llama3(2048, 8192, 16, 32, tied=True, rope_scaling=_LLAMA32_ROPE_SCALING),
    "llama3.2-3b": _llama3(3072, 8192, 28, 24, tied=True, rope_scaling=_LLAMA32_ROPE_SCALING),
    # Mistral 7B v0.1 as published with the paper: 4k sliding-window attention, rope theta 1e4.
    "mistral-7b": ModelShape(
        model_type="mistral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        sliding_window=4096,
    ),
    # Mathstral 7B is built on Mistral 7B v0.3: 32768 vocabulary, theta 1e6, full attention.
    "mathstral-7b": ModelShape(
        model_type="mistral",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-5,
    ),
    "mixtral-8x7b": ModelShape(
        model_type="mixtral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-5,
        num_local_experts=8,
        num_experts_per_tok=2,
    ),
    # Debug flavours for CPU tests and smoke runs: the same code paths at ~1M parameters.
    "tiny": ModelShape(
        model_type="llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=352,
        num_layers=4,
        num_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    ),
    "tiny-moe": ModelShape(
        model_type="mixtral",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
}


def get_preset(name: str) -> ModelShape:
    """The preset called `name`, or a ValueError that lists the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown model preset {name!r}; allowed: {', '.join(sorted(PRESETS))}"
        ) from None


def approx_num_parameters(shape: ModelShape) -> int:
    """Parameter count from the shape alone (no framework), matching the HF implementations.

    Used for plans and cost estimates where torch is not available; `trainer.models`
    checks it against a model built on the meta device.
    """
    head_dim = shape.head_dim
    attention = shape.hidden_size * head_dim * (2 * shape.num_heads + 2 * shape.num_key_value_heads)
    dense_mlp = 3 * shape.hidden_size * shape.intermediate_size
    if shape.num_local_experts:
        mlp = shape.num_local_experts * dense_mlp + shape.hidden_size * shape.num_local_experts
    else:
        mlp = dense_mlp
    norms = 2 * shape.hidden_size
    per_layer = attention + mlp + norms
    embeddings = shape.vocab_size * shape.hidden_size
    lm_head = 0 if shape.tie_word_embeddings else embeddings
    return shape.num_layers * per_layer + embeddings + lm_head + shape.hidden_size
