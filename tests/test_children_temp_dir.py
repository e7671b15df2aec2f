"""The processes tests start make their temp files in the session's own dir (tests/conftest.py
`children_temp_dir`), which the session removes, not in /tmp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_child_process_makes_its_temp_files_in_the_sessions_dir(
    children_temp_dir: Path,
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(child.stdout.strip()) == children_temp_dir
    assert children_temp_dir.name.startswith("fsdp-eks-tests-")
    # Short enough for multiprocessing's AF_UNIX listener below it (108 bytes on Linux).
    assert len(f"{children_temp_dir}/pymp-xxxxxxxx/listener-xxxxxxxx") < 108
