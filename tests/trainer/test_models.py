"""Model construction: published sizes on the meta device, proper initialisation, sharding,
and pretrained weights read into shards."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.trainer.torchrun_util import free_port
from trainer.distributed import DistInfo, build_mesh, shard_coordinate
from trainer.models import (
    build_model,
    count_parameters,
    decoder_layers,
    hf_config_from,
    load_pretrained,
    materialize,
    pretrained_config,
)
from trainer.parallelize import ParallelPlan, checkpointed_layer_indices, parallelize_model
from trainer.presets import PRESETS, approx_num_parameters
from trainer.train import clip_grad_norm_

# Published totals (billions): Llama 3.1 8B ≈ 8.03, 70B ≈ 70.6, Llama 3.2 1B ≈ 1.24, 3B ≈ 3.21,
# Llama 2 7B ≈ 6.74, Mistral 7B ≈ 7.24, Mixtral 8x7B ≈ 46.7.
PUBLISHED = {
    "llama3.1-8b": 8.03,
    "llama3.1-70b": 70.6,
    "llama3.2-1b": 1.24,
    "llama3.2-3b": 3.21,
    "llama2-7b": 6.74,
    "llama2-13b": 13.0,
    "llama2-70b": 69.0,
    "mistral-7b": 7.24,
    "mathstral-7b": 7.25,
    "mixtral-8x7b": 46.7,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_builds_on_meta_with_the_published_size(name: str) -> None:
    config = hf_config_from(PRESETS[name])
    model = build_model(config)
    # Nothing was allocated: every parameter and buffer lives on the meta device.
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    counted = count_parameters(config)
    assert counted / 1e9 == pytest.approx(PUBLISHED[name], abs=0.06)
    # The framework-free formula the infra side uses agrees exactly with transformers.
    assert counted == approx_num_parameters(PRESETS[name])


def test_hf_config_carries_the_published_details() -> None:
    llama32 = hf_config_from(PRESETS["llama3.2-1b"])
    assert llama32.tie_word_embeddings is True
    assert llama32.rope_parameters["rope_type"] == "llama3"
    assert llama32.rope_parameters["factor"] == 32.0
    assert llama32.rope_parameters["rope_theta"] == 500000.0
    assert llama32.num_key_value_heads == 8
    mistral = hf_config_from(PRESETS["mistral-7b"])
    assert (mistral.model_type, mistral.sliding_window) == ("mistral", 4096)
    mixtral = hf_config_from(PRESETS["mixtral-8x7b"])
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok) == (8, 2)


def _assert_initialised(model: Any, std: float = 0.02) -> None:
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        assert torch.isfinite(local).all(), name
        if "norm" in name:
            assert torch.equal(local, torch.ones_like(local)), name
        elif local.numel() > 1000:
            assert local.float().std().item() == pytest.approx(std, rel=0.15), name
    for rotary in (m for m in model.modules() if hasattr(m, "inv_freq")):
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        theta = model.config.rope_parameters["rope_theta"]
        expected = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
        torch.testing.assert_close(rotary.inv_freq.cpu(), expected)


def test_unsharded_materialisation_initialises_like_transformers() -> None:
    model = build_model(hf_config_from(PRESETS["tiny"]), device=torch.device("cpu"), seed=3)
    _assert_initialised(model)
    ids = torch.randint(0, 512, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    # Freshly initialised: close to uniform over the vocabulary, and finite.
    assert loss.item() == pytest.approx(math.log(512), rel=0.05)


@pytest.fixture(scope="module")
def single_rank_group() -> Iterator[DistInfo]:
    """A one-process gloo group, so `fully_shard` and DCP run as they do under torchrun."""
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    yield DistInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        device=torch.device("cpu"),
        backend="gloo",
    )
    if owned:
        dist.destroy_process_group()


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_sharded_build_materialises_and_trains(preset: str, single_rank_group: DistInfo) -> None:
    config = hf_config_from(PRESETS[preset].with_overrides(tie_word_embeddings=True))
    model = build_model(config)
    mesh = build_mesh(single_rank_group, "full")
    plan = ParallelPlan(activation_checkpointing="selective", ac_every=2, bf16=False)
    parallelize_model(model, mesh, plan)
    materialize(model, device=torch.device("cpu"), seed=7 + shard_coordinate(mesh))
    _assert_initialised(model)
    # The tie survives sharding and materialisation.
    assert model.lm_head.weight is model.model.embed_tokens.weight
    wrapped = [type(layer).__name__ for layer in decoder_layers(model)]
    assert wrapped.count("FSDPCheckpointWrapper") == len(
        checkpointed_layer_indices(len(wrapped), "selective", 2)
    )
    ids = torch.randint(0, 512, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    params = list(model.parameters())
    assert all(p.grad is not None for p in params)
    # The global norm over the DTensor gradient shards equals the norm of the full gradient,
    # and clipping scales every shard by the same factor.
    grads: list[Any] = [p.grad for p in params]
    full = torch.cat([g.full_tensor().flatten() for g in grads])
    norm = clip_grad_norm_(params, max_norm=0.5)
    torch.testing.assert_close(norm, full.norm(), rtol=1e-4, atol=1e-6)  # summation order
    clipped = torch.cat([g.full_tensor().flatten() for g in grads])
    torch.testing.assert_close(clipped.norm(), torch.tensor(0.5), rtol=1e-4, atol=1e-6)


def test_checkpointed_layer_choice() -> None:
    assert checkpointed_layer_indices(4, "full", 3) == [0, 1, 2, 3]
    assert checkpointed_layer_indices(5, "selective", 2) == [0, 2, 4]
    with pytest.raises(ValueError, match="--activation_checkpointing 'some'"):
        checkpointed_layer_indices(4, "some", 1)


@pytest.mark.parametrize(("preset", "tied"), [("tiny", False), ("tiny", True), ("tiny-moe", False)])
def test_init_from_a_local_pretrained_dir_loads_into_shards(
    preset: str, tied: bool, tmp_path: Path, single_rank_group: DistInfo
) -> None:
    """Includes Mixtral's layout: per-expert matrices on disk, fused experts in the model."""
    config = hf_config_from(PRESETS[preset].with_overrides(tie_word_embeddings=tied))
    source = build_model(config, device=torch.device("cpu"), seed=11)
    source.save_pretrained(tmp_path)
    loaded_config = pretrained_config(str(tmp_path))
    assert loaded_config.tie_word_embeddings is tied

    model = build_model(loaded_config)
    parallelize_model(model, build_mesh(single_rank_group, "full"), ParallelPlan(bf16=False))
    materialize(model, device=torch.device("cpu"), seed=0)
    load_pretrained(model, str(tmp_path))
    for name, param in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name].full_tensor(), param, msg=name)
    ids = torch.randint(0, 512, (1, 12))
    torch.testing.assert_close(model(input_ids=ids).logits, source(input_ids=ids).logits)


def test_init_from_rejects_another_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="is a 'gpt2' model"):
        pretrained_config(str(tmp_path))


def test_compile_wraps_each_decoder_layer_keeping_checkpoint_keys() -> None:
    """`--compile` compiles the blocks; checkpoint and export keys stay the plain HF names."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from trainer.parallelize import apply_activation_checkpointing, apply_compile

    model = build_model(hf_config_from(PRESETS["tiny"]), device=torch.device("cpu"))
    keys_before = sorted(model.state_dict())
    apply_activation_checkpointing(model, "full", 1)
    apply_compile(model)
    assert all(type(layer).__name__ == "OptimizedModule" for layer in decoder_layers(model))
    assert sorted(get_model_state_dict(model)) == keys_before


def test_hybrid_mesh_shape_follows_the_node_size() -> None:
    from trainer.distributed import hsdp_shape

    assert hsdp_shape(16, 8) == (2, 8)  # two nodes of eight GPUs: shard in-node
    assert hsdp_shape(2, 1) == (2, 1)
    with pytest.raises(ValueError, match="--hsdp_shard_size"):
        hsdp_shape(12, 8)


def test_strategy_choices(single_rank_group: DistInfo) -> None:
    from trainer.parallelize import mixed_precision_policy, reshard_after_forward

    assert [reshard_after_forward(s) for s in ("full", "hybrid", "shard_grad_op", "no_shard")] == [
        True,
        True,
        False,
        False,
    ]
    assert mixed_precision_policy(True).param_dtype == torch.bfloat16
    assert mixed_precision_policy(True).reduce_dtype == torch.float32
    assert mixed_precision_policy(False).param_dtype is None
    assert build_mesh(single_rank_group, "no_shard").mesh_dim_names == ("replicate", "shard")
    assert build_mesh(single_rank_group, "shard_grad_op").mesh_dim_names == ("shard",)
    with pytest.raises(ValueError, match="--sharding_strategy 'zero3'"):
        build_mesh(single_rank_group, "zero3")


def test_cpu_offload_on_gpu_joins_a_cpu_backend_too() -> None:
    """Offloaded shards and gradients are CPU tensors: their collectives (the gradient norm,
    the replica check) need gloo beside nccl, which takes no CPU tensors."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from trainer.distributed import process_group_backend

    gpu = torch.device("cuda", 3)
    assert process_group_backend(gpu) == "nccl"
    offloaded = process_group_backend(gpu, cpu_offload=True)
    assert BackendConfig(Backend(offloaded)).get_device_backend_map() == {
        "cuda": "nccl",
        "cpu": "gloo",
    }
    assert process_group_backend(torch.device("cpu"), cpu_offload=True) == "gloo"


def test_init_from_a_hub_id_downloads_only_the_transformers_weights(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Mistral repos carry a second full copy in their own layout (consolidated.safetensors);
    a run that fetches it downloads 14+ GB it never reads."""
    import fnmatch

    import huggingface_hub

    from trainer.models import resolve_pretrained_dir

    asked: dict[str, Any] = {}

    def fake_download(repo_id: str, **kwargs: Any) -> str:
        asked.update(kwargs, repo_id=repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_pretrained_dir("mistralai/Mathstral-7B-v0.1") == tmp_path
    assert asked["repo_id"] == "mistralai/Mathstral-7B-v0.1"
    repo_files = [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "consolidated.safetensors",
        "original/consolidated.00.pth",
        "tokenizer.model.v3",
    ]

    def fetched(name: str) -> bool:
        allowed = any(fnmatch.fnmatch(name, p) for p in asked.get("allow_patterns") or ["*"])
        ignored = any(fnmatch.fnmatch(name, p) for p in asked.get("ignore_patterns") or [])
        return allowed and not ignored

    assert [f for f in repo_files if fetched(f)] == [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
    ]
