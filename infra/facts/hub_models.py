"""What the plan knows of the Hugging Face Hub models and tokenizers stacks name, offline.

`model.initFrom` and `data.tokenizer` are read by the trainer only when the pods start, from
the Hub or a volume; a stack whose weights are of another architecture than its preset, or
whose tokenizer has more ids than its model's embedding, would fail there (or train something
its estimates did not plan for) after the GPU nodes were paid for. For the ids below the plan
can tell before: the preset each model's published `config.json` is (the presets are
transcribed from those files, `trainer/presets.py`), and `len(tokenizer)` of each tokenizer.
Instruct and chat variants share their base's architecture and tokenizer. An id not listed is
not refused: the plan says its estimates assume `model.preset`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HubModel:
    preset: str | None
    """The preset whose shape the model's `config.json` has; None: no preset has it."""
    tokenizer_size: int
    """`len(tokenizer)`: every id the tokenizer can produce."""


def _variants(preset: str | None, size: int, *ids: str) -> dict[str, HubModel]:
    return {hub_id: HubModel(preset, size) for hub_id in ids}


LLAMA3_VOCAB = 128256
"""Llama 3.x's 128,000 BPE tokens and 256 reserved special tokens (every size and version)."""
LLAMA2_VOCAB = 32000
MISTRAL_V1_VOCAB = 32000
MISTRAL_V3_VOCAB = 32768
"""Mistral 7B v0.3 "extended vocabulary to 32768" (its model card, mistralai/
Mistral-7B-Instruct-v0.3 README); Mathstral 7B is built on it."""

HUB_MODELS: dict[str, HubModel] = {
    "hf-internal-testing/llama-tokenizer": HubModel(None, LLAMA2_VOCAB),
    **_variants(
        "llama2-7b", LLAMA2_VOCAB,
        "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf",
    ),
    **_variants(
        "llama2-13b", LLAMA2_VOCAB,
        "meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf",
    ),
    **_variants(
        "llama2-70b", LLAMA2_VOCAB,
        "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf",
    ),
    **_variants(
        "llama3.1-8b", LLAMA3_VOCAB,
        "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ),
    **_variants(
        "llama3.1-70b", LLAMA3_VOCAB,
        "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct",
    ),
    **_variants(
        "llama3.2-1b", LLAMA3_VOCAB,
        "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct",
    ),
    **_variants(
        "llama3.2-3b", LLAMA3_VOCAB,
        "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct",
    ),
    **_variants(
        "mistral-7b", MISTRAL_V1_VOCAB,
        "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
    ),
    # v0.2 and v0.3 drop v0.1's sliding window and raise rope theta: no preset is their shape.
    **_variants(None, MISTRAL_V1_VOCAB, "mistralai/Mistral-7B-Instruct-v0.2"),
    **_variants(
        None, MISTRAL_V3_VOCAB, "mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3",
    ),
    **_variants("mathstral-7b", MISTRAL_V3_VOCAB, "mistralai/Mathstral-7B-v0.1"),
    **_variants(
        "mixtral-8x7b", MISTRAL_V1_VOCAB,
        "mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1",
    ),
}  # fmt: skip
