"""Hugging Face causal LMs built from a preset shape, on the meta device, then materialised.

The life of a model here: `build_model` constructs it on the meta device (no memory), the
caller shards it (`trainer.parallelize`), then `materialize` allocates only this rank's shards
and initialises them with the model's own `_init_weights` (normal(0, initializer_range) for
matrices, ones for norms, rotary `inv_freq` recomputed), and `load_pretrained` optionally
overwrites them with published weights read slice by slice from safetensors. No process ever
holds the full weights of a sharded model.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PretrainedConfig,
    PreTrainedModel,
)

from trainer.log import get_logger
from trainer.presets import ModelShape

logger = get_logger("models")

_CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "mixtral": MixtralConfig,
}
META = torch.device("meta")


def hf_config_from(
    shape: ModelShape,
    *,
    attn_implementation: str = "sdpa",
    initializer_range: float = 0.02,
    **overrides: Any,
) -> PretrainedConfig:
    """The transformers config for a preset shape; `overrides` are passed to the config as is."""
    kwargs: dict[str, Any] = {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "initializer_range": initializer_range,
        # Training never decodes incrementally; a KV cache would only cost memory.
        "use_cache": False,
    }
    if shape.rope_scaling is not None:
        kwargs["rope_scaling"] = dict(shape.rope_scaling)
    if shape.model_type in ("mistral", "mixtral"):
        kwargs["sliding_window"] = shape.sliding_window
    if shape.model_type == "mixtral":
        kwargs["num_local_experts"] = shape.num_local_experts
        kwargs["num_experts_per_tok"] = shape.num_experts_per_tok
    kwargs.update(overrides)
    config = _CONFIG_CLASSES[shape.model_type](**kwargs)
    config._attn_implementation = attn_implementation
    return config


def pretrained_config(name_or_path: str, *, attn_implementation: str = "sdpa") -> PretrainedConfig:
    """The architecture of a published model (hub id or local dir), for `--init_from`."""
    config = AutoConfig.from_pretrained(name_or_path)
    if getattr(config, "model_type", None) not in _CONFIG_CLASSES:
        raise ValueError(
            f"--init_from {name_or_path!r} is a {config.model_type!r} model; "
            f"supported: {', '.join(_CONFIG_CLASSES)}"
        )
    config.use_cache = False
    config._attn_implementation = attn_implementation
    return config


def build_model(
    config: PretrainedConfig,
    *,
    device: torch.device = META,
    init_from: str | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """Construct the model on the meta device (no memory, any size).

    With a real `device`, also materialise and initialise it unsharded (single-process uses:
    tests, export checks, benchmarks of small models). For sharded training keep the default
    and call `materialize` (and `load_pretrained`) after `fully_shard`.
    """
    with torch.device(META):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if device.type != "meta":
        materialize(model, device=device, seed=seed)
        if init_from is not None:
            load_pretrained(model, init_from)
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks: the unit of sharding, checkpointing and compiling."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} has no `model.layers` ModuleList of decoder layers"
        )
    return layers


@torch.no_grad()
def materialize(
    model: PreTrainedModel,
    *,
    device: torch.device,
    seed: int,
    buffer_device: torch.device | None = None,
) -> None:
    """Allocate (this rank's shards of) the parameters on `device` and initialise them.

    `seed` must be equal on ranks that hold the same shard (replicas) and should differ
    between shards; `trainer.train` passes the base seed plus the rank's shard coordinate.
    Random ops on a sharded parameter draw only the local shard. With CPU offload the
    parameters live on the CPU (`device`) while buffers such as rotary frequencies are used
    by the computation and belong on the GPU (`buffer_device`).
    """
    model.to_empty(device=device)
    # Marks left by an earlier init would make transformers skip these (now garbage) tensors.
    for module in model.modules():
        if hasattr(module, "_is_hf_initialized"):
            del module._is_hf_initialized
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # On a CPU mesh DTensor draws each shard from the local generator, which is why the
        # caller seeds per shard; the warning says just that.
        warnings.filterwarnings("ignore", message="DTensor random operators may not have")
        model.initialize_weights()
    model.tie_weights()
    if buffer_device is not None and buffer_device != device:
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = buffer.to(buffer_device)
    model.train()
    _check_finite(model)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _check_finite(model: nn.Module) -> None:
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        local = _local(tensor)
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            raise RuntimeError(f"{name} is not finite after initialisation")


def resolve_pretrained_dir(name_or_path: str) -> Path:
    """A local directory holding the model's safetensors: the path itself, or a hub download."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    # Every rank calls this; the hub client's file locks let one download while others wait.
    # Mistral's repositories also hold the whole model again in its own layout
    # (consolidated.safetensors, 14+ GB) that transformers does not read: leave it there.
    return Path(
        snapshot_download(
            name_or_path,
            allow_patterns=["*.json", "*.safetensors"],
            ignore_patterns=["consolidated*"],
        )
    )


# transformers keeps Mixtral's experts fused (one [experts, ...] tensor per layer), while
# checkpoints on the hub, and save_pretrained, keep the original per-expert matrices.
_FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
_RENAMES = ((".mlp.gate.weight", ".block_sparse_moe.gate.weight"),)


def _checkpoint_key(fqn: str, available: set[str]) -> str:
    """The name `fqn` has in a safetensors checkpoint (the original one for renamed weights)."""
    if fqn in available:
        return fqn
    for ours, theirs in _RENAMES:
        if fqn.endswith(ours):
            return fqn[: -len(ours)] + theirs
    return fqn


def _local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's rows of a parameter sharded on dim 0 (FSDP's layout) and the first row's
    global index; the whole tensor and 0 when it is not sharded."""
    if not isinstance(tensor, DTensor):
        return tensor, 0
    local_shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    if any(offset[1:]) or tuple(local_shape[1:]) != tuple(tensor.shape[1:]):
        raise NotImplementedError(f"only dim-0 sharding is supported, got {tensor.placements}")
    return tensor.to_local(), int(offset[0])


def _load_fused_experts(state: dict[str, Any], directory: Path) -> set[str]:
    """Fill this rank's experts of every fused expert tensor from per-expert matrices.

    Reads only the experts this rank holds: gate_up_proj[e] is w1 then w3 of expert e
    stacked on dim 0, down_proj[e] is w2.
    """
    fused = [fqn for fqn in state if fqn.endswith(_FUSED_EXPERTS)]
    if not fused:
        return set()
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(safe_open(str(file), framework="pt"))
            for file in sorted(directory.glob("*.safetensors"))
        ]
        # A safe_open handle is not a mapping: keys() is its only listing.
        where = {key: handle for handle in handles for key in handle.keys()}  # noqa: SIM118

        def read(key: str) -> torch.Tensor:
            if key not in where:
                raise ValueError(f"checkpoint {directory} has no weight {key!r}")
            return where[key].get_tensor(key)

        for fqn in fused:
            local, first = _local_rows(state[fqn])
            prefix = fqn.rsplit(".mlp.experts.", 1)[0] + ".block_sparse_moe.experts."
            for row in range(local.shape[0]):
                expert = f"{prefix}{first + row}"
                if fqn.endswith("gate_up_proj"):
                    value = torch.cat([read(f"{expert}.w1.weight"), read(f"{expert}.w3.weight")])
                else:
                    value = read(f"{expert}.w2.weight")
                local[row].copy_(value)
    return set(fused)


@torch.no_grad()
def load_pretrained(model: PreTrainedModel, name_or_path: str) -> None:
    """Overwrite the (possibly sharded) parameters with published safetensors weights.

    Collective when the model is sharded. Distributed checkpoint's Hugging Face reader reads
    only the slices this rank owns (fused MoE experts: only its experts), so a 70B model
    loads without any rank holding it whole.
    """
    directory = resolve_pretrained_dir(name_or_path)
    reader = dcp.HuggingFaceStorageReader(str(directory))
    available = set(reader.read_metadata().state_dict_metadata)
    state = get_model_state_dict(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    fused = _load_fused_experts(state, directory)
    by_checkpoint_key = {
        _checkpoint_key(fqn, available): tensor
        for fqn, tensor in state.items()
        if fqn not in fused and not (tied and fqn == "lm_head.weight")
    }
    missing = sorted(set(by_checkpoint_key) - available)
    if missing:
        raise ValueError(
            f"--init_from {name_or_path!r} lacks {len(missing)} weights the model needs, "
            f"e.g. {missing[:3]}; is it the same architecture?"
        )
    # DCP loads into these tensors in place, so `state` (same tensors) holds the result.
    dcp.load(by_checkpoint_key, storage_reader=reader)
    if tied:
        # A tied head is the embedding; checkpoints of tied models leave it out.
        state.pop("lm_head.weight", None)
    set_model_state_dict(model, state, options=StateDictOptions(strict=not tied))
    model.tie_weights()
    _check_finite(model)
    logger.info("loaded pretrained weights from %s", directory)


def count_parameters(config: PretrainedConfig) -> int:
    """Parameters of the model `config` describes, counted on the meta device (no memory).

    Tied weights count once, as in the published figures.
    """
    model = build_model(config)
    return sum(p.numel() for p in model.parameters())
