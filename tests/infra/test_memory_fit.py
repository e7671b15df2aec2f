"""The plan's memory check: a run that cannot fit its GPUs is refused before it costs anything.

The estimator's coefficients are checked against torch's own FSDP2 memory tracer in
`tests/trainer/test_memory_tracer.py`; here: the shipped stacks fit, a run that cannot fit is
one message with the estimate, the GPU's memory and the keys that would help, a run near the
limit is a warning, and the arithmetic follows what the trainer does (sharding, padding,
checkpointing, offload).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.config import StackConfigError, load_stack_file
from infra.config.parse import validate_stack_config
from infra.estimates.memory_fit import (
    GIB,
    NEAR_LIMIT,
    RunShape,
    estimate,
    host_remedies,
    host_state_bytes,
    memory_fit,
    memory_problems,
    memory_warnings,
    parallelism,
    remedies,
    shard_size,
)
from infra.estimates.run_plan import plan_run
from infra.job.flags import trainer_flags
from infra.job.stack_checks import checked_run_plan
from trainer.presets import approx_num_parameters, get_preset

STACKS = sorted((Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml"))

FAST_FSX = {"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}}
"""The stack's own file system, sized so that a checkpoint is no deadline's business."""

ONE_A10G: dict[str, Any] = {
    "gpuNodes": {"instanceType": "g5.xlarge", "count": 1},
    "job": {"maxRunHours": 2},
    # One step, saved at its end on purpose (no checkpoint-cadence warning).
    "training": {"maxSteps": 1, "checkpointEvery": 0},
    "cost": {"maxUsdPerRun": None},
}


def parse(**sections: Any) -> Any:
    """ONE_A10G with `sections` replacing its own, except that `training` keys are added.
    Saves are blocking, so that /dev/shm's staging room (tests/infra/test_staging_fit.py)
    never joins the GPU-memory problems these tests are about."""
    training = {**ONE_A10G["training"], **sections.pop("training", {})}
    training["extraArgs"] = {"async_checkpoint": 0, **training.get("extraArgs", {})}
    values = {**ONE_A10G, **sections, "training": training}
    return checked_run_plan(values, stack_name="memory").config


def refusal(**sections: Any) -> list[str]:
    with pytest.raises(StackConfigError) as raised:
        parse(**sections)
    return raised.value.problems


@pytest.mark.parametrize("path", STACKS, ids=lambda path: path.stem.removeprefix("Pulumi."))
def test_every_shipped_stack_fits_its_gpus(path: Path) -> None:
    fit = memory_fit(load_stack_file(path))
    assert fit.fits, fit.summary()
    assert fit.per_gpu_bytes == sum(fit.breakdown.values())
    assert fit.gpu_bytes == load_stack_file(path).instance.gpu_memory_gib * GIB


def test_a_70b_model_on_one_a10g_is_refused_with_the_estimate_and_the_options() -> None:
    # A deadline long enough for its checkpoints: the memory problem alone.
    problems = refusal(model={"preset": "llama3.1-70b"}, job={"maxRunHours": 8})
    assert len(problems) == 1
    message = problems[0]
    assert message.startswith("the run needs ~1170.9 GiB per GPU but gpuNodes.instanceType ")
    assert "'g5.xlarge' has 24 GiB" in message
    # More GPUs alone cannot fit two 2048-token sequences' activations: offered with a lean
    # batch.
    assert "gpuNodes.count: 161 with training.microBatchSize: 1 ->" in message
    assert "a GPU with more memory (gpuNodes.instanceType)" in message
    # CPU offload is not offered: 70B x 16 bytes is far beyond a g5.xlarge's 16 GiB.
    assert "cpuOffload" not in message


def test_a_hybrid_run_that_cannot_fit_names_full_sharding_checkpointing_and_the_batch() -> None:
    problems = refusal(
        gpuNodes={"instanceType": "p4d.24xlarge", "count": 2},
        storage=FAST_FSX,
        model={"preset": "llama3.1-70b"},
        training={"shardingStrategy": "hybrid", "activationCheckpointing": False},
    )
    (message,) = problems
    assert "has 40 GiB" in message
    for option in (
        "training.shardingStrategy: full (shards over all 16 GPUs) -> ~",
        "training.activationCheckpointing: full (every layer) -> ~",
        "training.microBatchSize: 1 (instead of 2) -> ~",
    ):
        assert option in message


def test_cpu_offload_is_offered_when_the_node_can_hold_the_state() -> None:
    # llama3.2-1b's 1.2B parameters x 16 bytes = 18.4 GiB on one A10G, plus 4 x 2048-token
    # logits (Hugging Face's loss over all of them); a g5.8xlarge has 128 GiB of memory for
    # the offloaded state.
    problems = refusal(
        gpuNodes={"instanceType": "g5.8xlarge", "count": 1},
        model={"preset": "llama3.2-1b"},
        training={"microBatchSize": 4, "extraArgs": {"loss_chunk_tokens": 0}},
    )
    (message,) = problems
    assert "training.cpuOffload: true (parameters, gradients and AdamW states in host" in message
    assert "training.microBatchSize: 1 (instead of 4) -> ~" in message


def test_cpu_offload_beyond_the_nodes_memory_is_refused() -> None:
    problems = refusal(model={"preset": "llama3.1-70b"}, training={"cpuOffload": True})
    assert any(
        problem.startswith("training.cpuOffload: true puts ~1051 GiB of parameters")
        and "which has 16 GiB" in problem
        for problem in problems
    )


def test_a_run_near_the_limit_is_a_warning_not_a_refusal() -> None:
    # 12 of llama3.2-1b's 16 layers, two 2048-token sequences, on one A10G, with Hugging
    # Face's loss over the whole logits tensor.
    config = parse(
        model={"preset": "llama3.2-1b", "numLayers": 12},
        training={"extraArgs": {"loss_chunk_tokens": 0}},
    )
    fit = memory_fit(config)
    assert fit.fits and fit.share > NEAR_LIMIT, fit.summary()
    (warning,) = plan_run(config).warnings
    assert warning.startswith("memory: the run is estimated at ~22.3 GiB of 24 GiB per GPU (93%")
    assert "training.activationCheckpointing" in warning


def test_the_chunked_loss_is_what_gives_that_run_room() -> None:
    chunked = memory_fit(parse(model={"preset": "llama3.2-1b", "numLayers": 12}))
    assert chunked.fits and chunked.share < NEAR_LIMIT, chunked.summary()


def test_a_run_with_room_has_no_warning() -> None:
    config = parse(model={"preset": "llama3.2-1b", "numLayers": 2})
    assert memory_warnings(config) == []


def run(preset: str = "llama3.1-8b", **changes: Any) -> RunShape:
    fields: dict[str, Any] = {
        "shape": get_preset(preset),
        "micro_batch_size": 1,
        "context_width": 2048,
        "shard_size": 8,
        "reshard_after_forward": True,
        "checkpointed_layers": 0,
        **changes,
    }
    return RunShape(**fields)


def test_sharded_state_is_sixteen_bytes_per_parameter_over_the_shard_group() -> None:
    """fp32 parameters (built fp32: trainer.models.build_model) and AdamW's two fp32 moments
    (torch/optim/adamw.py `_init_group`: zeros_like the parameter) per sharded element."""
    params = approx_num_parameters(get_preset("llama3.1-8b"))
    terms = estimate(run(shard_size=8))
    assert terms["parameters (fp32 shards)"] == params * 4 // 8
    assert terms["AdamW states (fp32)"] == 2 * terms["parameters (fp32 shards)"]


def test_fsdp2_padding_of_eight_experts_is_avoided_by_sharding_dim_1() -> None:
    """trainer.parallelize.shard_placement shards Mixtral's [8, ...] experts on dim 1 when the
    group has more ranks than experts; without it each rank would hold 1/8 of the experts."""
    mixtral = approx_num_parameters(get_preset("mixtral-8x7b"))
    sharded = estimate(run("mixtral-8x7b", shard_size=64))["parameters (fp32 shards)"]
    assert sharded == pytest.approx(mixtral * 4 / 64, rel=0.001)


def test_checkpointing_keeps_only_each_layers_input() -> None:
    shape = get_preset("llama3.1-8b")
    long: dict[str, Any] = {"micro_batch_size": 2, "context_width": 8192}  # activations peak
    full = estimate(run(checkpointed_layers=shape.num_layers, **long))["activations"]
    none = estimate(run(checkpointed_layers=0, **long))["activations"]
    assert full < none / 10
    half = estimate(run(checkpointed_layers=shape.num_layers // 2, **long))["activations"]
    assert full < half < none


def test_the_checkpointing_mode_is_the_stack_key_not_an_extra_flag() -> None:
    """`--activation_checkpointing` is rendered from training.activationCheckpointing
    (infra.job.flags): one field, stack key and trainer flag, so extraArgs may not set it."""
    message = r"training.extraArgs.activation_checkpointing is set from its own"
    with pytest.raises(StackConfigError, match=message):
        parse(
            model={"preset": "llama3.2-1b", "numLayers": 5},
            training={"extraArgs": {"activation_checkpointing": "selective", "ac_every": 2}},
        )


def test_cpu_offload_leaves_no_sharded_state_on_the_gpu() -> None:
    terms = estimate(run(cpu_offload=True, shard_size=1))
    assert terms["parameters (fp32 shards)"] == 0
    assert terms["AdamW states (fp32)"] == 0


def test_host_state_is_every_local_gpus_offloaded_share() -> None:
    config = parse(model={"preset": "llama3.2-1b"}, training={"microBatchSize": 1})
    params = approx_num_parameters(config.model_shape())
    assert host_state_bytes(config) == pytest.approx(16 * params, rel=0.001)


FOUR_A10G = {"instanceType": "g5.12xlarge", "count": 1}


@pytest.mark.parametrize(("micro_batch", "mode"), [(4, "op"), (8, "full")])
def test_auto_checkpointing_is_op_level_until_only_full_fits(micro_batch: int, mode: str) -> None:
    """op keeps more than full: at 8 x 4096 tokens on an A10G only full leaves room."""
    config = parse(
        gpuNodes=FOUR_A10G,
        model={"preset": "llama3.2-1b"},
        training={"microBatchSize": micro_batch, "contextWidth": 4096},
    )
    chosen = parallelism(config)
    assert (chosen.sharding_strategy, chosen.activation_checkpointing) == ("full", mode)
    assert chosen.reason.startswith("auto: fits in")
    assert memory_fit(config).share <= NEAR_LIMIT
    assert trainer_flags(plan_run(config))["activation_checkpointing"] == mode


def test_across_nodes_auto_shards_within_a_node_when_a_node_holds_the_state() -> None:
    shipped = load_stack_file("llama31-8b-p5")
    assert shipped.training.sharding_strategy == "auto"
    chosen = parallelism(shipped)
    assert (chosen.sharding_strategy, chosen.activation_checkpointing) == ("hybrid", "op")
    assert shard_size(shipped) == 8  # one p5's GPUs; replicated over the 4 nodes
    assert trainer_flags(plan_run(shipped))["sharding_strategy"] == "hybrid"


def test_a_model_one_node_cannot_hold_is_fully_sharded_across_nodes() -> None:
    config = parse(
        gpuNodes={"instanceType": "p4d.24xlarge", "count": 8},
        storage=FAST_FSX,
        model={"preset": "llama3.1-70b"},
        training={"microBatchSize": 1, "contextWidth": 2048},
        job={"maxRunHours": 2},
    )
    assert parallelism(config).sharding_strategy == "full"


@pytest.mark.parametrize(("value", "mode"), [(True, "full"), (False, "off"), ("op", "op")])
def test_set_keys_are_kept_and_switches_mean_full_or_off(value: Any, mode: str) -> None:
    config = parse(
        gpuNodes=FOUR_A10G,
        model={"preset": "llama3.2-1b", "numLayers": 2},
        training={"activationCheckpointing": value, "shardingStrategy": "full"},
    )
    assert parallelism(config).activation_checkpointing == mode
    assert parallelism(config).reason == "as set"
    # The stack's value is the trainer's: one field end to end.
    assert trainer_flags(plan_run(config))["activation_checkpointing"] == mode


# --- host memory, and advice that works ---------------------------------------------------

TWO_P4D = {"instanceType": "p4d.24xlarge", "count": 2}
OFFLOADED_70B: dict[str, Any] = {
    "gpuNodes": TWO_P4D,
    "storage": FAST_FSX,
    "model": {"preset": "llama3.1-70b"},
    "training": {"cpuOffload": True, "microBatchSize": 1},
}
"""llama3.1-70b offloaded on two p4d: 16 bytes x 70.6B = 1,051 GiB of state, where a p4d's
1,152 GiB leave 864 GiB (75%) for it. Within a node (hybrid) every node holds all of it; fully
sharded over both nodes, each holds half."""


def values_with(changes: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """`base` stack sections with a remedy's changes applied: dotted stack keys as users
    write them, None to unset one."""
    values = {key: dict(section) for key, section in base.items()}
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        values.setdefault(section, {})
        if value is None:
            values[section].pop(key, None)
        else:
            values[section][key] = value
    return values


def sections(**overrides: Any) -> dict[str, Any]:
    """ONE_A10G's sections with `overrides` replacing whole sections, `training` merged."""
    training = {**ONE_A10G["training"], **overrides.pop("training", {})}
    return {**ONE_A10G, **overrides, "training": training}


def memory_problems_of(values: dict[str, Any]) -> list[str]:
    return memory_problems(validate_stack_config(values, stack_name="memory").config)


def test_auto_sharding_weighs_host_memory_when_offloading() -> None:
    """Within a node the offloaded state would not fit a p4d's memory; over both it does: auto
    chooses full sharding instead of refusing the run."""
    config = parse(**sections(**OFFLOADED_70B))
    assert parallelism(config).sharding_strategy == "full"
    assert host_state_bytes(config) / GIB == pytest.approx(1051.3 / 2, rel=0.01)
    assert memory_problems(config) == []


def test_an_offload_that_overflows_a_node_names_only_options_that_fit() -> None:
    """Set to hybrid, the run is refused, and "more nodes" is not offered: under hybrid a node
    holds the whole state whatever their number. Every option offered, applied to the stack,
    leaves no memory problem."""
    training = {**OFFLOADED_70B["training"], "shardingStrategy": "hybrid"}
    hybrid = sections(**{**OFFLOADED_70B, "training": training})
    config = validate_stack_config(hybrid, stack_name="memory").config
    [problem] = memory_problems(config)
    assert problem.startswith("training.cpuOffload: true puts ~1051 GiB")
    assert "gpuNodes.count" not in problem
    offered = host_remedies(config)
    assert [remedy.changes for remedy in offered][:1] == [{"training.shardingStrategy": "full"}]
    for remedy in offered:
        assert remedy.label in problem
        assert memory_problems_of(values_with(remedy.changes, hybrid)) == [], remedy.label


def test_an_overrun_caused_by_a_small_shard_group_names_its_key() -> None:
    """hsdpShardSize 2 shards llama3.1-8b's state over 2 A100s, 74 GiB each: the key that
    caused it is the first way out, and every way out that says it fits does."""
    small = sections(
        gpuNodes=TWO_P4D,
        storage=FAST_FSX,
        model={"preset": "llama3.1-8b"},
        training={"shardingStrategy": "hybrid", "hsdpShardSize": 2, "microBatchSize": 1},
    )
    config = validate_stack_config(small, stack_name="memory").config
    [problem] = memory_problems(config)
    found = remedies(config)
    assert found[0].changes == {"training.hsdpShardSize": None}  # one node's 8 GPUs
    assert "unset training.hsdpShardSize (instead of 2" in problem
    assert "training.hsdpShardSize: 4 (instead of 2)" not in problem  # 4 is still too few
    for remedy in found:
        applied = memory_problems_of(values_with(remedy.changes, small))
        assert (applied == []) is remedy.fits, (remedy.label, applied)


@pytest.mark.parametrize(
    "overrides",
    [
        {"model": {"preset": "llama3.1-70b"}, "job": {"maxRunHours": 8}},
        {"model": {"preset": "llama3.2-1b"}, "gpuNodes": {"instanceType": "g5.8xlarge",
         "count": 1}, "training": {"microBatchSize": 4, "extraArgs": {"loss_chunk_tokens": 0}}},
        {"gpuNodes": TWO_P4D, "storage": FAST_FSX, "model": {"preset": "llama3.1-70b"},
         "training": {"shardingStrategy": "hybrid", "activationCheckpointing": False}},
    ],
)  # fmt: skip
def test_every_option_that_says_it_fits_does(overrides: dict[str, Any]) -> None:
    """A hint is a promise: applied to the stack, one that says "fits" leaves no memory
    problem, and one that says "not enough alone" still leaves one."""
    values = sections(**overrides)
    config = validate_stack_config(values, stack_name="memory").config
    found = remedies(config)
    assert found
    for remedy in found:
        applied = memory_problems_of(values_with(remedy.changes, values))
        assert (applied == []) is remedy.fits, (remedy.label, applied)
