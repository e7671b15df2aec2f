"""Importing the trainer prints nothing: torchao's optional-kernel and torch's pytree notices
are filtered (trainer/__init__.py), so a worker's log starts with the trainer's own lines."""

from __future__ import annotations

import subprocess
import sys

from tests.trainer.torchrun_util import REPO_ROOT


def test_importing_the_trainer_is_silent() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import trainer.train, trainer.float8, torchao.float8"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "" and done.stderr == "", done.stderr[-2000:]
