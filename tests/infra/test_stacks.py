"""Every experiment under stacks/ evaluates, and its job is what the stack file says."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import StackConfig, StackConfigError, load_stack_file, read_stack_file
from infra.estimates.duration import estimate_duration
from infra.estimates.run_plan import plan_run
from infra.job.flags import TRAINER_LAUNCHER, s3_run_prefix
from infra.job.manifest import EFA_RESOURCE, GPU_RESOURCE
from infra.offline import Evaluation, FakeCloud, RecordedResource, evaluate
from infra.program import main as program
from tests.crd_schemas import validate as validate_against_schema
from trainer.config import TrainConfig, parse_args

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted(
    path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    for path in (REPO_ROOT / "stacks").glob("Pulumi.*.yaml")
)
PYTORCHJOB_STACKS = [name for name in STACKS if load_stack_file(name).job.api == "pytorchjob"]
"""The stacks whose job is a PyTorchJob; tests/infra/test_trainjob_stack.py holds the rest."""
JOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
REQUIRED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
FORBIDDEN_ENV = {
    "NCCL_SOCKET_IFNAME",
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_P2P_DISABLE",
    "CUDA_LAUNCH_BLOCKING",
}


@cache
def stack(name: str) -> tuple[StackConfig, Evaluation]:
    stack_file = read_stack_file(name)
    result = evaluate(
        program, config=stack_file.config, secret_keys=stack_file.secret_keys, stack=name
    )
    return load_stack_file(name), result


def job_of(result: Evaluation) -> RecordedResource:
    return result.one(JOB)


def pod_of(job: RecordedResource) -> dict[str, Any]:
    return job.inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def container_of(job: RecordedResource) -> dict[str, Any]:
    (container,) = pod_of(job)["containers"]
    assert container["name"] == "pytorch"
    return container


def trainer_config(job: RecordedResource) -> TrainConfig:
    container = container_of(job)
    assert container["command"] == list(TRAINER_LAUNCHER)
    args = container["args"]
    assert args[2:4] == ["-m", "trainer"]
    return parse_args(args[4:])


def test_the_experiments_users_run_today_are_all_here() -> None:
    assert {
        "dev",
        "llama31-8b-p5",
        "llama32-1b-g5",
        "llama2-7b-p4d",
        "mixtral-8x7b-p5",
        "team-cluster",
    } <= set(STACKS)


@pytest.mark.parametrize("name", PYTORCHJOB_STACKS)
def test_stack_job_matches_its_config(name: str) -> None:
    config, result = stack(name)
    job = job_of(result)
    facts = config.instance
    spec = job.inputs["spec"]
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == config.gpu_nodes.count
    assert spec["nprocPerNode"] == str(facts.gpus)
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    elastic = spec["elasticPolicy"]
    assert elastic["minReplicas"] == elastic["maxReplicas"] == config.gpu_nodes.count
    assert elastic["rdzvBackend"] == "c10d"
    assert config.job.max_run_hours is not None  # every stack has a deadline
    assert spec["runPolicy"]["activeDeadlineSeconds"] == int(config.job.max_run_hours * 3600)
    # `fsdp-eks stop` / `start` own `suspend`; Pulumi must never hold an opinion on it.
    assert "suspend" not in spec["runPolicy"]
    # `up` waits for every worker through the job's JobStartWatch, not a waitFor annotation.
    assert "pulumi.com/waitFor" not in job.inputs["metadata"].get("annotations", {})
    watch = result.one("pulumi-python:dynamic/job:JobStartWatch")
    assert watch.inputs["workers"] == config.gpu_nodes.count and job.urn in watch.dependencies
    assert job.delete_before_replace and job.replace_on_changes == ["spec"]

    container = container_of(job)
    limits = container["resources"]["limits"]
    assert limits[GPU_RESOURCE] == facts.gpus
    assert limits.get(EFA_RESOURCE, 0) == (
        facts.efa_interfaces if config.gpu_nodes.efa_enabled else 0
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert REQUIRED_ENV.items() <= env.items()
    assert not FORBIDDEN_ENV & set(env)
    assert (env.get("FI_PROVIDER") == "efa") == config.gpu_nodes.efa_enabled

    pod = pod_of(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert pod["nodeSelector"] == {
        "node.kubernetes.io/instance-type": config.gpu_nodes.instance_type
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]

    parsed = trainer_config(job)
    assert parsed.model.preset_name == config.model.preset
    assert parsed.model.max_context_width == config.training.context_width
    assert parsed.optim.max_steps == config.training.max_steps
    world = config.gpu_nodes.count * facts.gpus
    batch = parsed.data.train_batch_size * world * parsed.optim.gradient_accumulation_steps
    assert batch == config.global_batch_size
    assert parsed.checkpoint.checkpoint_dir == parsed.checkpoint.resume_from_checkpoint
    # The output names the real bucket where the pod's argument has `$(CHECKPOINT_BUCKET)`.
    bucket = f"s3://{result.stack_outputs['bucketName']}/"
    assert parsed.checkpoint.checkpoint_dir == result.stack_outputs["checkpointPath"].replace(
        bucket, "s3://$(CHECKPOINT_BUCKET)/"
    )


@pytest.mark.parametrize("name", PYTORCHJOB_STACKS)
def test_stack_job_is_valid_for_the_operator(name: str, crd_schema: dict[str, Any]) -> None:
    job = job_of(stack(name)[1])
    manifest = {key: job.inputs[key] for key in ("apiVersion", "kind", "metadata", "spec")}
    # The engine's wire format turns integers into floats; the API server receives integers.
    validate_against_schema(_whole(manifest), crd_schema)


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


@pytest.mark.parametrize("name", PYTORCHJOB_STACKS)
def test_stack_job_waits_for_the_platform_and_exports_what_users_need(name: str) -> None:
    config, result = stack(name)
    job = job_of(result)
    for release in result.of_type("kubernetes:helm.sh/v3:Release"):
        # The in-cluster Grafana is for people watching: the job does not wait for it.
        assert result.depends_on(job, release) != (release.inputs["chart"] == "grafana"), (
            release.name
        )
    for operator in result.of_type("kubernetes:apps/v1:Deployment"):
        assert result.depends_on(job, operator), operator.name  # the training operator
    for node_group in result.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert result.depends_on(job, node_group)
    for claim in result.of_type("kubernetes:core/v1:PersistentVolumeClaim"):
        assert result.depends_on(job, claim)
    assert job.provider.startswith(result.one("pulumi:providers:kubernetes").urn)
    outputs = result.stack_outputs
    assert outputs["jobName"] == config.job.name
    assert outputs["namespace"] == config.job.namespace
    assert "@sha256:" in outputs["image"]
    assert container_of(job)["image"] == outputs["image"]
    assert outputs["kubectl"]["logs"].endswith(f"logs -f {config.job.name}-worker-0 -c pytorch")
    assert outputs["estimatedUsdPerHour"] > 0


def test_llama31_8b_uses_every_efa_interface_of_p5_and_its_secret_token() -> None:
    config, result = stack("llama31-8b-p5")
    job = job_of(result)
    assert container_of(job)["resources"]["limits"][EFA_RESOURCE] == 32
    assert config.world_size == 32
    secret = result.one("kubernetes:core/v1:Secret", "job-hf-token")
    # The token is a file from the Secret (HF_TOKEN_PATH), not an environment variable.
    [volume] = [v for v in pod_of(job)["volumes"] if v["name"] == "hf-token"]
    assert volume["secret"]["secretName"] == secret.inputs["metadata"]["name"]
    env = {e["name"]: e for e in container_of(job)["env"]}
    assert "HF_TOKEN" not in env and env["HF_TOKEN_PATH"]["value"].startswith("/var/run/secrets/")
    assert trainer_config(job).data.tokenizer == "meta-llama/Llama-3.1-8B"


def test_llama32_1b_runs_one_gpu_and_one_efa_interface_per_g5_node() -> None:
    _, result = stack("llama32-1b-g5")
    job = job_of(result)
    assert job.inputs["spec"]["nprocPerNode"] == "1"
    assert container_of(job)["resources"]["limits"][EFA_RESOURCE] == 1
    assert trainer_config(job).optim.gradient_accumulation_steps == 4


def test_llama2_7b_mounts_fsx_and_starts_from_staged_weights() -> None:
    _, result = stack("llama2-7b-p4d")
    job = job_of(result)
    fsx = result.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fsx.inputs["storageCapacity"] == 1200
    claim = result.one("kubernetes:core/v1:PersistentVolumeClaim")
    volumes = {v["name"]: v for v in pod_of(job)["volumes"]}
    assert (
        volumes["shared"]["persistentVolumeClaim"]["claimName"] == claim.inputs["metadata"]["name"]
    )
    assert container_of(job)["resources"]["limits"][EFA_RESOURCE] == 4
    assert trainer_config(job).model.init_from == "/fsx/models/Llama-2-7b-hf"
    assert result.stack_outputs["checkpointPath"].startswith("/fsx/checkpoints/llama2-7b-p4d-")


def test_mixtral_shards_over_eight_p5_nodes() -> None:
    config, result = stack("mixtral-8x7b-p5")
    parsed = trainer_config(job_of(result))
    assert parsed.model.shape().num_local_experts == 8
    assert config.world_size == 64 and parsed.parallel.sharding_strategy == "full"


def test_dev_stack_is_one_cheap_node_without_fsx() -> None:
    config, result = stack("dev")
    assert result.of_type("aws:fsx/lustreFileSystem:LustreFileSystem") == []
    volumes = {v["name"]: v for v in pod_of(job_of(result))["volumes"]}
    assert volumes["shared"] == {"name": "shared", "emptyDir": {}}
    assert config.cost.max_usd_per_run is not None and config.cost.max_usd_per_run <= 5


def test_existing_cluster_stack_creates_only_image_and_job() -> None:
    _, result = stack("team-cluster")
    types = {r.type for r in result.resources}
    for absent in (
        "eks:index:Cluster",
        "aws:ec2/vpc:Vpc",
        "aws:eks/nodeGroup:NodeGroup",
        "kubernetes:helm.sh/v3:Release",
        "kubernetes:core/v1:Namespace",
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        "kubernetes:core/v1:PersistentVolumeClaim",
    ):
        assert absent not in types, absent
    job = job_of(result)
    assert job.inputs["metadata"]["namespace"] == "team-ml"
    volumes = {v["name"]: v for v in pod_of(job)["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    assert ("aws:eks/getCluster:getCluster", {"name": "ml-team-cluster"}) in [
        (token, {"name": args.get("name")}) for token, args in result.invokes
    ]


@pytest.mark.parametrize("name", STACKS)
def test_a_stack_that_names_an_availability_zone_names_its_region(name: str) -> None:
    """An AZ only exists in its region: without `aws:region` the stack would run in whatever
    region the deployer's environment defaults to and fail there (or worse, in CI's default)."""
    raw = read_stack_file(name).config
    gpu_zone = (raw.get("fsdp-eks:gpuNodes") or {}).get("availabilityZone")
    network = (raw.get("fsdp-eks:cluster") or {}).get("network") or {}
    zones = [z for z in [gpu_zone, *(network.get("availabilityZones") or [])] if z]
    if not zones:
        return
    region = raw.get("aws:region")
    assert region is not None, f"{name}: availability zones {zones} but no aws:region"
    assert all(zone.startswith(str(region)) for zone in zones), (region, zones)


@pytest.mark.parametrize("name", STACKS)
def test_the_run_fits_its_own_deadline(name: str) -> None:
    """The trainer's own FLOPs per token and per-GPU peak (trainer.flops), at the MFU that
    infra.estimates.duration assumes, plus a start-up allowance: a deadline shorter than that kills
    the run before maxSteps, after the GPUs were paid for."""
    config = load_stack_file(name)
    assert config.job.max_run_hours is not None
    estimate = estimate_duration(config)
    assert estimate.hours <= config.job.max_run_hours, (
        f"{name}: {estimate.summary()} exceeds job.maxRunHours {config.job.max_run_hours:g}"
    )


def test_no_shipped_stack_carries_an_encrypted_value() -> None:
    """A `secure:` value decrypts only with the secrets provider of the stack that encrypted
    it (Pulumi docs, "Secrets": `pulumi config set --secret` stores the ciphertext in the
    stack settings file), so a placeholder makes a real preview fail before the program runs.
    Secrets are the deployer's to set; the stack file's comment says how."""
    for name in STACKS:
        document = yaml.safe_load((REPO_ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text())
        encrypted = [
            key
            for key, value in document["config"].items()
            if isinstance(value, dict) and "secure" in value
        ]
        assert encrypted == [], f"{name}: {encrypted}"


class _CountingCloud(FakeCloud):
    def __init__(self) -> None:
        super().__init__()
        self.registered: list[str] = []

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        self.registered.append(args.typ)
        return super().new_resource(args)


def test_a_gated_tokenizer_without_hf_token_stops_the_program_naming_hf_token() -> None:
    """As the engine passes llama31-8b-p5 before the deployer sets the token (no placeholder):
    the program stops naming hfToken and the command, with nothing registered (no cost)."""
    raw = yaml.safe_load((REPO_ROOT / "stacks/Pulumi.llama31-8b-p5.yaml").read_text())["config"]
    assert not any(key.endswith(":hfToken") for key in raw)
    cloud = _CountingCloud()
    with pytest.raises(StackConfigError) as caught:
        evaluate(program, config=raw, stack="llama31-8b-p5", fake_cloud=cloud)
    assert caught.value.problems == [
        "data.tokenizer 'meta-llama/Llama-3.1-8B' is gated on the Hugging Face hub and hfToken "
        "is not set; add it with `pulumi config set --secret hfToken hf_...`"
    ]
    assert cloud.registered == []
    with_token = {**raw, "fsdp-eks:hfToken": "hf_test"}
    evaluate(program, config=with_token, secret_keys=["fsdp-eks:hfToken"], stack="llama31-8b-p5")


def test_the_offline_reader_warns_about_the_missing_token_and_plans_as_if_set() -> None:
    stack_file = read_stack_file("llama31-8b-p5")
    (warning,) = stack_file.warnings
    assert "hfToken is not set" in warning
    assert "pulumi config set --secret hfToken hf_... -s llama31-8b-p5" in warning
    assert stack_file.secret_keys == ["fsdp-eks:hfToken"]
    assert load_stack_file("llama31-8b-p5").hf_token is not None
    for name in STACKS:  # stacks that need no token get neither a token nor a warning
        if name != "llama31-8b-p5":
            assert read_stack_file(name).warnings == [], name
            assert load_stack_file(name).hf_token is None, name


@pytest.mark.parametrize("name", PYTORCHJOB_STACKS)
def test_every_node_of_every_stack_sees_the_runs_checkpoints(name: str) -> None:
    """Nodes on pod-local emptyDir volumes write their DCP shards where no other node can see
    them, and the run dies at its first save. So a job checkpoints onto the one claim every
    node mounts, or (no FSx) under its run's prefix in the stack's bucket, through a service
    account whose Pod Identity role reaches that prefix and no other, created before the job."""
    config, result = stack(name)
    job = job_of(result)
    pod, container = pod_of(job), container_of(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    checkpoint_dir = trainer_config(job).checkpoint.checkpoint_dir
    assert checkpoint_dir is not None
    if config.storage.fsx.enabled:
        mount = next(m for m in container["volumeMounts"] if m["name"] == "shared")
        assert checkpoint_dir.startswith(f"{mount['mountPath']}/")
        assert "persistentVolumeClaim" in volumes["shared"], (name, volumes["shared"])
        assert "serviceAccountName" not in pod
        return
    prefix = s3_run_prefix(plan_run(config))
    assert checkpoint_dir == f"s3://$(CHECKPOINT_BUCKET)/{prefix}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    bucket = result.stack_outputs["bucketName"]
    assert env["CHECKPOINT_BUCKET"] == bucket  # what the kubelet puts in place of $(...)
    assert env["AWS_REGION"]
    assert result.stack_outputs["checkpointPath"] == f"s3://{bucket}/{prefix}"
    account = result.one("kubernetes:core/v1:ServiceAccount", "run-access-service-account")
    assert pod["serviceAccountName"] == account.inputs["metadata"]["name"]
    # Pod Identity's webhook projects its own token: the API token stays unmounted.
    assert pod["automountServiceAccountToken"] is False
    association = result.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", "run-access-identity"
    )
    assert association.inputs["serviceAccount"] == account.inputs["metadata"]["name"]
    policy = json.loads(
        result.one("aws:iam/rolePolicy:RolePolicy", "run-access-policy").inputs["policy"]
    )
    objects = next(st for st in policy["Statement"] if st["Sid"] == "ThisRunsObjects")
    assert objects["Resource"].endswith(f":::{bucket}/{prefix}/*")
    assert result.depends_on(job, association)  # credentials reach only pods made after it
