"""Collectives of one training step, counted by torch's CommDebugMode under torchrun on gloo:
what a GPU step would put on the network, without timing anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trainer.torchrun_util import free_port

SCRIPT = """
import json
import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from trainer.distributed import build_mesh, exit_without_finalization, init_distributed
from trainer.models import build_model, hf_config_from, materialize
from trainer.parallelize import ParallelPlan, parallelize_model
from trainer.presets import get_preset

info = init_distributed("cpu")
config = hf_config_from(get_preset("tiny"))
model = build_model(config)
plan = ParallelPlan(
    sharding_strategy="full", bf16=False, activation_checkpointing=False, ac_mode="full",
    ac_every=1, compile=False, cpu_offload=False,
)
parallelize_model(model, build_mesh(info, "full"), plan)
materialize(model, device=torch.device("cpu"), buffer_device=torch.device("cpu"), seed=0)
ids = torch.randint(0, config.vocab_size, (2, 16))
model(input_ids=ids, labels=ids).loss.backward()  # warm-up: lazy init
comm = CommDebugMode()
with comm:
    model(input_ids=ids, labels=ids).loss.backward()
counts = {str(op): n for op, n in comm.get_comm_counts().items()}
if dist.get_rank() == 0:
    print("COUNTS " + json.dumps({"layers": config.num_hidden_layers, **counts}))
dist.destroy_process_group()
exit_without_finalization(0)  # past the teardown that can abort (trainer.distributed)
"""


def test_a_fully_sharded_step_gathers_each_layer_twice_and_the_root_once(
    tmp_path: Path,
) -> None:
    """Forward gathers the root and every layer; backward gathers every layer again except
    the last (kept from forward) and not the root (FSDP2's root rule, which an explicit
    `reshard_after_forward=True` on the root defeated: 2L + 1 all-gathers instead of 2L)."""
    script = tmp_path / "count.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", f"--master_port={free_port()}", str(script),
        ],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("COUNTS ")]
    counts = json.loads(line.removeprefix("COUNTS "))
    layers = counts["layers"]
    assert counts["c10d._allgather_base_"] == 2 * layers
    # One reduce-scatter of gradients per FSDP unit: every layer and the root.
    assert counts["c10d._reduce_scatter_base_"] == layers + 1
