"""Entry point the Pulumi CLI runs for `pulumi preview --policy-pack infra/policy`."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Run as a script, this folder is first on sys.path and its modules would shadow top-level
# ones; the repository root makes `infra` importable even without the editable install.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from infra.policy.pack import serve  # noqa: E402

serve()
