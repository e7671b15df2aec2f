"""The checkpoint benchmark on a tiny state, end to end, and its parts (figures are not checked:
timings belong in docs/benchmarks.md, not in tests)."""

from __future__ import annotations

import json

import pytest

from scripts.bench import checkpoint_stall as bench_checkpoint


@pytest.mark.slow
def test_the_benchmark_reports_blocked_overlap_and_durable_for_each_way_and_store(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        # The benchmark points these at its own moto server; setenv records what to restore.
        monkeypatch.setenv(name, "")
    code = bench_checkpoint.main(
        ["--state-gb", "0.01", "--s3-state-gb", "0.01", "--width", "256", "--saves", "2",
         "--steps", "2"]
    )  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    rows = {(row["store"], row["mode"]): row for row in result["checkpoint"]}
    assert set(rows) == {
        (store, mode) for store in ("fs", "s3 (moto)") for mode in bench_checkpoint.MODES
    }
    for row in rows.values():
        assert row["state_gb"] > 0 and row["blocked_first_s"] > 0 and row["blocked_s"] > 0
        assert row["durable_s"] is not None and row["durable_s"] > 0
        assert row["step_s"] > 0 and "overlap_slowdown_pct" in row
    assert result["watchdog_beat_us"] > 0


def test_the_watchdog_beat_cost_is_measured_on_a_real_watchdog() -> None:
    assert bench_checkpoint.watchdog_beat_cost_us(beats=1_000) > 0


def test_an_unknown_flag_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        bench_checkpoint.main(["--state-gbs", "1"])
    assert refused.value.code == 2
    assert "--state-gbs" in capsys.readouterr().err
