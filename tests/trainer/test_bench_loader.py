"""`scripts/bench/loader_stall.py`, the loader stall-share benchmark, runs and reports each setting.

The share is a time and is never asserted; tests/trainer/test_data.py counts the tokenizer
calls behind it."""

from __future__ import annotations

import json

import pytest

from scripts.bench import loader_stall as bench_loader


def test_the_loader_benchmark_runs_and_reports_each_map_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--steps", "3", "--documents", "200", "--step_ms", "1", "--seq_len", "256"]
    assert bench_loader.main([*argv, "--map_batch", "1000", "--map_batch", "64"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])["loader_stall_share"]
    assert set(result) == {"step_ms", "num_workers", "1000", "64"}
    assert all(0 <= result[size] < 1 for size in ("1000", "64"))
    assert "map batch    64 documents:" in out
