"""The command line: seed flags with their meanings, switches, and clear errors."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

import trainer.config
from trainer.config import build_parser, flag_names, format_args, parse_args, parse_switch

# Every flag of the seed trainer that the issue lists, with a value of the right kind.
SEED_ARGS = [
    "--train_batch_size", "3",
    "--val_batch_size", "5",
    "--max_steps", "77",
    "--max_context_width", "4096",
    "--hidden_width", "2048",
    "--num_layers", "16",
    "--num_heads", "32",
    "--num_key_value_heads", "8",
    "--intermediate_size", "8192",
    "--vocab_size", "128256",
    "--model_type", "llama_v3",
    "--sharding_strategy", "hybrid",
    "--bf16", "0",
    "--activation_checkpointing", "false",
    "--cpu_offload", "true",
    "--lr", "3e-4",
    "--min_lr", "3e-5",
    "--warmup", "0.1",
    "--lr_decay_style", "linear",
    "--weight_decay", "0.1",
    "--beta1", "0.8",
    "--beta2", "0.99",
    "--grad_clip", "0.5",
    "--dataset", "allenai/c4",
    "--dataset_config_name", "en",
    "--tokenizer", "some/tokenizer",
    "--checkpoint_dir", "/ckpt",
    "--resume_from_checkpoint", "/ckpt",
    "--checkpoint_freq", "50",
    "--validation_freq", "20",
    "--validation_batches", "4",
    "--logging_freq", "10",
    "--seed", "7",
]  # fmt: skip


def test_seed_flags_keep_their_meanings() -> None:
    cfg = parse_args(SEED_ARGS)
    assert cfg.data.train_batch_size == 3
    assert cfg.data.val_batch_size == 5
    assert cfg.optim.max_steps == 77
    assert cfg.model.max_context_width == 4096
    shape = cfg.model.shape()
    assert (shape.hidden_size, shape.num_layers, shape.num_heads) == (2048, 16, 32)
    assert (shape.num_key_value_heads, shape.intermediate_size, shape.vocab_size) == (
        8,
        8192,
        128256,
    )
    assert shape.model_type == "llama"
    assert cfg.parallel.sharding_strategy == "hybrid"
    assert cfg.parallel.bf16 is False
    assert cfg.parallel.activation_checkpointing == "off"  # the sample's 0/false spelling
    assert cfg.parallel.cpu_offload is True
    assert (cfg.optim.lr, cfg.optim.min_lr) == (3e-4, 3e-5)
    # The seed's --warmup is a fraction of the run.
    assert cfg.optim.warmup_steps == 7
    assert cfg.optim.lr_decay_style == "linear"
    assert (cfg.optim.weight_decay, cfg.optim.beta1, cfg.optim.beta2) == (0.1, 0.8, 0.99)
    assert cfg.optim.grad_clip == 0.5
    assert (cfg.data.dataset, cfg.data.dataset_config_name) == ("allenai/c4", "en")
    assert cfg.data.tokenizer == cfg.tokenizer_name == "some/tokenizer"
    assert cfg.checkpoint.checkpoint_dir == cfg.checkpoint.resume_from_checkpoint == "/ckpt"
    assert cfg.checkpoint.checkpoint_freq == 50
    assert (cfg.logging.validation_freq, cfg.logging.validation_batches) == (20, 4)
    assert cfg.logging.logging_freq == 10
    assert cfg.optim.seed == 7


def test_defaults_follow_the_seed() -> None:
    cfg = parse_args([])
    assert cfg.model.preset_name == "llama3.1-8b"
    assert cfg.parallel.bf16 and cfg.parallel.activation_checkpointing == "full"
    assert cfg.parallel.sharding_strategy == "full"
    assert cfg.optim.lr_decay_style == "cosine"
    assert cfg.model.max_context_width == 2048
    assert cfg.tokenizer_name == "hf-internal-testing/llama-tokenizer"
    assert parse_args(["--init_from", "/models/x"]).tokenizer_name == "/models/x"


def test_preset_with_overrides() -> None:
    cfg = parse_args(["--model", "llama3.2-1b", "--num_layers", "2", "--vocab_size", "512"])
    shape = cfg.model.shape()
    assert shape.num_layers == 2 and shape.vocab_size == 512
    assert shape.hidden_size == 2048 and shape.tie_word_embeddings
    assert shape.rope_scaling is not None and shape.rope_scaling["factor"] == 32.0


def test_model_type_picks_the_family_preset() -> None:
    assert parse_args(["--model_type", "llama_v2"]).model.shape().vocab_size == 32000
    assert parse_args(["--model_type", "mixtral"]).model.shape().num_local_experts == 8
    moe_to_dense = parse_args(["--model", "tiny-moe", "--model_type", "llama"]).model.shape()
    assert moe_to_dense.num_local_experts == 0


def test_long_context_extends_positions() -> None:
    cfg = parse_args(["--model", "llama2-7b", "--max_context_width", "8192"])
    assert cfg.model.shape().max_position_embeddings == 8192


@pytest.mark.parametrize("text", ["1", "true", "True", "YES", "on"])
def test_switch_true(text: str) -> None:
    assert parse_switch(text) is True


@pytest.mark.parametrize("text", ["0", "false", "FALSE", "no", "off"])
def test_switch_false(text: str) -> None:
    assert parse_switch(text) is False


def test_bare_switch_means_true() -> None:
    assert parse_args(["--compile"]).parallel.compile is True
    assert parse_args(["--compile", "0"]).parallel.compile is False


def test_warmup_as_steps() -> None:
    assert parse_args(["--max_steps", "100", "--warmup", "10"]).optim.warmup_steps == 10
    assert parse_args(["--max_steps", "100", "--warmup", "0"]).optim.warmup_steps == 0


def test_aliases() -> None:
    argv = ["--max_training_steps", "9", "--dataset_path", "/d", "--grad_accum_steps", "2"]
    cfg = parse_args(argv)
    assert (cfg.optim.max_steps, cfg.data.dataset, cfg.optim.gradient_accumulation_steps) == (
        9,
        "/d",
        2,
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--not_a_flag", "1"], "unrecognized arguments: --not_a_flag"),
        (["--max_step", "5"], "unrecognized arguments: --max_step"),  # no abbreviations
        (["--max_steps", "ten"], "--max_steps"),
        (["--max_steps", "0"], "--max_steps must be > 0"),
        (["--bf16", "maybe"], "--bf16"),
        (["--sharding_strategy", "zero3"], "--sharding_strategy"),
        (["--model", "llama9"], "--model 'llama9' is not a preset"),
        (["--model_type", "gpt2"], "--model_type 'gpt2' is not supported"),
        (["--min_lr", "1", "--lr", "0.1"], "--min_lr"),
        (["--warmup", "2.5"], "--warmup"),
        # Once written in the stack schema too (issue 29 item 1): the trainer's rules only.
        (["--max_steps", "10", "--warmup", "20"], "--warmup 20 steps exceeds --max_steps 10"),
        (["--fp8_recipe", "tensorwise"], "--fp8_recipe tensorwise applies only to --precision"),
        (["--num_layers", "0"], "--num_layers must be > 0"),
        (["--num_local_experts", "-1"], "--num_local_experts must be >= 0"),
        (["--model", "tiny", "--num_heads", "3"], "hidden_size=128"),
        (["--hsdp_shard_size", "2"], "--hsdp_shard_size applies only"),
        (["--activation_checkpointing", "some"], "--activation_checkpointing"),
        (["--ac_mode", "op"], "unrecognized arguments: --ac_mode"),
    ],
)
def test_bad_flags_exit_with_a_message_naming_them(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_every_flag_has_help_and_a_default() -> None:
    parser = build_parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and "(default:" in action.help, action.dest


def test_format_args_round_trips_through_the_parser() -> None:
    values = {"model": "tiny", "bf16": False, "max_steps": 12, "lr": 0.001, "export_dir": None}
    argv = format_args(values)
    assert argv == ["--model", "tiny", "--bf16", "0", "--max_steps", "12", "--lr", "0.001"]
    cfg = parse_args(argv)
    assert (cfg.model.model, cfg.parallel.bf16, cfg.optim.max_steps) == ("tiny", False, 12)
    assert "max_steps" in flag_names()
    with pytest.raises(ValueError, match="max_stepz"):
        format_args({"max_stepz": 1})


def test_entry_point_rejects_a_bad_flag_before_loading_torch() -> None:
    """`python -m trainer` answers a typo at once, with the flag named, exit status 2."""
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "trainer", "--model", "tiny", "--max_stepz", "5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 2
    assert "unrecognized arguments: --max_stepz 5" in completed.stderr


def test_empty_dataset_config_name_means_none() -> None:
    # The stack renders `datasetConfigName: null` as an empty value; `datasets` needs None.
    assert parse_args(["--dataset_config_name", ""]).data.dataset_config_name is None
    assert parse_args([]).data.dataset_config_name == "en"


def test_every_run_gets_the_allocator_settings_unless_the_user_set_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Job, benchmark and bare-metal runs alike: the trainer sets them, not only the pod."""
    from trainer.distributed import ALLOCATOR_SETTINGS, configure_cuda_allocator

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    configure_cuda_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ALLOCATOR_SETTINGS
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    configure_cuda_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_the_flag_table_is_built_once_per_set_of_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every config's checks read the table; resolving its annotations each time was 20 s of
    the infra tests. A section swapped in (a new flag, tests/infra/test_flag_table.py) is a
    new table."""
    resolved: list[type] = []
    real_hints = trainer.config.get_type_hints

    def counting_hints(section: type) -> dict[str, Any]:
        resolved.append(section)
        return real_hints(section)

    monkeypatch.setattr(trainer.config, "get_type_hints", counting_hints)
    trainer.config._flag_table.cache_clear()
    first = trainer.config.flag_table()
    assert len(resolved) == len(trainer.config._SECTION_TYPES)
    assert trainer.config.flag_table() == first
    trainer.config.ModelConfig()  # its checks read the table
    assert len(resolved) == len(trainer.config._SECTION_TYPES)

    @dataclasses.dataclass
    class OptimConfig(trainer.config.OptimConfig):
        ema_decay: float | None = trainer.config._flag(None, "Decay of a weight average.")

    monkeypatch.setitem(trainer.config._SECTION_TYPES, "optim", OptimConfig)
    assert "ema_decay" in {row.name for row in trainer.config.flag_table()}
    assert len(resolved) == 2 * len(trainer.config._SECTION_TYPES)
