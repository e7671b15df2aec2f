"""The optimizer benchmark times both AdamW implementations over the trainer's own shards."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from scripts.bench import optimizer_step


def test_it_times_the_loop_and_the_fused_kernel_and_leaves_the_process_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the benchmark's 1, so that a setting left behind shows
    try:
        assert optimizer_step.main(["--steps", "2", "--num_layers", "1"]) == 0
        assert torch.get_num_threads() == 2  # the worker's later tests keep theirs
    finally:
        torch.set_num_threads(threads)
    assert not dist.is_initialized()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[:2]] == ["loop", "fused"]
    figures = json.loads(lines[-1])
    assert figures["model"] == "tiny" and figures["steps"] == 2
    assert {name: len(runs) for name, runs in figures["ms_per_step"].items()} == {
        "loop": 2,
        "fused": 2,
    }
    assert all(ms > 0 for runs in figures["ms_per_step"].values() for ms in runs)
