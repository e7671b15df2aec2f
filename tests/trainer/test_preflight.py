"""The node checks against what the stack planned, on files and variables as a pod has them."""

from __future__ import annotations

import re
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer import preflight
from trainer.preflight import Expectations


@pytest.fixture
def efa_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/dev/infiniband as the EFA device plugin mounts it: one uverbs device per interface."""
    devices = tmp_path / "infiniband"
    devices.mkdir()
    for index in range(4):
        (devices / f"uverbs{index}").touch()
    monkeypatch.setattr(preflight, "EFA_DEVICE_DIR", devices)
    monkeypatch.setenv("FI_PROVIDER", "efa")
    monkeypatch.setenv("NCCL_NET", "AWS Libfabric")
    return devices


def test_a_node_with_its_efa_devices_and_the_plugin_forced_passes(efa_node: Path) -> None:
    assert preflight._check_efa(Expectations(efa_devices=4)) is None


def test_missing_efa_devices_are_named(efa_node: Path) -> None:
    (efa_node / "uverbs3").unlink()
    problem = preflight._check_efa(Expectations(efa_devices=4))
    assert problem == "3 EFA device(s) in /dev/infiniband, expected 4"


def test_nccl_left_free_to_fall_back_to_sockets_fails(
    efa_node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NCCL_NET")
    problem = preflight._check_efa(Expectations(efa_devices=4))
    assert problem is not None and "may fall back to TCP sockets" in problem
    monkeypatch.setenv("NCCL_NET", "ofi")  # the plugin's other name, any case
    assert preflight._check_efa(Expectations(efa_devices=4)) is None


def test_no_efa_expected_checks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "EFA_DEVICE_DIR", Path("/nonexistent"))
    assert preflight._check_efa(Expectations()) is None


def test_gpus_expected_but_none_there_fails() -> None:
    cpu = torch.device("cpu")
    assert preflight._check_gpus(Expectations(gpu_model="H100"), cpu, 8) == (
        "expected H100 GPUs, got none"
    )
    assert preflight._check_gpus(Expectations(), cpu, 1) is None


def _capabilities(tmp_path: Path, effective: int) -> Path:
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nCapEff:\t{effective:016x}\n")
    return status


@pytest.fixture
def memlock_8mib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as the trainer's container on a node whose base runtime spec does not
    raise the limit: soft RLIMIT_MEMLOCK at the kernel's default of 8 MiB (include/uapi/linux/
    resource.h MLOCK_LIMIT), inherited from containerd, and no capability (the container drops
    them all). Lowering one's own soft limit needs no privilege."""
    monkeypatch.setattr(preflight, "PROC_STATUS", _capabilities(tmp_path, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (min(8 << 20, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))


def test_a_memlock_limit_below_the_nodes_memory_fails_on_an_efa_node(
    efa_node: Path, memlock_8mib: None, gloo_world_of_one: None
) -> None:
    """One line naming the check and the fix, before anything is built."""
    with pytest.raises(preflight.PreflightError) as failed:
        preflight.run_preflight(
            Expectations(efa_devices=4), device=torch.device("cpu"), local_world_size=1,
            mode="enforce",
        )  # fmt: skip
    line = str(failed.value)
    assert "\n" not in line
    assert re.search(r"rank 0: memlock: RLIMIT_MEMLOCK is 8 MiB, below the node's \d+ GiB", line)
    assert "baseRuntimeSpec" in line and "infra/platform/gpu_nodes.py" in line


def test_memlock_is_not_checked_without_efa(memlock_8mib: None) -> None:
    assert preflight._check_memlock(Expectations(efa_devices=0)) is None


@pytest.mark.parametrize("limit", [resource.RLIM_INFINITY, 10**18])
def test_an_unlimited_or_above_memory_limit_passes(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLIM_INFINITY, or the GPU nodes' 10**18 bytes (which `ulimit -l` shows as a number)."""
    monkeypatch.setattr(preflight.resource, "getrlimit", lambda _which: (limit, limit))
    assert preflight._check_memlock(Expectations(efa_devices=4)) is None


def test_cap_ipc_lock_bypasses_the_limit(
    memlock_8mib: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`!capable(CAP_IPC_LOCK)` in ib_umem_get: a process holding it (bit 14 of CapEff) may
    pin past the limit."""
    problem = preflight._check_memlock(Expectations(efa_devices=4))
    assert problem is not None and problem.startswith("RLIMIT_MEMLOCK is 8 MiB")
    monkeypatch.setattr(preflight, "PROC_STATUS", _capabilities(tmp_path, 1 << 14))
    assert preflight._check_memlock(Expectations(efa_devices=4)) is None
