"""Export the trained (sharded) model as a Hugging Face model directory.

The result is what the rest of the ecosystem consumes: ``AutoModelForCausalLM.from_pretrained``,
vLLM, TGI, the Hub. Gathering happens on every rank (it is a collective), writing on rank 0 only.

Writing goes through ``PreTrainedModel.save_pretrained`` of a *meta-device* skeleton built from
the config, handed the gathered state dict: transformers then does what its own loader expects
(tied weights dropped, any fused-weight layout reverted to the published one, shards over
``max_shard_size`` with an index, ``generation_config.json``) without a second copy of the
weights ever being allocated.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.checkpoint import run_on_rank0
from trainer.log import get_logger

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

logger = get_logger("export")


def gather_full_state_dict(model: nn.Module) -> dict[str, Any]:
    """Full, unsharded CPU tensors on rank 0 (an empty dict elsewhere); collective.

    ``cpu_offload`` moves each gathered tensor off the GPU as it arrives, so GPU memory never
    holds more than one full parameter; only rank 0 keeps the result.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def export_hf(
    model: nn.Module,
    *,
    hf_config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: Path,
    dtype: torch.dtype | None = None,
    max_shard_size: str = "5GB",
) -> None:
    """Write ``model`` as a Hugging Face model dir (config, safetensors, tokenizer); collective.

    ``dtype`` casts floating-point weights on the way out (e.g. ``torch.bfloat16`` halves the
    size of fp32 master weights); None keeps the training dtype, so logits match exactly.
    ``max_shard_size`` bounds each ``.safetensors`` file (smaller files upload and download
    in parallel).
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    full_state = gather_full_state_dict(model)

    def write() -> None:
        if dtype is not None:
            for key, tensor in full_state.items():
                if tensor.is_floating_point():
                    full_state[key] = tensor.to(dtype)
        # config.json must name the dtype actually written: from_pretrained(dtype="auto")
        # loads in that dtype, so a stale one would change the logits.
        skeleton = _meta_skeleton(hf_config, _weights_dtype(full_state))
        out_dir.mkdir(parents=True, exist_ok=True)
        skeleton.save_pretrained(out_dir, state_dict=full_state, max_shard_size=max_shard_size)
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)

    run_on_rank0(write, f"exporting the model to {out_dir}")
    logger.info(
        "export: wrote Hugging Face model to %s in %.1fs", out_dir, time.perf_counter() - started
    )


def _weights_dtype(state: dict[str, Any]) -> torch.dtype:
    for tensor in state.values():
        if tensor.is_floating_point():
            dtype: torch.dtype = tensor.dtype
            return dtype
    raise ValueError("export: the gathered state dict has no floating-point weights")


def _meta_skeleton(hf_config: PretrainedConfig, dtype: torch.dtype) -> Any:
    """The model class for ``hf_config`` with no storage: it only lends ``save_pretrained`` its
    knowledge of the architecture (tied keys, weight layout, generation defaults)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(hf_config)  # save_pretrained writes dtype/architectures into it
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return skeleton.to(dtype)
