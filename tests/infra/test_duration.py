"""The run-length estimate uses the trainer's own MFU arithmetic (trainer.flops), unchanged."""

from __future__ import annotations

import pytest

from infra.config import load_stack_file
from infra.duration import ASSUMED_MFU, STARTUP_HOURS, estimate_duration, shape_flops_config
from trainer.flops import flops_per_token
from trainer.presets import PRESETS


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_shape_adapter_gives_the_trainers_flops_for_every_preset(preset: str) -> None:
    """What the trainer logs MFU with (flops_per_token of the transformers config that
    trainer.models.hf_config_from builds) is what the estimate uses, for every preset."""
    from trainer.models import hf_config_from

    shape = PRESETS[preset]
    for seq_len in (2048, 8192):
        assert flops_per_token(shape_flops_config(shape), seq_len) == flops_per_token(
            hf_config_from(shape), seq_len
        )


def test_llama31_8b_on_32_h100_by_hand() -> None:
    """10,000 steps x 256 x 8192 tokens of Llama 3.1 8B on 32 H100s at 40% MFU is about 26.6 h
    (the figure the review quoted): the formula, not a re-derivation, gives it."""
    shipped = load_stack_file("llama31-8b-p5")
    training = shipped.training.model_copy(update={"max_steps": 10_000})
    config = shipped.model_copy(update={"training": training})
    estimate = estimate_duration(config, mfu=0.40, startup_hours=0)
    assert estimate.tokens == 10_000 * 256 * 8192
    assert estimate.gpus == 32 and estimate.peak_flops_per_gpu == 989.4e12
    assert estimate.training_hours == pytest.approx(26.64, abs=0.01)
    assert estimate_duration(config).hours == pytest.approx(
        26.64 * 0.40 / ASSUMED_MFU + STARTUP_HOURS, abs=0.02
    )
    assert "32 GPUs at 35% MFU" in estimate_duration(config).summary()


def test_a_bad_mfu_is_refused() -> None:
    config = load_stack_file("dev")
    with pytest.raises(ValueError, match="mfu"):
        estimate_duration(config, mfu=0)
