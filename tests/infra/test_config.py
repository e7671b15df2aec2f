"""The stack config: bad files are rejected with one clear message each, before any resource.

The table runs the real program (`infra.program.main`) under the mock runtime, so it proves two
things per case: the message names the key, the bad value and what is allowed, and nothing at
all was registered with the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from infra.config import PROJECT, StackConfig, StackConfigError, parse_stack_config
from infra.config.errors import _model_at
from infra.config.parse import config_keys, dns_name
from infra.estimates.run_plan import plan_run
from infra.job.flags import run_id, run_paths
from infra.offline import evaluate, runtime
from infra.program import main as program

REPO_ROOT = Path(__file__).resolve().parents[2]

# A small valid experiment; each case below changes one thing. Its nodes share a volume (the
# FSx file system the stack creates): several nodes must share one.
BASE: dict[str, Any] = {
    "gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
    "job": {"maxRunHours": 1},
    "training": {"maxSteps": 50},
    # Sized so that a checkpoint is no deadline's business.
    "storage": {"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}},
    "cost": {"maxUsdPerRun": 500},
}


def with_(**sections: Any) -> dict[str, Any]:
    """BASE with whole sections replaced (`None` removes one)."""
    config = {**BASE, **sections}
    return {key: value for key, value in config.items() if value is not None}


P5 = {"instanceType": "p5.48xlarge", "count": 4}

BAD_CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    (
        "misspelt section",
        {**BASE, "gpuNode": P5},
        "fsdp-eks:gpuNode is not a stack config key (did you mean 'gpuNodes'?)",
    ),
    (
        "misspelt nested key",
        with_(gpuNodes={"instanceTyp": "p5.48xlarge", "count": 4}),
        "gpuNodes.instanceTyp: unknown key (did you mean 'instanceType'?); allowed keys here: "
        "availabilityZone, capacity, count, efa",
    ),
    ("no GPU nodes at all", with_(gpuNodes=None), "gpuNodes is required and missing"),
    (
        "reserved capacity in a new VPC without its AZ",
        with_(
            gpuNodes={
                "instanceType": "p5.48xlarge",
                "count": 2,
                "capacity": {"type": "reservation", "reservationId": "cr-0123456789abcdef0"},
            }
        ),
        "gpuNodes.availabilityZone is required with gpuNodes.capacity.type 'reservation' in a "
        "new VPC: the GPU subnet must be in the AZ of cr-0123456789abcdef0",
    ),
    (
        "instance type without GPUs",
        with_(gpuNodes={"instanceType": "m5.large", "count": 1}),
        "gpuNodes.instanceType 'm5.large' is not a known GPU instance type; allowed: g5.12xlarge",
    ),
    (
        "zero nodes",
        with_(gpuNodes={"instanceType": "p5.48xlarge", "count": 0}),
        "gpuNodes.count = 0: input should be greater than or equal to 1",
    ),
    (
        "EFA on an instance without EFA",
        with_(gpuNodes={"instanceType": "g5.xlarge", "count": 1, "efa": True}),
        "gpuNodes.efa is true but gpuNodes.instanceType 'g5.xlarge' has no EFA support",
    ),
    (
        "more GPUs per node than the instance has",
        with_(job={"maxRunHours": 1, "gpusPerNode": 16}),
        "job.gpusPerNode 16 exceeds the 8 GPU(s) of gpuNodes.instanceType 'p5.48xlarge'; "
        "allowed: 1 to 8",
    ),
    (
        "unknown model preset",
        with_(model={"preset": "llama4-400b"}),
        "model.preset 'llama4-400b' is not a preset the trainer knows; allowed: llama2-13b",
    ),
    (
        "global batch that the GPUs cannot split",
        with_(training={**BASE["training"], "globalBatchSize": 100}),
        "training.globalBatchSize 100 is not a multiple of microBatchSize 2 x 32 GPUs "
        "(4 nodes x 8) = 64; allowed: 64, 128, 256",
    ),
    (
        "global batch and accumulation that disagree",
        with_(
            training={**BASE["training"], "globalBatchSize": 128, "gradientAccumulationSteps": 4}
        ),
        "training.globalBatchSize 128 disagrees with microBatchSize 2 x 32 GPUs x "
        "gradientAccumulationSteps 4 = 256",
    ),
    (
        "sequence longer than the model's context",
        with_(model={"preset": "llama2-7b"}, training={**BASE["training"], "contextWidth": 8192}),
        "training.contextWidth 8192 is longer than the 4096-token context of model.preset "
        "'llama2-7b'; allowed: up to 4096",
    ),
    (
        "capacity reservation with a placement group",
        with_(
            gpuNodes={
                **P5,
                "placementGroup": True,
                "capacity": {"type": "reservation", "reservationId": "cr-0123456789abcdef0"},
            }
        ),
        "gpuNodes.placementGroup is true together with gpuNodes.capacity.type 'reservation'",
    ),
    (
        "reservation without its id",
        with_(gpuNodes={**P5, "capacity": {"type": "block"}}),
        "gpuNodes.capacity.reservationId is required for capacity type 'block'",
    ),
    (
        "capacity block of a type EC2 sells no blocks for",
        with_(
            gpuNodes={
                "instanceType": "g6e.48xlarge",
                "count": 2,
                "availabilityZone": "us-east-1a",
                "capacity": {"type": "block", "reservationId": "cr-0123456789abcdef0"},
            }
        ),
        "gpuNodes.capacity.type 'block' with gpuNodes.instanceType 'g6e.48xlarge': EC2 "
        "Capacity Blocks are not sold for that type; allowed: p4d.24xlarge",
    ),
    (
        "existing cluster without a name",
        with_(cluster={"mode": "existing"}),
        "cluster.name is required when cluster.mode is 'existing'",
    ),
    (
        "platform stack in create mode",
        with_(cluster={"platformStack": "org/platform/prod"}),
        "cluster.platformStack is only read in cluster.mode 'existing'",
    ),
    (
        "unknown cluster mode",
        with_(cluster={"mode": "reuse"}),
        "cluster.mode = 'reuse': input should be 'create' or 'existing'",
    ),
    (
        "existing cluster, new FSx, no subnet",
        with_(cluster={"mode": "existing", "name": "team"}, storage={}),
        "storage.fsx would create a file system on the existing cluster but its subnet is not "
        "known",
    ),
    (
        "hub token in plaintext",
        {**BASE, "hfToken": "hf_plaintextvalue"},
        "fsdp-eks:hfToken is stored in plaintext; a token must be a Pulumi secret",
    ),
    (
        "gated tokenizer without a token",
        with_(data={"tokenizer": "meta-llama/Llama-3.1-8B"}),
        "data.tokenizer 'meta-llama/Llama-3.1-8B' is gated on the Hugging Face hub and hfToken "
        "is not set",
    ),
    (
        "forbidden NCCL variable",
        with_(job={"maxRunHours": 1, "extraEnv": {"NCCL_SOCKET_IFNAME": "eth0"}}),
        "job.extraEnv.NCCL_SOCKET_IFNAME must not be set: P4d/P5 do not use eth0 for EFA",
    ),
    (
        "CUDA_LAUNCH_BLOCKING left from debugging",
        with_(job={"maxRunHours": 1, "extraEnv": {"CUDA_LAUNCH_BLOCKING": "1"}}),
        "job.extraEnv.CUDA_LAUNCH_BLOCKING must not be set",
    ),
    (
        "extra trainer flag that does not exist",
        with_(training={"extraArgs": {"max_step": 10}}),
        "training.extraArgs.max_step is not a trainer flag (did you mean 'max_steps'?)",
    ),
    (
        "extra trainer flag that has its own key",
        with_(training={"extraArgs": {"lr": 0.1}}),
        "training.extraArgs.lr is set from its own stack key",
    ),
    (
        "hybrid shard size that does not divide the world",
        with_(training={**BASE["training"], "shardingStrategy": "hybrid", "hsdpShardSize": 3}),
        "training.hsdpShardSize 3 does not divide the world size 32 (4 nodes x 8 GPUs)",
    ),
    (
        "shard size without hybrid sharding",
        with_(training={**BASE["training"], "shardingStrategy": "full", "hsdpShardSize": 8}),
        "training.hsdpShardSize 8: the trainer refuses it: --hsdp_shard_size applies only to "
        "--sharding_strategy hybrid (--sharding_strategy is training.shardingStrategy)",
    ),
    (
        "unknown sharding strategy",
        with_(training={"shardingStrategy": "zero3"}),
        "training.shardingStrategy = 'zero3': input should be 'auto', 'full', 'hybrid', "
        "'shard_grad_op' or 'no_shard'",
    ),
    (
        "final learning rate above the peak",
        with_(training={**BASE["training"], "lr": 0.0001, "minLr": 0.1}),
        "training.minLr 0.1: the trainer refuses it: --min_lr must be in [0, --lr=0.0001], got "
        "0.1 (--lr is training.lr)",
    ),
    (
        "warmup longer than the run",
        with_(training={"maxSteps": 100, "warmup": 500}),
        "training.warmup 500.0: the trainer refuses it: --warmup 500 steps exceeds --max_steps "
        "100; allowed: at most --max_steps, or a fraction below 1 (--max_steps is "
        "training.maxSteps)",
    ),
    (
        "number given as words",
        with_(training={"contextWidth": "long"}),
        "training.contextWidth = 'long': input should be a valid integer",
    ),
    (
        "impossible shape override",
        with_(model={"preset": "llama3.1-8b", "hiddenSize": 1000}),
        "model: the overrides give an impossible shape",
    ),
    (
        "job name Kubernetes refuses",
        with_(job={"maxRunHours": 1, "name": "Llama_8B"}),
        "job.name 'Llama_8B' must be a DNS-1035 label of at most 48 characters",
    ),
    (
        "job name the training operator refuses (leading digit)",
        with_(job={"maxRunHours": 1, "name": "7b-run"}),
        "job.name '7b-run' must be a DNS-1035 label of at most 48 characters",
    ),
    (
        "section written as a scalar",
        {**BASE, "training": "fast"},
        "fsdp-eks:training must be a mapping of keys (e.g. training: {...}), got 'fast'",
    ),
    (
        "run estimated above its ceiling",
        with_(job={"maxRunHours": 12}, cost=None),
        "cost.maxUsdPerRun 100 is below the estimate $2,641.92",
    ),
    (
        "ceiling with no run length",
        with_(job={}, cost=None),
        "cost.maxUsdPerRun 100 needs a run length to check against: set job.maxRunHours",
    ),
    (
        "instance type without a list price",
        with_(gpuNodes={"instanceType": "p5e.48xlarge", "count": 1}),
        "no list price for 'p5e.48xlarge'",
    ),
    (
        "moving image tag",
        with_(image={"uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:latest"}),
        "uses ':latest', which moves under a running experiment",
    ),
    (
        "FSx size PERSISTENT_2 does not offer",
        with_(storage={"fsx": {"storageCapacityGiB": 1000}}),
        "storage.fsx.storageCapacityGiB 1000 is not a PERSISTENT_2 size",
    ),
    (
        "existing bucket without its name",
        with_(storage={"fsx": {"enabled": False}, "bucket": {"create": False}}),
        "storage.bucket.name is required when storage.bucket.create is false",
    ),
    (
        "EFA plugin too old for P6",
        with_(addons={"efaDevicePlugin": {"version": "v0.5.2"}}),
        "addons.efaDevicePlugin.version 'v0.5.2' is too old",
    ),
    (
        "shared memory larger than the node can give",
        with_(job={"maxRunHours": 1, "shmSizeGiB": 1500}),
        "job.shmSizeGiB 1500 leaves too little of the 2048 GiB of p5.48xlarge",
    ),
    (
        "a claim named on a cluster the stack creates",
        with_(storage={"fsx": {"existingClaimName": "team-lustre"}}),
        "storage.fsx.existingClaimName 'team-lustre' names a claim, but cluster.mode create "
        "makes a new cluster, where none exists",
    ),
    (
        "a typo in the system nodes' instance type",
        with_(cluster={"systemNodes": {"instanceType": "m6i.xlage"}}),
        "cluster.systemNodes.instanceType 'm6i.xlage' is not an EC2 instance type name",
    ),
    (
        "an arm64 system node type for the x86_64 AMI",
        with_(cluster={"systemNodes": {"instanceType": "m7g.large"}}),
        "cluster.systemNodes.instanceType 'm7g.large' is a Graviton (arm64) type",
    ),
]


@pytest.fixture
def registrations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Types of every resource the program registers with the (mock) engine."""
    recorded: list[str] = []
    original = runtime._RecordingMonitor.RegisterResource

    def spy(self: Any, request: Any) -> Any:
        if request.type != "pulumi:pulumi:Stack":
            recorded.append(request.type)
        return original(self, request)

    monkeypatch.setattr(runtime._RecordingMonitor, "RegisterResource", spy)
    return recorded


@pytest.mark.parametrize(
    ("values", "message"),
    [pytest.param(values, message, id=case) for case, values, message in BAD_CONFIGS],
)
def test_bad_config_is_rejected_before_any_resource(
    values: dict[str, Any], message: str, registrations: list[str]
) -> None:
    with pytest.raises(StackConfigError) as caught:
        evaluate(program, config=values, stack="exp")
    assert message in str(caught.value), str(caught.value)
    # One change, one problem, one line.
    assert len(caught.value.problems) == 1, caught.value.problems
    assert registrations == []


def test_the_spy_sees_registrations_of_a_valid_config(registrations: list[str]) -> None:
    evaluate(program, config=BASE, stack="exp")
    assert "kubernetes:kubeflow.org/v1:PyTorchJob" in registrations


def test_the_table_has_thirty_distinct_cases() -> None:
    assert len(BAD_CONFIGS) >= 30
    assert len({message for _, _, message in BAD_CONFIGS}) == len(BAD_CONFIGS)


def test_valid_base_config_evaluates() -> None:
    result = evaluate(program, config=BASE, stack="exp")
    assert result.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs["metadata"]["name"] == "exp"


def test_secret_token_is_accepted_and_never_plaintext_in_the_job() -> None:
    config = {**BASE, "hfToken": "hf_secretvalue"}
    result = evaluate(program, config=config, secret_keys=["hfToken"], stack="exp")
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert "hf_secretvalue" not in json.dumps(job.inputs)
    pod = job.inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    # The Secret reaches the trainer as a file (HF_TOKEN_PATH), never as an env variable.
    [token] = [v for v in pod["volumes"] if v["name"] == "hf-token"]
    assert token["secret"]["secretName"] == "exp-hf-token"
    assert {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/huggingface/token"} in pod[
        "containers"
    ][0]["env"]
    assert result.one("kubernetes:core/v1:Secret", "job-hf-token")


def test_empty_token_from_the_project_default_means_none() -> None:
    config = parse_stack_config({**BASE, "hfToken": ""}, stack_name="exp")
    assert config.hf_token is None


def test_values_as_the_engine_passes_them_json_text() -> None:
    values = {f"{PROJECT}:{key}": json.dumps(value) for key, value in BASE.items()}
    values["aws:region"] = "us-west-2"  # other namespaces belong to their providers
    config = parse_stack_config(values, stack_name="My.Experiment_1")
    assert config.gpu_nodes.count == 4
    assert config.job.name == "my-experiment-1"


def test_several_problems_are_all_reported() -> None:
    values = with_(
        gpuNodes={"instanceType": "p5.48xlarge", "count": 0},
        training={"shardingStrategy": "zero3", "microBatchSize": 0},
    )
    with pytest.raises(StackConfigError) as caught:
        parse_stack_config(values, stack_name="exp")
    assert len(caught.value.problems) == 3
    assert "stack 'exp' is invalid (3 problems):" in str(caught.value)


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ("dev", "dev"),
        ("Llama_3.1-8B", "llama-3-1-8b"),
        ("---", "training"),
        ("a" * 60, "a" * 48),
        ("7b-p5", "job-7b-p5"),
    ],
)
def test_default_job_name_from_the_stack_name(stack: str, expected: str) -> None:
    assert dns_name(stack) == expected


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for field in model.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found += _models(candidate)
    return found


def test_every_key_has_a_description() -> None:
    missing = [
        f"{model.__name__}.{name}"
        for model in _models(StackConfig)
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert missing == []


def test_pulumi_yaml_declares_every_section() -> None:
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == PROJECT
    assert "main" not in project  # the root __main__.py: see tests/infra/test_engine_layout.py
    assert project["stackConfigDir"] == "stacks"
    declared = project["config"]
    assert sorted(declared) == config_keys()
    for key, declaration in declared.items():
        assert declaration["description"], key
        if key == "gpuNodes":
            assert "default" not in declaration  # every stack must say what it runs on
        elif key == "hfToken":
            assert declaration == {**declaration, "type": "string", "default": ""}
        else:
            # Object sections cannot be typed in Pulumi.yaml; {} means "all model defaults".
            assert declaration["default"] == {} and "type" not in declaration
            section = _model_at((key,))
            assert section is not None and section.model_validate({})


def test_program_reads_every_key_the_language_host_passes_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside the mock, the engine hands config over as PULUMI_CONFIG (JSON): keys read from
    there are validated too, so a misspelt key in a real `pulumi up` is still caught."""
    passed = {f"{PROJECT}:{key}": json.dumps(value) for key, value in BASE.items()}
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({**passed, f"{PROJECT}:trainng": "{}"}))
    with pytest.raises(StackConfigError, match="did you mean 'training'"):
        evaluate(program, config={}, stack="exp")
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({**passed, f"{PROJECT}:hfToken": "hf_x"}))
    with pytest.raises(StackConfigError, match="hfToken is stored in plaintext"):
        evaluate(program, config={}, stack="exp")
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps([f"{PROJECT}:hfToken"]))
    result = evaluate(program, config={}, stack="exp")
    assert result.one("kubernetes:core/v1:Secret", "job-hf-token")


@pytest.mark.parametrize(
    ("cluster", "job", "creates"),
    [
        ({}, {}, True),  # the stack owns its cluster, so the namespace is its own too
        ({"mode": "existing", "name": "team"}, {}, False),  # shared: never owned by one stack
        ({"mode": "existing", "name": "team"}, {"createNamespace": True}, True),
        ({}, {"createNamespace": False}, False),
    ],
)
def test_namespace_is_created_by_default_only_on_the_stacks_own_cluster(
    cluster: dict[str, Any], job: dict[str, Any], creates: bool
) -> None:
    shared = cluster.get("mode") == "existing"  # the team's claim there, not a new FSx
    storage = {"fsx": {"existingClaimName": "team-lustre"}} if shared else BASE["storage"]
    values = with_(cluster=cluster or None, job={"maxRunHours": 1, **job}, storage=storage)
    config = parse_stack_config(values, stack_name="exp")
    assert config.job.create_namespace is creates


EXISTING = {"mode": "existing", "name": "team-cluster"}


@pytest.mark.parametrize(
    ("count", "fsx", "cluster", "in_s3"),
    [
        (4, {"enabled": False}, None, True),  # no FSx, so the run lives in S3
        (1, {"enabled": False}, None, True),
        (4, {}, None, False),  # a new FSx file system every node mounts
        (4, {"existingClaimName": "team-lustre"}, EXISTING, False),  # a claim every node mounts
    ],
)
def test_every_node_sees_the_runs_checkpoints(
    count: int, fsx: dict[str, Any], cluster: dict[str, Any] | None, in_s3: bool
) -> None:
    """Checkpoints on node-local volumes would kill a multi-node run at its first save: DCP's
    FileSystemWriter writes each rank's shards where *that rank* writes
    (`torch/distributed/checkpoint/filesystem.py` `_FileSystemWriter.write_data`) and only the
    coordinator writes `.metadata` (`finish`), so no node would hold a whole checkpoint. So a
    run keeps them on FSx, or, without it, under its own prefix of the stack's bucket, which
    every node reaches (trainer.checkpoint_store); never on a pod-local volume."""
    values = with_(
        gpuNodes={"instanceType": "p5.48xlarge", "count": count},
        storage={"fsx": fsx},
        cluster=cluster,
    )
    config = parse_stack_config(values, stack_name="exp")
    paths = run_paths(plan_run(config))
    assert paths.in_s3 is in_s3
    if in_s3:
        assert paths.run_dir == f"s3://$(CHECKPOINT_BUCKET)/checkpoints/{run_id(plan_run(config))}"
        assert paths.staging_dir == "/scratch/outputs"
    else:
        assert paths.run_dir.startswith(f"{config.storage.fsx.mount_path}/checkpoints/")


@pytest.mark.parametrize(
    ("region", "zone", "ok"),
    [
        ("us-east-1", "us-east-1a", True),
        ("us-east-1", "us-west-2b", False),
        ("us-east-1", "us-east-2a", False),
        (None, "us-west-2b", True),  # no aws:region: the provider's default applies
    ],
)
def test_an_az_of_another_region_is_one_line_in_the_same_list(
    region: str | None, zone: str, ok: bool
) -> None:
    values: dict[str, Any] = {
        **{f"fsdp-eks:{key}": value for key, value in BASE.items()},
        "fsdp-eks:gpuNodes": {**P5, "availabilityZone": zone},
    }
    if region is not None:
        values["aws:region"] = region
    if ok:
        parse_stack_config(values, stack_name="exp")
        return
    with pytest.raises(StackConfigError) as error:
        parse_stack_config(values, stack_name="exp")
    assert error.value.problems == [
        f"gpuNodes.availabilityZone {zone!r} is not in aws:region {region!r}; allowed: an AZ "
        f"of {region} ({region}a, {region}b, ...), or set aws:region to the zone's region"
    ]


@pytest.mark.parametrize("namespace", ["fsdp_eks", "fsdp-EKS", "fsdpeks", "fsdp-ek"])
def test_a_misspelt_project_namespace_is_an_error_not_an_ignored_setting(namespace: str) -> None:
    values = {f"fsdp-eks:{k}": v for k, v in BASE.items()}
    values[f"{namespace}:training"] = {"maxSteps": 10}
    with pytest.raises(StackConfigError) as error:
        parse_stack_config(values, stack_name="exp")
    assert error.value.problems == [
        f"{namespace}:training is in namespace {namespace!r}, which the program does not read "
        "(it reads fsdp-eks:<key> only): the setting would be silently ignored; allowed: "
        "fsdp-eks:training"
    ]


def test_provider_namespaces_stay_the_providers() -> None:
    values = {f"fsdp-eks:{k}": v for k, v in BASE.items()}
    values.update({"aws:region": "us-east-1", "kubernetes:context": "x", "pulumi:tags": {}})
    parse_stack_config(values, stack_name="exp")
