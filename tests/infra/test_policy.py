"""The guardrails: each one catches its own mistake and nothing else, on resources registered
through the real Pulumi SDK classes (so the prop names are the engine's), and the policy pack
really serves them to the Pulumi CLI over gRPC.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc, plugin_pb2

from infra.config.cost import CostConfig
from infra.estimates.run_plan import plan_run
from infra.offline import evaluate
from infra.policy.offline import Violation, check_resources, run_policies
from infra.policy.pack import build_policies
from infra.policy.registry import GUARDRAILS
from infra.policy.settings import (
    COST_POLICY,
    policy_config,
    policy_config_from_engine,
    policy_config_from_stack_file,
)
from infra.policy.view import PYTORCH_JOB, UNKNOWN, Resource, gpu_node_groups, plain

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
KMS_KEY = f"arn:aws:kms:us-west-2:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/gpu-nodes"
GENEROUS = policy_config(CostConfig.model_validate({"maxUsdPerRun": 10_000}))
PRICED_FOR_10_HOURS = policy_config(
    CostConfig.model_validate({"maxUsdPerRun": 10_000, "maxRunHours": 10})
)


def pytorch_job_spec(
    *,
    instance_type: str = "p5.48xlarge",
    workers: int = 2,
    efa: int | None = 32,
    env: dict[str, str] | None = None,
    deadline_s: int | None = 6 * 3600,
    args: list[str] | None = None,
) -> dict[str, Any]:
    """A PyTorchJob spec shaped like infra.job.manifest.render_job's."""
    limits: dict[str, Any] = {"nvidia.com/gpu": 8, "memory": "1700Gi"}
    if efa is not None:
        limits["vpc.amazonaws.com/efa"] = efa
    variables = {"FI_PROVIDER": "efa", "NCCL_NVLS_ENABLE": "0", **(env or {})}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": 3}
    if deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = deadline_s
    container = {
        "name": "pytorch",
        "image": f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "0" * 64,
        "command": ["torchrun"],
        "args": args
        if args is not None
        else ["--nnodes", str(workers), "-m", "trainer", "--max_steps", "1000"],
        "env": [{"name": k, "value": v} for k, v in variables.items()],
        "resources": {"limits": limits, "requests": {**limits, "cpu": "180"}},
    }
    return {
        "nprocPerNode": "8",
        "runPolicy": run_policy,
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": workers,
                "restartPolicy": "OnFailure",
                "template": {
                    "spec": {
                        "containers": [container],
                        "nodeSelector": {"node.kubernetes.io/instance-type": instance_type},
                    }
                },
            }
        },
    }


def platform_program(
    *,
    job: dict[str, Any] | None = None,
    node_group: dict[str, Any] | None = None,
    bucket_acl: str = "private",
    access_block: bool = True,
    bucket_policy_principal: Any = None,
    iam_actions: list[str] | None = None,
    admin_attachment: bool = False,
    scan_on_push: bool = True,
    cluster_key: str | None = KMS_KEY,
) -> Callable[[], None]:
    """A compliant stack (shaped like ours) unless a keyword swaps in a mistake."""

    def program() -> None:
        cluster = eks.Cluster("train", encryption_config_key_arn=cluster_key)
        eks.ManagedNodeGroup(
            "train-gpu",
            cluster=cluster,
            node_role_arn=ROLE_ARN,
            **(
                node_group
                or {
                    "instance_types": ["p5.48xlarge"],
                    "scaling_config": {"desired_size": 2, "min_size": 0, "max_size": 2},
                    "enable_efa_support": True,
                }
            ),
        )
        bucket = aws.s3.Bucket("data")
        aws.s3.BucketAcl("data-acl", bucket=bucket.id, acl=bucket_acl)
        aws.s3.BucketPublicAccessBlock(
            "data-block",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=access_block,
            ignore_public_acls=True,
            restrict_public_buckets=True,
        )
        if bucket_policy_principal is not None:
            aws.s3.BucketPolicy(
                "data-policy",
                bucket=bucket.id,
                policy=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Sid": "Read",
                                "Effect": "Allow",
                                "Principal": bucket_policy_principal,
                                "Action": "s3:GetObject",
                                "Resource": "arn:aws:s3:::data/*",
                            }
                        ],
                    }
                ),
            )
        role = aws.iam.Role(
            "fsx-csi",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "pods.eks.amazonaws.com"},
                            "Action": ["sts:AssumeRole", "sts:TagSession"],
                        }
                    ],
                }
            ),
        )
        aws.iam.RolePolicy(
            "fsx-csi-access",
            role=role.id,
            policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": iam_actions or ["fsx:DescribeFileSystems"],
                            "Resource": "*",
                        }
                    ],
                }
            ),
        )
        if admin_attachment:
            aws.iam.RolePolicyAttachment(
                "fsx-csi-admin",
                role=role.name,
                policy_arn="arn:aws:iam::aws:policy/AdministratorAccess",
            )
        aws.ecr.Repository("trainer", image_scanning_configuration={"scan_on_push": scan_on_push})
        k8s.apiextensions.CustomResource(
            "train-job",
            api_version="kubeflow.org/v1",
            kind="PyTorchJob",
            metadata={"name": "train", "namespace": "training"},
            spec=job or pytorch_job_spec(),
        )

    return program


def violated(program: Callable[[], None], config: Any = GENEROUS) -> list[Violation]:
    return run_policies(evaluate(program, config={}), config)


def test_the_compliant_stack_passes_every_guardrail() -> None:
    assert violated(platform_program()) == []


MISTAKES: list[tuple[str, dict[str, Any], str]] = [
    (
        "efa-on-efa-instances",
        {"job": pytorch_job_spec(efa=None)},
        r"2-node job on p5\.48xlarge but requests vpc\.amazonaws\.com/efa: 0; request all 32",
    ),
    (
        "efa-on-efa-instances",
        {"job": pytorch_job_spec(efa=8)},
        r"requests vpc\.amazonaws\.com/efa: 8; request all 32",
    ),
    (
        "efa-on-efa-instances",
        {
            "node_group": {
                "instance_types": ["p5.48xlarge"],
                "scaling_config": {"desired_size": 2, "min_size": 0, "max_size": 2},
                "enable_efa_support": False,
            }
        },
        r"train-gpu: 2 x p5\.48xlarge without EFA",
    ),
    (
        "no-forbidden-nccl-env",
        {"job": pytorch_job_spec(env={"NCCL_SOCKET_IFNAME": "eth0"})},
        r"sets NCCL_SOCKET_IFNAME='eth0'",
    ),
    (
        "no-forbidden-nccl-env",
        {"job": pytorch_job_spec(env={"NCCL_PROTO": "simple"})},
        r"sets NCCL_PROTO='simple'; remove it",
    ),
    (
        "no-forbidden-nccl-env",
        {"job": pytorch_job_spec(env={"NCCL_ALGO": "Ring"})},
        r"sets NCCL_ALGO='Ring'",
    ),
    (
        "no-forbidden-nccl-env",
        {"job": pytorch_job_spec(env={"NCCL_P2P_DISABLE": "1"})},
        r"NCCL_P2P_DISABLE='1'.*NVLink",
    ),
    (
        "no-forbidden-nccl-env",
        {"job": pytorch_job_spec(env={"CUDA_LAUNCH_BLOCKING": "true"})},
        r"CUDA_LAUNCH_BLOCKING='true'",
    ),
    ("no-public-s3", {"bucket_acl": "public-read"}, r"data-acl: ACL 'public-read'"),
    ("no-public-s3", {"access_block": False}, r"data-block: .*leaves blockPublicPolicy off"),
    ("no-public-s3", {"bucket_policy_principal": "*"}, r"statement Read allows s3:GetObject"),
    ("no-public-s3", {"bucket_policy_principal": {"AWS": "*"}}, r"to every principal"),
    ("iam-no-star-star", {"iam_actions": ["*"]}, r"fsx-csi-access: statement #0 .*`\*:\*`"),
    ("iam-no-star-star", {"iam_actions": ["*:*"]}, r"every action"),
    ("iam-no-star-star", {"admin_attachment": True}, r"fsx-csi-admin: AdministratorAccess"),
    ("ecr-scan-on-push", {"scan_on_push": False}, r"trainer: ECR repository without scan"),
    ("eks-secrets-encryption", {"cluster_key": None}, r"train: EKS cluster without KMS"),
    (
        "job-run-bound",
        {"job": pytorch_job_spec(deadline_s=None, args=["-m", "trainer", "--lr", "1e-4"])},
        r"train-job: the job has no deadline .* no positive --max_steps",
    ),
]


@pytest.mark.parametrize(("policy", "mistake", "message"), MISTAKES)
def test_each_mistake_is_caught_by_its_own_guardrail_only(
    policy: str, mistake: dict[str, Any], message: str
) -> None:
    violations = violated(platform_program(**mistake))
    # An unbounded run also cannot be held to a cost ceiling: that second finding is right.
    also = {COST_POLICY} if policy == "job-run-bound" else set()
    assert {v.policy for v in violations} == {policy} | also, violations
    assert any(re.search(message, v.message) for v in violations), violations
    assert all(v.enforcement == "mandatory" for v in violations)


def test_every_guardrail_has_a_mistake_in_the_table() -> None:
    assert {g.name for g in GUARDRAILS} - {COST_POLICY} == {m[0] for m in MISTAKES}


@pytest.mark.parametrize(
    ("args", "deadline_s"),
    [
        (["-m", "trainer", "--max_steps=200"], None),
        (["-m", "trainer", "--max_training_steps", "50"], None),
        (["-c", "torchrun -m trainer --max_steps 10 --lr 1e-4"], None),
        (["-m", "trainer"], 3600),
    ],
)
def test_a_deadline_or_max_steps_bounds_the_run(args: list[str], deadline_s: int | None) -> None:
    job = pytorch_job_spec(deadline_s=deadline_s, args=args)
    assert violated(platform_program(job=job), PRICED_FOR_10_HOURS) == []


def test_a_zero_max_steps_does_not_count_as_a_bound() -> None:
    job = pytorch_job_spec(deadline_s=None, args=["-m", "trainer", "--max_steps", "0"])
    violations = violated(platform_program(job=job), PRICED_FOR_10_HOURS)
    assert [v.policy for v in violations] == ["job-run-bound"]


def test_single_node_jobs_and_non_efa_instances_need_no_efa_request() -> None:
    single = platform_program(job=pytorch_job_spec(workers=1, efa=None))
    assert violated(single) == []
    g5 = platform_program(
        job=pytorch_job_spec(instance_type="g5.4xlarge", workers=4, efa=None),
        node_group={
            "instance_types": ["g5.4xlarge"],
            "scaling_config": {"desired_size": 4, "min_size": 0, "max_size": 4},
        },
    )
    assert [v for v in violated(g5) if v.policy == "efa-on-efa-instances"] == []


def test_an_efa_request_on_an_instance_without_efa_can_never_schedule() -> None:
    program = platform_program(
        job=pytorch_job_spec(instance_type="g5.xlarge", workers=2, efa=1),
        node_group={
            "instance_types": ["g5.xlarge"],
            "scaling_config": {"desired_size": 2, "min_size": 0, "max_size": 2},
        },
    )
    messages = [v.message for v in violated(program)]
    assert any("g5.xlarge has no EFA" in m for m in messages), messages


# --- the cost ceiling -----------------------------------------------------------------------


def test_cost_ceiling_prices_the_node_group_for_the_job_deadline() -> None:
    program = platform_program()  # 2 x p5.48xlarge, 6 h deadline: 2 x 55.04 x 6 = 660.48
    tight = policy_config(CostConfig.model_validate({"maxUsdPerRun": 600}))
    (violation,) = violated(program, tight)
    assert violation.policy == COST_POLICY
    assert "estimated $660.48 per run" in violation.message
    assert "2 x p5.48xlarge (on-demand) at $55.04/h = $110.08/h x 6 h" in violation.message
    assert "$600.00" in violation.message
    assert violated(program, policy_config(CostConfig.model_validate({"maxUsdPerRun": 700}))) == []


def test_cost_ceiling_defaults_apply_without_config_and_null_switches_it_off() -> None:
    program = platform_program()
    assert [v.policy for v in run_policies(evaluate(program, config={}))] == [COST_POLICY]
    off = policy_config(CostConfig.model_validate({"maxUsdPerRun": None}))
    assert violated(program, off) == []


def test_cost_ceiling_uses_the_price_override_and_the_configured_hours() -> None:
    no_deadline = platform_program(job=pytorch_job_spec(deadline_s=None))
    cheap = CostConfig.model_validate(
        {"maxUsdPerRun": 100, "maxRunHours": 2, "usdPerInstanceHour": 20}
    )
    assert violated(no_deadline, policy_config(cheap)) == []  # 2 x 20 x 2 = 80
    unknown_length = CostConfig.model_validate({"maxUsdPerRun": 100})
    (violation,) = violated(no_deadline, policy_config(unknown_length))
    assert "no known length" in violation.message


def test_cost_ceiling_on_an_existing_cluster_prices_the_job_replicas() -> None:
    def program() -> None:
        k8s.apiextensions.CustomResource(
            "train-job",
            api_version="kubeflow.org/v1",
            kind="PyTorchJob",
            metadata={"name": "train"},
            spec=pytorch_job_spec(instance_type="p5.48xlarge", workers=4, deadline_s=3600),
        )

    config = policy_config(CostConfig.model_validate({"maxUsdPerRun": 200}))
    (violation,) = violated(program, config)  # 4 x 55.04 x 1 = 220.16
    assert "4 x p5.48xlarge" in violation.message and "$220.16" in violation.message


def test_cost_ceiling_names_an_unpriced_instance_type() -> None:
    program = platform_program(
        job=pytorch_job_spec(instance_type="p5e.48xlarge"),
        node_group={
            "instance_types": ["p5e.48xlarge"],
            "scaling_config": {"desired_size": 2, "min_size": 0, "max_size": 2},
            "enable_efa_support": True,
        },
    )
    (violation,) = violated(program)
    assert "p5e.48xlarge" in violation.message and "usdPerInstanceHour" in violation.message


def test_launch_template_node_groups_are_priced_and_counted_once() -> None:
    """Our own launch template + aws.eks.NodeGroup (capacity blocks), and a pulumi-eks child
    node group under its ManagedNodeGroup component (as a real preview shows it)."""

    def program() -> None:
        template = aws.ec2.LaunchTemplate(
            "block-lt",
            instance_type="p4d.24xlarge",
            network_interfaces=[{"interface_type": "efa", "device_index": 0}],
        )
        aws.eks.NodeGroup(
            "block",
            cluster_name="train",
            node_role_arn=ROLE_ARN,
            subnet_ids=["subnet-1"],
            capacity_type="CAPACITY_BLOCK",
            scaling_config={"desired_size": 3, "min_size": 0, "max_size": 3},
            launch_template={"id": template.id, "version": "1"},
        )

    resources = [Resource.from_recorded(r) for r in evaluate(program, config={}).resources]
    child_of_component = Resource(
        urn="urn:child",
        type="aws:eks/nodeGroup:NodeGroup",
        name="train-gpu",
        props={"instanceTypes": ["p5.48xlarge"], "scalingConfig": {"desiredSize": 2}},
        parent_urn="urn:mng",  # its launch template (with EFA) is not modelled here
    )
    component = Resource(
        urn="urn:mng",
        type="eks:index:ManagedNodeGroup",
        name="train-gpu",
        props={
            "instanceTypes": ["p5.48xlarge"],
            "scalingConfig": {"desiredSize": 2},
            "enableEfaSupport": True,
        },
    )
    config = {COST_POLICY: {"maxUsdPerRun": 1, "maxRunHours": 1}}
    (violation,) = check_resources([*resources, component, child_of_component], config)
    # 3 x 21.957642 + 2 x 55.04 = 175.95; the child node group is not counted again
    assert "3 x p4d.24xlarge (block)" in violation.message
    assert "2 x p5.48xlarge (on-demand)" in violation.message
    assert "$175.95 per run" in violation.message


# --- settings from stack files ---------------------------------------------------------------


def test_policy_config_from_a_stack_file(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.exp.yaml"
    stack.write_text(
        "config:\n"
        "  fsdp-eks:gpuNodes: {instanceType: p5.48xlarge, count: 4, capacity: {type: spot}}\n"
        "  fsdp-eks:job: {maxRunHours: 12}\n"
        "  fsdp-eks:cost: {maxUsdPerRun: 3000, usdPerInstanceHour: 30}\n"
        "  fsdp-eks:hfToken: {secure: AAABAxyz}\n"
    )
    assert policy_config_from_stack_file(stack) == {
        COST_POLICY: {
            "maxUsdPerRun": 3000,
            "maxRunHours": 12,
            "usdPerInstanceHour": 30,
            "instanceType": "p5.48xlarge",
            "nodeCount": 4,
            "capacityType": "spot",
        }
    }
    stack.write_text("config:\n  fsdp-eks:cost: {maxUsd: 5}\n")
    with pytest.raises(ValueError, match="maxUsd"):
        policy_config_from_stack_file(stack)


# --- preview-time values ---------------------------------------------------------------------


def test_unknown_values_are_given_the_benefit_of_the_doubt() -> None:
    unknown_string = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    unknown_bool = "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7"
    resources = [
        Resource(
            "urn:repo",
            "aws:ecr/repository:Repository",
            "trainer",
            plain({"imageScanningConfiguration": {"scanOnPush": unknown_bool}}),
        ),
        Resource("urn:policy", "aws:iam/policy:Policy", "p", plain({"policy": unknown_string})),
        Resource(
            "urn:eks", "eks:index:Cluster", "c", plain({"encryptionConfigKeyArn": unknown_string})
        ),
    ]
    assert plain({"a": [unknown_string, 2.0, 2.5]}) == {"a": [UNKNOWN, 2, 2.5]}
    assert check_resources(resources) == []


# --- the policy pack itself, as the Pulumi CLI runs it ---------------------------------------


def test_the_pack_registers_every_guardrail_once() -> None:
    policies = build_policies()
    assert [p.name for p in policies] == [g.name for g in GUARDRAILS]
    assert len({p.name for p in policies}) == len(policies)
    manifest = (ROOT / "infra/policy/PulumiPolicy.yaml").read_text()
    assert "name: python" in manifest and "virtualenv: ../../.venv" in manifest


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


@pytest.fixture(scope="module")
def analyzer() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """`python infra/policy` (its __main__.py), from the repository root, as the Python language
    host starts a policy pack: it prints its port, then serves the analyzer API."""
    with served_pack({}) as stub:
        yield stub


@contextlib.contextmanager
def served_pack(env: dict[str, str]) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack's process with `env` added to this one's environment (the engine's additions)."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PULUMI_CONFIG", "PULUMI_STACK")
    }
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "infra/policy")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**environment, **env},
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().decode().strip() or "0")
        assert port, process.stderr.read().decode() if process.stderr else "no port"
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        process.kill()
        process.wait(timeout=10)


def test_the_served_pack_describes_its_policies(analyzer: Any) -> None:
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "fsdp-eks-guardrails"
    assert [p.name for p in info.policies] == [g.name for g in GUARDRAILS]
    assert all(p.enforcementLevel == analyzer_pb2.MANDATORY for p in info.policies)
    assert analyzer.GetPluginInfo(empty_pb2.Empty()) != plugin_pb2.PluginInfo()


def test_the_served_pack_rejects_a_bad_job_and_an_expensive_stack(analyzer: Any) -> None:
    job = pytorch_job_spec(env={"NCCL_ALGO": "Ring"}, deadline_s=None, args=["-m", "trainer"])
    response = analyzer.Analyze(
        analyzer_pb2.AnalyzeRequest(
            type="kubernetes:kubeflow.org/v1:PyTorchJob",
            name="train-job",
            urn="urn:pulumi:exp::fsdp-eks::kubernetes:kubeflow.org/v1:PyTorchJob::train-job",
            properties=_struct(
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": job}
            ),
        )
    )
    assert {d.policyName for d in response.diagnostics} == {
        "no-forbidden-nccl-env",
        "job-run-bound",
    }
    assert any("NCCL_ALGO='Ring'" in d.message for d in response.diagnostics)

    analyzer.Configure(
        analyzer_pb2.ConfigureAnalyzerRequest(
            policyConfig={
                COST_POLICY: analyzer_pb2.PolicyConfig(
                    enforcementLevel=analyzer_pb2.MANDATORY,
                    properties=_struct({"maxUsdPerRun": 400}),
                )
            }
        )
    )
    group_urn = "urn:pulumi:exp::fsdp-eks::eks:index:ManagedNodeGroup::train-gpu"
    stack = analyzer.AnalyzeStack(
        analyzer_pb2.AnalyzeStackRequest(
            resources=[
                analyzer_pb2.AnalyzerResource(
                    type="eks:index:ManagedNodeGroup",
                    name="train-gpu",
                    urn=group_urn,
                    properties=_struct(
                        {
                            "instanceTypes": ["p5.48xlarge"],
                            "scalingConfig": {"desiredSize": 4},
                            "enableEfaSupport": True,
                        }
                    ),
                ),
                analyzer_pb2.AnalyzerResource(
                    type="kubernetes:kubeflow.org/v1:PyTorchJob",
                    name="train-job",
                    urn="urn:pulumi:exp::fsdp-eks::kubernetes:kubeflow.org/v1:PyTorchJob::train-job",
                    properties=_struct({"spec": pytorch_job_spec(workers=4, deadline_s=7200)}),
                ),
            ]
        )
    )
    (diagnostic,) = stack.diagnostics
    assert diagnostic.policyName == COST_POLICY
    assert "4 x p5.48xlarge" in diagnostic.message and "$440.32" in diagnostic.message


# --- the experiments in stacks/, as STACK's renderer builds their jobs -----------------------

STACK_FILES = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))


def rendered_job(path: Path) -> Resource:
    from infra.config import load_stack_file
    from infra.job.manifest import render_job

    config = load_stack_file(path)
    manifest = render_job(
        plan_run(config),
        image=f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "0" * 64,
        pvc_name="fsx-claim" if config.storage.fsx.enabled else None,
    )
    return Resource(f"urn:{path.stem}", PYTORCH_JOB, manifest.name, plain(manifest.as_dict()))


def test_there_are_experiments_to_check() -> None:
    assert len(STACK_FILES) >= 6


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.stem)
def test_every_experiment_passes_the_guardrails_with_its_own_ceiling(path: Path) -> None:
    job = rendered_job(path)
    assert check_resources([job], policy_config_from_stack_file(path)) == []


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.stem)
def test_every_experiment_is_caught_when_its_ceiling_is_a_cent(path: Path) -> None:
    config = policy_config_from_stack_file(path)
    config[COST_POLICY]["maxUsdPerRun"] = 0.01
    (violation,) = check_resources([rendered_job(path)], config)
    assert (
        violation.policy == COST_POLICY
        and "exceeds fsdp-eks:cost.maxUsdPerRun" in violation.message
    )


# --- the whole program, evaluated offline for every experiment -------------------------------

_EVALUATIONS: dict[str, Any] = {}


def evaluated(path: Path) -> Any:
    """The real program (infra.program) for one stack file, evaluated once per test session."""
    if path.name not in _EVALUATIONS:
        from infra.config import read_stack_file
        from infra.program import main as program

        stack = read_stack_file(path)
        _EVALUATIONS[path.name] = evaluate(
            program, config=stack.config, secret_keys=stack.secret_keys, stack=stack.stack_name
        )
    return _EVALUATIONS[path.name]


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.stem)
def test_every_experiment_program_passes_the_guardrails(path: Path) -> None:
    violations = run_policies(evaluated(path), policy_config_from_stack_file(path))
    assert violations == []


PYTORCHJOB_STACK_FILES = [p for p in STACK_FILES if "trainjob" not in p.stem]
"""tests/infra/test_policy_trainjob.py holds the TrainJob stack's own."""


@pytest.mark.parametrize("path", PYTORCHJOB_STACK_FILES, ids=lambda p: p.stem)
def test_the_guardrails_see_the_programs_gpu_nodes_and_job(path: Path) -> None:
    """The checks recognise what the real components register (not only our test shapes)."""
    from infra.config import load_stack_file

    config = load_stack_file(path)
    resources = [Resource.from_recorded(r) for r in evaluated(path).resources]
    groups = gpu_node_groups(resources)
    if config.cluster.mode == "create":
        (group,) = groups
        assert (group.instance_type, group.count) == (
            config.gpu_nodes.instance_type,
            config.gpu_nodes.count,
        )
        assert group.efa_enabled is config.gpu_nodes.efa_enabled
    else:
        assert groups == []
    (job,) = [r for r in resources if r.type == PYTORCH_JOB]
    # Remove the EFA request and the deadline: multi-node EFA stacks must now fail.
    spec = json.loads(json.dumps(job.props["spec"]))
    spec["runPolicy"].pop("activeDeadlineSeconds", None)
    for replica in spec["pytorchReplicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            for section in container["resources"].values():
                section.pop("vpc.amazonaws.com/efa", None)
            container["args"] = [a for a in container["args"] if "max_steps" not in a]
    tampered = Resource(job.urn, job.type, job.name, {**job.props, "spec": spec})
    others = [r for r in resources if r.urn != job.urn]
    found = {v.policy for v in check_resources([*others, tampered], GENEROUS)}
    needs_efa = config.gpu_nodes.count > 1 and config.gpu_nodes.efa_interface_count > 0
    assert "job-run-bound" in found
    assert ("efa-on-efa-instances" in found) is needs_efa


# --- `pulumi preview --policy-pack infra/policy`, exactly as the README runs it ----------------


def engine_environment(path: Path) -> dict[str, str]:
    """What the engine adds to the pack's environment for this stack (no --policy-pack-config):
    PULUMI_CONFIG maps `namespace:key` to a string, object values JSON-encoded, secrets
    decrypted (pulumi `analyzer_plugin.go` constructEnv/constructConfig, `PropertyMapToConfig`);
    PULUMI_STACK names the stack. A gated stack's token is the one its deployer has set."""
    from infra.config import read_stack_file

    stack = read_stack_file(path)
    config = {
        key if ":" in key else f"fsdp-eks:{key}": value
        if isinstance(value, str)
        else json.dumps(value)
        for key, value in stack.config.items()
    }
    return {"PULUMI_CONFIG": json.dumps(config), "PULUMI_STACK": stack.stack_name}


def _as_wire_asset(value: Any) -> dict[str, Any]:
    """An asset or archive input as the engine's wire format marks it (pulumi `runtime/rpc.py`
    special signature keys); the guardrails never read them."""
    if isinstance(value, pulumi.Archive):
        return {rpc._special_sig_key: rpc._special_archive_sig}
    if isinstance(value, pulumi.Asset):
        return {rpc._special_sig_key: rpc._special_asset_sig, "path": getattr(value, "path", "")}
    raise TypeError(f"{type(value).__name__} in recorded inputs")


def _analyzer_resources(path: Path) -> list[analyzer_pb2.AnalyzerResource]:
    return [
        analyzer_pb2.AnalyzerResource(
            type=r.type,
            name=r.name,
            urn=r.urn,
            properties=_struct(json.loads(json.dumps(r.inputs, default=_as_wire_asset))),
            parent=r.parent or "",
            dependencies=list(r.dependencies),
        )
        for r in evaluated(path).resources
    ]


def _configure_without_a_config_file(stub: Any) -> None:
    """What the engine sends without --policy-pack-config: each policy's enforcement level and
    no properties (pulumi `pkg/engine/update.go` installAndLoadPolicyPlugins ->
    ReconcilePolicyPackConfig(policies, initialConfig, nil) -> Configure)."""
    stub.Configure(
        analyzer_pb2.ConfigureAnalyzerRequest(
            policyConfig={
                g.name: analyzer_pb2.PolicyConfig(enforcementLevel=analyzer_pb2.MANDATORY)
                for g in GUARDRAILS
            }
        )
    )


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.stem)
def test_the_pack_as_the_readme_runs_it_passes_every_experiment(path: Path) -> None:
    """`pulumi preview --policy-pack infra/policy` with no config file: the served pack reads
    the stack's own ceiling from the engine's PULUMI_CONFIG. (It used to fall back to the $100
    default and fail every stack whose run costs more.)"""
    resources = _analyzer_resources(path)
    with served_pack(engine_environment(path)) as stub:
        _configure_without_a_config_file(stub)
        diagnostics = [
            d
            for r in resources
            for d in stub.Analyze(
                analyzer_pb2.AnalyzeRequest(
                    type=r.type, name=r.name, urn=r.urn, properties=r.properties
                )
            ).diagnostics
        ]
        stack = stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources))
    assert [d.message for d in [*diagnostics, *stack.diagnostics]] == []


def test_the_pack_holds_the_stack_to_its_own_ceiling_and_a_config_file_still_wins() -> None:
    path = ROOT / "stacks/Pulumi.llama31-8b-p5.yaml"  # 4 x p5 x 12 h = $2,641.92, ceiling $3,000
    env = engine_environment(path)
    config = json.loads(env["PULUMI_CONFIG"])
    config["fsdp-eks:cost"] = json.dumps({"maxUsdPerRun": 2000})
    resources = _analyzer_resources(path)
    with served_pack({**env, "PULUMI_CONFIG": json.dumps(config)}) as stub:
        _configure_without_a_config_file(stub)
        request = analyzer_pb2.AnalyzeStackRequest(resources=resources)
        diagnostics = list(stub.AnalyzeStack(request).diagnostics)
        (diagnostic,) = diagnostics
        assert diagnostic.policyName == COST_POLICY
        assert "$2,641.92" in diagnostic.message and "$2,000.00" in diagnostic.message
        stub.Configure(
            analyzer_pb2.ConfigureAnalyzerRequest(
                policyConfig={
                    COST_POLICY: analyzer_pb2.PolicyConfig(
                        enforcementLevel=analyzer_pb2.MANDATORY,
                        properties=_struct({"maxUsdPerRun": 5000}),
                    )
                }
            )
        )
        assert list(stub.AnalyzeStack(request).diagnostics) == []


def test_policy_config_from_the_engine_environment() -> None:
    path = ROOT / "stacks/Pulumi.mixtral-8x7b-p5.yaml"
    assert policy_config_from_engine(engine_environment(path)) == policy_config_from_stack_file(
        path
    )
    assert policy_config_from_engine({}) == {}  # e.g. `pulumi policy publish`: no stack
    bad = {"PULUMI_STACK": "x", "PULUMI_CONFIG": json.dumps({"fsdp-eks:cost": '{"maxUsd": 1}'})}
    with pytest.raises(ValueError, match=r"cost\.maxUsd: Extra inputs are not permitted"):
        policy_config_from_engine(bad)
