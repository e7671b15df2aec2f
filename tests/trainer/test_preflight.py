"""The node checks against what the stack planned, on files and variables as a pod has them."""

from __future__ import annotations

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
