"""Collectives of one training step, counted by torch's CommDebugMode under torchrun on gloo:
what a GPU step would put on the network, without timing anything."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.trainer.torchrun_util import run_torchrun_script

# Multi-process runs under torchrun: the full tier only (tests/tiers.py).
pytestmark = pytest.mark.slow

ACCUMULATION = 4
NODE = 2
"""Ranks per simulated node: {0, 1} and {2, 3} of the four."""

SCRIPT = """
import json, sys
import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from trainer.distributed import build_mesh, exit_without_finalization, init_distributed
from trainer.models import build_model, hf_config_from, materialize
from trainer.parallelize import ParallelPlan, parallelize_model
from trainer.presets import get_preset

accumulation, node = int(sys.argv[1]), int(sys.argv[2])
info = init_distributed("cpu")
config = hf_config_from(get_preset("tiny"))
ids = torch.randint(0, config.vocab_size, (2, 16))
report = {"layers": config.num_hidden_layers}


def sharded(strategy, **plan):
    model = build_model(config)
    mesh = build_mesh(info, strategy, node if strategy == "hybrid" else 0)
    parallelize_model(model, mesh, ParallelPlan(sharding_strategy=strategy, bf16=False, **plan))
    materialize(model, device=torch.device("cpu"), buffer_device=torch.device("cpu"), seed=0)
    return model


# torch's own count of one fully sharded step (after a warm-up step: lazy init).
model = sharded("full", activation_checkpointing="off", ac_every=1, compile=False,
                cpu_offload=False)
model(input_ids=ids, labels=ids).loss.backward()
comm = CommDebugMode()
with comm:
    model(input_ids=ids, labels=ids).loss.backward()
report["counts"] = {str(op): n for op, n in comm.get_comm_counts().items()}

# Each collective FSDP2 calls, with the nodes its group spans and its argument's bytes.
calls = []

def recorder(name, real):
    def record(*args, **kwargs):
        position = 0 if name == "all_reduce" else 1
        tensor = kwargs["input"] if "input" in kwargs else args[position]
        group = kwargs.get("group") or (args[2] if len(args) > 2 else None)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(4))
        calls.append((name, sorted({r // node for r in ranks}), len(ranks),
                      tensor.numel() * tensor.element_size()))
        return real(*args, **kwargs)
    return record

for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
             "reduce_scatter_tensor", "all_reduce"):
    if hasattr(dist, name):
        setattr(dist, name, recorder(name, getattr(dist, name)))

for strategy in ("full", "hybrid"):
    model = sharded(strategy)

    def step():
        for micro in range(accumulation):
            if strategy == "hybrid":  # as trainer.train: replicas all-reduce once per step
                model.set_requires_all_reduce(micro == accumulation - 1)
            model(input_ids=ids, labels=ids).loss.backward()

    step()  # warm-up: lazy init
    calls.clear()
    step()
    report[strategy] = list(calls)

if dist.get_rank() == 0:
    print("REPORT " + json.dumps(report))
dist.destroy_process_group()
exit_without_finalization(0)  # past the teardown that can abort (trainer.distributed)
"""
"""One launch of four ranks for every test here (each launch is mostly process start)."""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    script = tmp_path_factory.mktemp("collectives") / "count.py"
    script.write_text(SCRIPT)
    done = run_torchrun_script(script, str(ACCUMULATION), str(NODE), nproc=4, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    loaded: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
    return loaded


def test_a_fully_sharded_step_gathers_each_layer_twice_and_the_root_once(
    report: dict[str, Any],
) -> None:
    """Forward gathers the root and every layer; backward gathers every layer again except
    the last (kept from forward) and not the root (FSDP2's root rule, which an explicit
    `reshard_after_forward=True` on the root defeated: 2L + 1 all-gathers instead of 2L)."""
    counts, layers = report["counts"], report["layers"]
    assert counts["c10d._allgather_base_"] == 2 * layers
    # One reduce-scatter of gradients per FSDP unit: every layer and the root.
    assert counts["c10d._reduce_scatter_base_"] == layers + 1


# Per-rank bytes on the wire of a ring collective over n ranks, per byte of its argument:
# all-gather sends n-1 shards, reduce-scatter (n-1)/n of its input, all-reduce twice that.
RING_FACTOR = {
    "all_gather_single": lambda n: n - 1,
    "all_gather_into_tensor": lambda n: n - 1,
    "reduce_scatter_single": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
}


def _cross_node_bytes(calls: list[list]) -> float:
    return sum(RING_FACTOR[name](n) * size for name, nodes, n, size in calls if len(nodes) > 1)


def test_hybrid_sharding_keeps_per_micro_batch_traffic_inside_the_node(
    report: dict[str, Any],
) -> None:
    """Two simulated nodes of two ranks, four micro-batches per step:
    full sharding all-gathers and reduce-scatters across the nodes on every micro-batch;
    HSDP does both within a node and crosses nodes only with one all-reduce of each unit's
    gradient shard per step, so the inter-node bytes drop by more than the accumulation
    factor twice over."""
    full, hybrid = report["full"], report["hybrid"]
    units = report["layers"] + 1  # the tiny preset's decoder layers and the root
    # Full: every all-gather and reduce-scatter spans both nodes, every micro-batch.
    assert all(len(nodes) == 2 for _, nodes, _, _ in full)
    assert sum(name.startswith("reduce_scatter") for name, *_ in full) == ACCUMULATION * units
    # Hybrid: gathers and reduce-scatters stay in a node; across nodes, one all-reduce per
    # unit per step (not per micro-batch).
    across = [call for call in hybrid if len(call[1]) > 1]
    assert {name for name, *_ in across} == {"all_reduce"}
    assert len(across) == units
    assert all(len(nodes) == 1 for name, nodes, _, _ in hybrid if name != "all_reduce")
    ratio = _cross_node_bytes(full) / _cross_node_bytes(hybrid)
    assert ratio > 2 * ACCUMULATION, ratio
