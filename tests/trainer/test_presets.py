"""Preset shapes against the published figures, and the no-torch import contract."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from trainer.presets import PRESETS, ModelShape, approx_num_parameters, get_preset

# Published parameter counts (model cards / safetensors index totals), in billions.
PUBLISHED_BILLIONS = {
    "llama2-7b": 6.74,
    "llama2-13b": 13.02,
    "llama2-70b": 68.98,
    "llama3.1-8b": 8.03,
    "llama3.1-70b": 70.55,
    "llama3.2-1b": 1.24,
    "llama3.2-3b": 3.21,
    "mistral-7b": 7.24,
    "mathstral-7b": 7.25,
    "mixtral-8x7b": 46.70,
}


def test_preset_names_are_the_contracted_ones() -> None:
    assert set(PRESETS) == set(PUBLISHED_BILLIONS) | {"tiny", "tiny-moe"}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_shape_formula_matches_published_count(name: str) -> None:
    billions = approx_num_parameters(PRESETS[name]) / 1e9
    assert billions == pytest.approx(PUBLISHED_BILLIONS[name], abs=0.006)


def test_published_details() -> None:
    assert PRESETS["llama3.2-1b"].tie_word_embeddings
    assert PRESETS["llama3.2-3b"].tie_word_embeddings
    assert not PRESETS["llama3.1-8b"].tie_word_embeddings
    assert PRESETS["llama3.1-8b"].rope_theta == 500000.0
    assert PRESETS["llama3.1-8b"].rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert PRESETS["llama3.2-1b"].rope_scaling is not None
    assert PRESETS["llama3.2-1b"].rope_scaling["factor"] == 32.0
    assert PRESETS["llama3.1-70b"].num_key_value_heads == 8
    assert PRESETS["llama2-7b"].num_key_value_heads == 32
    assert PRESETS["llama2-70b"].num_key_value_heads == 8
    assert PRESETS["mistral-7b"].sliding_window == 4096
    assert PRESETS["mixtral-8x7b"].num_local_experts == 8
    assert PRESETS["mixtral-8x7b"].num_experts_per_tok == 2
    assert PRESETS["tiny"].vocab_size == 512
    assert PRESETS["tiny"].max_position_embeddings == 2048
    assert 0.5e6 < approx_num_parameters(PRESETS["tiny"]) < 2e6
    assert PRESETS["tiny-moe"].model_type == "mixtral"


def test_every_preset_has_every_field_set() -> None:
    for name, shape in PRESETS.items():
        for f in dataclasses.fields(ModelShape):
            if f.name not in ("rope_scaling", "sliding_window"):
                assert getattr(shape, f.name) is not None, (name, f.name)


def test_unknown_preset_lists_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown model preset 'llama9'.*llama3.1-8b"):
        get_preset("llama9")


def test_inconsistent_shape_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads"):
        PRESETS["tiny"].with_overrides(num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_local_experts"):
        PRESETS["tiny"].with_overrides(num_local_experts=4)


def test_presets_and_config_import_no_ml_framework() -> None:
    """The Pulumi program imports these; pulling in torch there would be a packaging bug."""
    code = (
        "import sys, trainer.presets, trainer.config\n"
        "heavy = {'torch', 'transformers', 'datasets', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
