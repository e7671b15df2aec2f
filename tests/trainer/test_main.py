"""`python -m trainer` turns a bad data flag into one error line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.trainer.torchrun_util import tiny_args
from trainer.tiny_assets import TinyAssets


def test_missing_dataset_is_one_line_naming_the_flag(
    tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-corpus"
    argv = tiny_args(tiny_assets, dataset=str(missing), max_steps=1, warmup=1)
    result = subprocess.run(
        [sys.executable, "-m", "trainer", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
             "HF_DATASETS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"},
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1, result.stderr
    assert "--dataset" in errors[0] and str(missing) in errors[0]
    assert "Traceback" not in result.stderr
