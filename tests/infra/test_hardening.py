"""Hardened by default: what the rendered objects grant, and what they do not.

Each test pins one finding of the security review to the rendered value that fixes it: the
training operator's pod and RBAC, the trainer pod's security contexts, the HF token as a file,
the NetworkPolicy for shared clusters. The scanners that read the same objects with the
field's tools (kubernetes-validate, checkov) are in tests/infra/test_manifest_scanners.py.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.config import StackConfigError, read_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.manifest import (
    HF_TOKEN_FILE_MODE,
    HF_TOKEN_PATH,
    JOB_NAME_LABEL,
    PREPARE_CONTAINER_NAME,
    TRAINER_USER_ID,
    network_policy,
    render_job,
)
from infra.offline import Evaluation, RecordedResource
from infra.platform.training_operator import OPERATOR_USER_ID, WEBHOOK_CONFIGURATION, WEBHOOK_SECRET
from tests.infra.test_addons import run as run_addons
from tests.infra.test_cluster import build as build_cluster
from tests.infra.test_job import IMAGE, make_config
from tests.infra.test_stacks import STACKS, stack

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def operator() -> Evaluation:
    return run_addons()


def operator_pod(result: Evaluation) -> dict[str, Any]:
    return result.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]


# --- training operator ------------------------------------------------------------------


def test_operator_runs_as_a_non_root_uid_on_a_read_only_root_without_capabilities(
    operator: Evaluation,
) -> None:
    """The v1.9.0 image (distroless/static:latest) runs as root unless told otherwise; the
    operator writes only through the API, so its root filesystem can be read-only."""
    pod = operator_pod(operator)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == OPERATOR_USER_ID != 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_operator_reads_its_webhook_key_through_its_group_only(operator: Evaluation) -> None:
    """The cert volume holds the webhook's private key: 0440 with the operator's gid as
    fsGroup, not the world-readable 0644 of upstream's manifest."""
    pod = operator_pod(operator)
    [cert] = [v for v in pod["volumes"] if v["name"] == "cert"]
    assert cert["secret"]["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == OPERATOR_USER_ID
    [mount] = pod["containers"][0]["volumeMounts"]
    assert mount["readOnly"] is True


def _rules(resource: RecordedResource) -> list[dict[str, Any]]:
    return list(resource.inputs["rules"])


def test_operator_updates_only_its_own_webhook_configuration(operator: Evaluation) -> None:
    rules = [
        r
        for r in _rules(operator.one(CLUSTER_ROLE))
        if "validatingwebhookconfigurations" in r["resources"]
    ]
    writes = [r for r in rules if set(r["verbs"]) - {"get", "list", "watch"}]
    assert writes == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [WEBHOOK_CONFIGURATION],
            "verbs": ["update"],
        }
    ]
    # The rotator's informer still lists and watches them all (cert-controller v0.12.0).
    assert any({"get", "list", "watch"} <= set(r["verbs"]) for r in rules)


def test_operator_reads_no_secret_outside_its_namespace_and_execs_into_no_pod(
    operator: Evaluation,
) -> None:
    cluster_resources = {res for r in _rules(operator.one(CLUSTER_ROLE)) for res in r["resources"]}
    assert "secrets" not in cluster_resources
    # MPIJob-only rights (kubeflow/trainer v1.9.0 mpijob_controller.go markers) are gone.
    assert not cluster_resources & {"pods/exec", "configmaps", "serviceaccounts", "roles"}
    role = operator.one(ROLE)
    assert role.inputs["metadata"]["namespace"] == "kubeflow"
    secret_writes = [r for r in _rules(role) if "update" in r["verbs"]]
    assert secret_writes == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [WEBHOOK_SECRET],
            "verbs": ["update"],
        }
    ]
    binding = operator.one(ROLE_BINDING)
    assert binding.inputs["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role.inputs["metadata"]["name"],
    }
    # The Deployment starts only once its certificate rights exist.
    assert operator.depends_on(operator.one(DEPLOYMENT), binding)


def test_operator_image_can_be_pinned_by_digest() -> None:
    image = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/kubeflow/training-operator@{DIGEST}"
    result = run_addons({"trainingOperator": {"image": image}})
    assert operator_pod(result)["containers"][0]["image"] == image


@pytest.mark.parametrize(
    "image", ["kubeflow/training-operator", "kubeflow/training-operator:latest", "x@sha256:12ab"]
)
def test_an_unpinned_operator_image_is_refused_naming_the_key(image: str) -> None:
    with pytest.raises(StackConfigError) as error:
        make_config(addons={"trainingOperator": {"image": image}})
    message = str(error.value)
    assert "addons.trainingOperator.image" in message and image in message
    assert "@sha256:" in message


def test_operator_pods_take_connections_only_on_the_webhook_and_probe_ports(
    operator: Evaluation,
) -> None:
    policy = operator.one(NETWORK_POLICY).inputs
    pod_labels = operator_pod_labels(operator)
    assert policy["metadata"]["namespace"] == "kubeflow"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    [rule] = policy["spec"]["ingress"]
    assert "from" not in rule  # the API server calls the webhook from no pod
    assert sorted(p["port"] for p in rule["ports"]) == [8081, 9443]  # not metrics (8080)


def operator_pod_labels(result: Evaluation) -> dict[str, str]:
    return dict(result.one(DEPLOYMENT).inputs["spec"]["template"]["metadata"]["labels"])


def test_a_tag_pinned_operator_image_is_pulled_at_every_start(operator: Evaluation) -> None:
    """A tag can be re-pushed; with a digest a cached copy is the right one."""
    assert operator_pod(operator)["containers"][0]["imagePullPolicy"] == "Always"
    image = f"example.com/training-operator@{DIGEST}"
    pinned = run_addons({"trainingOperator": {"image": image}})
    assert operator_pod(pinned)["containers"][0]["imagePullPolicy"] == "IfNotPresent"


# --- trainer pods -----------------------------------------------------------------------


def job_pod(**kwargs: Any) -> dict[str, Any]:
    manifest = render_job(
        plan_run(make_config()), image=IMAGE, pvc_name="fsx-claim", **kwargs
    ).as_dict()
    return manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def test_trainer_runs_as_the_uid_its_directories_were_prepared_for() -> None:
    """Set in the pod, so an image.uri base that runs as root (NGC, DLC) runs the job as 10001
    too, the uid the init container chowns for; the project's Dockerfile USER agrees."""
    pod = job_pod()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == TRAINER_USER_ID
    [trainer] = pod["containers"]
    context = trainer["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (TRAINER_USER_ID, TRAINER_USER_ID)
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    dockerfile = (Path(__file__).resolve().parents[2] / "docker/Dockerfile").read_text()
    assert f"USER {TRAINER_USER_ID}:{TRAINER_USER_ID}" in dockerfile
    assert f"--uid {TRAINER_USER_ID}" in dockerfile


def test_the_chown_init_container_keeps_only_the_capabilities_chown_needs() -> None:
    [prepare] = job_pod()["initContainers"]
    assert prepare["name"] == PREPARE_CONTAINER_NAME
    context = prepare["securityContext"]
    assert context["runAsUser"] == 0  # a fresh FSx file system is root's
    assert context["runAsNonRoot"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"],
    }


def test_every_container_of_the_job_runs_under_runtime_default_seccomp() -> None:
    """containerd's default profile (contrib/seccomp/seccomp_default.go) blocks the NUMA
    memory-policy calls without CAP_SYS_NICE; nothing in the job needs them (see
    infra.job.manifest.SECCOMP_PROFILE), so the job does not run Unconfined."""
    pod = job_pod()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "SYS_NICE" not in container["securityContext"]["capabilities"].get("add", [])


def test_no_service_account_token_in_a_pod_that_calls_no_api() -> None:
    assert job_pod()["automountServiceAccountToken"] is False
    # A pod given its own account for S3 does not need it either: the Pod Identity webhook
    # projects a token of its own audience (aws/amazon-eks-pod-identity-webhook v0.6.17
    # `pkg/handler/handler.go`, which never reads automountServiceAccountToken).
    assert job_pod(service_account_name="trainer")["automountServiceAccountToken"] is False


def test_the_hf_token_is_a_read_only_file_only_the_trainer_can_read() -> None:
    pod = job_pod(hf_secret_name="exp-hf-token")
    for container in [*pod["initContainers"], *pod["containers"]]:
        for env in container.get("env", []):
            assert "secretKeyRef" not in env.get("valueFrom", {}), env
    [trainer] = pod["containers"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert "HF_TOKEN" not in env and env["HF_TOKEN_PATH"] == HF_TOKEN_PATH
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "exp-hf-token"
    [item] = volume["secret"]["items"]
    [mount] = [m for m in trainer["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert f"{mount['mountPath']}/{item['path']}" == HF_TOKEN_PATH
    # kubelet leaves the file root-owned, gives it the pod's fsGroup and ORs in group read
    # (kubernetes pkg/volume/volume_linux.go SetVolumeOwnership, roMask 0440): the trainer
    # reads it through its gid = fsGroup, and no other uid can.
    mode = volume["secret"]["defaultMode"]
    assert mode == HF_TOKEN_FILE_MODE
    effective = mode | 0o440
    assert effective & (stat.S_IRWXO | stat.S_IWGRP | stat.S_IXGRP | stat.S_IWUSR) == 0
    assert pod["securityContext"]["fsGroup"] == trainer["securityContext"]["runAsGroup"]
    # The init container never sees it.
    [prepare] = pod["initContainers"]
    assert volume["name"] not in {m["name"] for m in prepare["volumeMounts"]}


def test_huggingface_hub_reads_the_token_from_hf_token_path(tmp_path: Path) -> None:
    """The library the trainer uses must take the token from the file the pod mounts
    (huggingface_hub `constants.HF_TOKEN_PATH`, `utils/_auth.py` `_get_token_from_file`)."""
    token_file = tmp_path / "token"
    token_file.write_text("hf_fromfile\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_TOKEN_PATH=str(token_file), HF_HOME=str(tmp_path / "home"))
    code = "import huggingface_hub; print(huggingface_hub.get_token())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "hf_fromfile"


# --- shared clusters --------------------------------------------------------------------


def test_network_policy_admits_only_the_jobs_own_pods() -> None:
    policy = network_policy("exp", "training")
    selector = {"matchLabels": {JOB_NAME_LABEL: "exp"}}
    assert JOB_NAME_LABEL == "training.kubeflow.org/job-name"  # the v1.9 operator's label
    assert policy["spec"] == {
        "podSelector": selector,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": selector}]}],
    }


@pytest.mark.parametrize("name", ["team-cluster", "llama31-8b-p5"])
def test_network_policy_is_registered_before_the_job_on_existing_and_created_clusters(
    name: str,
) -> None:
    config, result = stack(name)
    policy = result.one(NETWORK_POLICY, "job-network-policy")
    job = result.one(PYTORCHJOB)
    assert policy.inputs["metadata"]["namespace"] == job.inputs["metadata"]["namespace"]
    labels = policy.inputs["spec"]["podSelector"]["matchLabels"]
    assert labels == {JOB_NAME_LABEL: config.job.name}
    assert result.depends_on(job, policy)


# --- the EKS API endpoint ---------------------------------------------------------------

EKS_CLUSTER = "eks:index:Cluster"


def test_a_created_cluster_has_no_public_endpoint_unless_the_stack_names_its_networks() -> None:
    """EKS opens a public endpoint to 0.0.0.0/0 unless told otherwise; terraform-aws-eks
    (variables.tf `endpoint_public_access`, default false) keeps it private. So does the stack,
    and says so before `up` reaches the point where a private endpoint would stop it."""
    built = build_cluster({"name": "train"})
    cluster = built.one(EKS_CLUSTER).inputs
    assert cluster["endpointPublicAccess"] is False
    assert cluster["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in cluster
    assert any("cluster.publicAccessCidrs is not set" in w for w in built.warnings)


def test_listed_networks_alone_reach_a_public_endpoint() -> None:
    office = ["203.0.113.0/24"]
    cluster = build_cluster({"name": "train", "publicAccessCidrs": office}).one(EKS_CLUSTER)
    assert cluster.inputs["endpointPublicAccess"] is True
    assert cluster.inputs["publicAccessCidrs"] == office


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"endpointPublicAccess": True}, "cluster.publicAccessCidrs is not set"),
        (
            {"endpointPublicAccess": False, "publicAccessCidrs": ["203.0.113.0/24"]},
            "cluster.publicAccessCidrs is set but cluster.endpointPublicAccess is false",
        ),
    ],
)
def test_a_public_endpoint_without_networks_is_refused_naming_the_keys(
    cluster: dict[str, Any], message: str
) -> None:
    with pytest.raises(StackConfigError, match=re.escape(message)):
        make_config(cluster=cluster)


CREATING_STACKS = [
    name
    for name in STACKS
    if read_stack_file(name).config.get("fsdp-eks:cluster", {}).get("mode", "create") == "create"
]


@pytest.mark.parametrize("name", CREATING_STACKS)
def test_every_shipped_stack_that_creates_a_cluster_says_who_reaches_its_endpoint(
    name: str,
) -> None:
    config, result = stack(name)
    # Written in the stack file, not implied: EKS's implicit default is 0.0.0.0/0.
    written = read_stack_file(name).config.get("fsdp-eks:cluster", {})
    assert written.get("publicAccessCidrs") == config.cluster.public_access_cidrs, name
    cluster = result.one(EKS_CLUSTER).inputs
    assert cluster["publicAccessCidrs"] == config.cluster.public_access_cidrs
