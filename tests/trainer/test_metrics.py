"""FLOPs per token, MFU, the log line and the metric sinks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from trainer.metrics import (
    JsonlSink,
    MultiSink,
    StepTimer,
    TensorBoardSink,
    ThroughputModel,
    build_sinks,
    flops_per_token,
    format_duration,
    matmul_params_per_token,
    peak_flops,
)
from trainer.models import count_parameters, hf_config_from
from trainer.presets import PRESETS


def test_flops_per_token_is_6n_plus_attention_for_llama31_8b() -> None:
    config = hf_config_from(PRESETS["llama3.1-8b"])
    embedding = config.vocab_size * config.hidden_size
    # Untied: every parameter but the input embedding is a matmul weight.
    matmul = count_parameters(config) - embedding - (2 * 32 + 1) * 4096  # minus norm gains
    assert matmul_params_per_token(config) == matmul
    attention = 12 * 32 * 32 * 128 * 8192
    assert flops_per_token(config, 8192) == 6 * matmul + attention
    # ~57.9 GFLOPs per token at 8k context.
    assert flops_per_token(config, 8192) / 1e9 == pytest.approx(57.9, abs=0.1)


def test_tied_lm_head_still_costs_its_matmul() -> None:
    config = hf_config_from(PRESETS["llama3.2-1b"])
    norms = (2 * 16 + 1) * 2048
    # Tied: the one shared matrix is counted once in the parameters but used as the LM head.
    assert matmul_params_per_token(config) == count_parameters(config) - norms


def test_mixtral_counts_only_the_active_experts() -> None:
    # Mistral AI: 46.7B total, 12.9B used per token (the input embedding is a lookup).
    config = hf_config_from(PRESETS["mixtral-8x7b"])
    embedding = config.vocab_size * config.hidden_size
    assert (matmul_params_per_token(config) + embedding) / 1e9 == pytest.approx(12.9, abs=0.05)


def test_peak_flops_by_gpu_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peak_flops(torch.device("cpu")) is None
    cuda = torch.device("cuda", 0)
    for name, expected in [
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756.0e12),
        ("NVIDIA A100-SXM4-40GB", 312.0e12),
        ("NVIDIA A10G", 70.0e12),  # g5: not the A10's 125
        ("NVIDIA A10", 125.0e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA L40", 181.05e12),
        ("NVIDIA L4", 121.0e12),
        ("NVIDIA B200", 2.25e15),
        ("Some Future GPU", None),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d, n=name: n)
        assert peak_flops(cuda) == expected, name


def test_record_rates_mfu_and_the_seed_log_prefix() -> None:
    model = ThroughputModel(
        samples_per_step=16,
        seq_len=4096,
        world_size=8,
        flops_per_token=10**9,
        peak_flops_per_device=1e15,
    )
    record = model.record(
        step=120,
        loss=2.5,
        lr=3e-4,
        grad_norm=0.75,
        elapsed_s=20.0,
        steps=10,
        peak_mem_gib=50.0,
        eta_s=3725,
    )
    assert record.step_time_s == 2.0
    assert record.samples_per_sec == 8.0
    assert record.tokens_per_sec == 8.0 * 4096
    assert record.tokens_per_sec_per_gpu == 4096.0
    assert record.mfu == pytest.approx(4096 * 1e9 / 1e15)
    line = record.log_line()
    assert re.match(r"^Batch 120 Loss: 2\.50000, Speed: 8\.00 samples/sec, lr: 0\.0003, ", line)
    assert re.match(r".*Loss:.*", line)  # what the seed's log monitors match
    for part in ["tokens/s: 32,768 (4,096/gpu)", "MFU: 0.4%", "step: 2.000s", "ETA: 1:02:05"]:
        assert part in line
    assert record.to_json()["tokens_per_sec_per_gpu"] == 4096.0
    no_peak = ThroughputModel(16, 4096, 8, 10**9, None).record(
        step=1,
        loss=1.0,
        lr=1.0,
        grad_norm=1.0,
        elapsed_s=1.0,
        steps=1,
        peak_mem_gib=0.0,
        eta_s=0.0,
    )
    assert no_peak.mfu is None and "MFU: n/a" in no_peak.log_line()


def test_step_timer_eta_skips_the_warm_up_interval() -> None:
    ticks = iter([0.0, 100.0, 110.0, 120.0])
    timer = StepTimer(start_step=0, max_steps=100, clock=lambda: next(ticks))
    assert timer.lap(10) == (100.0, 10)  # includes start-up: not used for the ETA
    assert timer.eta_seconds(10, fallback_step_time=10.0) == 900.0
    timer.lap(20)
    timer.lap(30)
    assert timer.eta_seconds(30, fallback_step_time=99.0) == pytest.approx(70.0)


def test_format_duration() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(float("inf")) == "?"


def test_jsonl_sink_appends_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.jsonl"
    for step in (1, 2):
        sink = JsonlSink(path)
        sink.write({"kind": "train", "step": step, "loss": 1.0 / step})
        sink.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("time" in r for r in records)


def test_tensorboard_sink_writes_scalars(tmp_path: Path) -> None:
    sink = MultiSink([TensorBoardSink(tmp_path / "tb")])
    sink.write({"kind": "train", "step": 3, "loss": 1.5, "mfu": None, "batch_digests": ["a"]})
    sink.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    sink = build_sinks(is_main=False, metrics_file=tmp_path / "m.jsonl", tensorboard_dir=None)
    sink.write({"kind": "train", "step": 1})
    sink.close()
    assert not (tmp_path / "m.jsonl").exists()


def test_rank_zero_logs_info_and_other_ranks_only_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from trainer.log import get_logger, setup_logging

    setup_logging(0)
    get_logger("train").info("Batch 1 Loss: 2.0")
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d I \[test_metrics.py:\d+\] Batch 1 Loss: 2\.0$",
        capsys.readouterr().err.strip(),
    )
    setup_logging(3)
    get_logger("train").info("hidden")
    get_logger("train").warning("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and "[rank3] " in err and "shown" in err
    setup_logging(0, level=logging.INFO)
