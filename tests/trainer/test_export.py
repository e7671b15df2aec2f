"""Export to a Hugging Face model dir and load it back with transformers: same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from trainer.data import load_tokenizer
from trainer.export import export_hf


def _tiny_llama(vocab_size: int, *, tie: bool) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Non-default weights everywhere (norms start at 1), so a dropped or mis-tied key shows.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model.eval()


def _logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def _saved_keys(out_dir: Path) -> set[str]:
    keys: set[str] = set()
    for file in out_dir.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            keys.update(f.keys())
    return keys


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_export_reloads_with_identical_logits(tmp_path, tiny_assets, tie):
    tokenizer = load_tokenizer(str(tiny_assets.tokenizer_dir))
    model = _tiny_llama(len(tokenizer), tie=tie)
    input_ids = torch.tensor([tokenizer("count from 3 in steps of 2 : 3 5 7 9 .")["input_ids"]])
    expected = _logits(model, input_ids)

    out = tmp_path / "hf"
    export_hf(model, hf_config=model.config, tokenizer=tokenizer, out_dir=out)

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(_logits(reloaded, input_ids), expected, rtol=0, atol=0)
    keys = _saved_keys(out)
    assert ("lm_head.weight" in keys) is not tie  # a tied head is stored once, as HF does
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    assert (
        reloaded_tokenizer("1 plus 2 is 3 .")["input_ids"]
        == tokenizer("1 plus 2 is 3 .")["input_ids"]
    )


def test_export_of_fsdp2_sharded_model_matches_unsharded_logits(
    tmp_path, tiny_assets, gloo_world_of_one
):
    tokenizer = load_tokenizer(str(tiny_assets.tokenizer_dir))
    model = _tiny_llama(len(tokenizer), tie=True)
    input_ids = torch.tensor([tokenizer("monday tuesday wednesday")["input_ids"]])
    expected = _logits(model, input_ids)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert type(model).__name__ == "FSDPLlamaForCausalLM"

    out = tmp_path / "hf"
    export_hf(model, hf_config=model.config, tokenizer=None, out_dir=out)

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(_logits(reloaded, input_ids), expected, rtol=0, atol=0)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_export_casts_to_requested_dtype_and_records_it(tmp_path, tiny_assets):
    tokenizer = load_tokenizer(str(tiny_assets.tokenizer_dir))
    model = _tiny_llama(len(tokenizer), tie=False)
    out = tmp_path / "hf-bf16"
    export_hf(model, hf_config=model.config, tokenizer=None, out_dir=out, dtype=torch.bfloat16)

    with safe_open(next(out.glob("*.safetensors")), framework="pt") as f:
        dtypes = {f.get_tensor(key).dtype for key in f.keys()}  # noqa: SIM118
    assert dtypes == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.dtype == torch.bfloat16
    expected = model.model.embed_tokens.weight.detach().to(torch.bfloat16)
    assert torch.equal(reloaded.model.embed_tokens.weight, expected)


def test_export_of_mixtral_writes_the_published_expert_layout(tmp_path):
    """transformers 5 fuses Mixtral's experts in memory; the export must write the published
    per-expert layout (what vLLM and older transformers read) and still reload identically."""
    from trainer.models import build_model, hf_config_from
    from trainer.presets import get_preset

    config = hf_config_from(get_preset("tiny-moe"))
    model = build_model(config, device=torch.device("cpu")).eval()
    assert any("experts.gate_up_proj" in name for name, _ in model.named_parameters())
    input_ids = torch.randint(
        0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)
    )
    expected = _logits(model, input_ids)

    out = tmp_path / "hf-moe"
    export_hf(model, hf_config=config, tokenizer=None, out_dir=out)

    keys = _saved_keys(out)
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in keys
    assert not any("gate_up_proj" in key for key in keys)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(_logits(reloaded, input_ids), expected, rtol=0, atol=0)
