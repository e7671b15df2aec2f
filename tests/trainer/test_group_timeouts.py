"""Every process group of a 2-D mesh times out with the default group, not its backend's
default. On gloo both are 30 minutes, so the script plays NCCL's rule: sub-groups created
without a timeout get `_get_default_timeout(backend)`, 10 minutes for NCCL (torch
`distributed_c10d._new_group_with_tag`)."""

from __future__ import annotations

import pytest

from tests.trainer.torchrun_util import run_torchrun_script

# Multi-process runs under torchrun: the full tier only (tests/tiers.py).
pytestmark = pytest.mark.slow

STRATEGIES = ["hybrid", "no_shard"]

SCRIPT = """
import datetime, sys
import torch
import torch.distributed.distributed_c10d as c10d
from trainer.distributed import DEFAULT_TIMEOUT, build_mesh, init_distributed

c10d._get_default_timeout = lambda backend: datetime.timedelta(minutes=10)  # NCCL's
info = init_distributed("cpu")
for strategy in sys.argv[1:]:
    mesh = build_mesh(info, strategy)
    for dim in mesh.mesh_dim_names:
        timeout = mesh.get_group(dim)._get_backend(torch.device("cpu")).options._timeout
        assert timeout == DEFAULT_TIMEOUT, (strategy, dim, timeout)
    sys.stdout.write(f"timeouts ok {strategy}\\n")  # one write: both ranks share the pipe
    sys.stdout.flush()
c10d.destroy_process_group()
from trainer.distributed import exit_without_finalization
exit_without_finalization(0)  # past the teardown that can abort (trainer.distributed)
"""
"""Every strategy's mesh in one launch (a launch is mostly process start)."""


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    script = tmp_path_factory.mktemp("mesh") / "mesh.py"
    script.write_text(SCRIPT)
    done = run_torchrun_script(script, *STRATEGIES)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mesh_subgroups_time_out_with_the_default_group(output: str, strategy: str) -> None:
    assert output.splitlines().count(f"timeouts ok {strategy}") == 2  # on both ranks
