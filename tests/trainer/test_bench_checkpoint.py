"""The checkpoint-stall benchmark runs end to end on a tiny model (figures are not checked:
timings belong in docs/benchmarks.md, not in tests)."""

from __future__ import annotations

import json

import pytest

from scripts.bench import checkpoint_stall as bench_checkpoint


def test_the_benchmark_measures_both_modes_on_both_stores(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        # The benchmark points these at its own moto server; setenv records what to restore.
        monkeypatch.setenv(name, "")
    code = bench_checkpoint.main(
        ["--params-millions", "1", "--s3-params-millions", "1", "--saves", "1", "--steps", "1"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    rows = {(row["store"], row["mode"]) for row in result["checkpoint"]}
    assert rows == {("fs", "sync"), ("fs", "async"), ("s3 (moto)", "sync"), ("s3 (moto)", "async")}
    assert all(row["stall_s"] > 0 and row["state_gb"] > 0 for row in result["checkpoint"])
    assert result["watchdog_beat_us"] > 0
