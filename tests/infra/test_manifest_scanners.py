"""The scanners operators run on clusters and repositories, run on what this project ships.

Every stack's objects and cluster checks, validated strictly against the cluster version's
OpenAPI schemas (`kubernetes-validate`), scanned with `checkov` (failures only through
`ALLOWED`), and the Helm values checked against each pinned chart's keys.
What runs, and how: docs/design/tests.md#test_manifest_scanners
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import VersionNotSupportedError  # type: ignore[import-untyped]

from infra.config import StackConfig
from infra.estimates.run_plan import plan_run
from infra.facts.exporter_metrics import DCGM_EXPORTER_CHART_VERSION
from infra.job.cluster_checks import validation_manifests
from infra.job.grafana import GRAFANA_CHART, GRAFANA_CHART_VERSION
from infra.job.manifest import CONTAINER_NAME
from infra.offline import Evaluation
from infra.platform.addons import EFA_CHART, NVIDIA_CHART
from infra.platform.autoscaler import CHART as AUTOSCALER_CHART
from infra.platform.kueue import CHART as KUEUE_CHART
from infra.platform.kueue import CHART_VERSION as KUEUE_CHART_VERSION
from infra.platform.observability import DCGM_CHART
from scripts.dev import VENV
from tests.infra.test_stacks import STACKS, stack

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKOV = VENV / "checkov/bin/checkov"
PYTORCHJOB_KIND = "PyTorchJob"
TRAINER_V2_KINDS = ("TrainJob", "TrainingRuntime")
"""Kubeflow Trainer v2's kinds (a `job.api: trainjob` stack's): their CRD schemas are checked
in tests/infra/test_trainjob_stack.py, their node 0 Pod here (`node_pod`)."""
CUSTOM_KINDS = (PYTORCHJOB_KIND, *TRAINER_V2_KINDS)
"""Left out of the checkov tree: their pods are scanned as the pods they make."""
CRD_GROUPS = {
    "kubeflow.org": "tests/infra/test_stacks.py (the PyTorchJob CRD)",
    "trainer.kubeflow.org": "tests/infra/test_trainjob_stack.py (Trainer v2.3.0's CRDs)",
    "kueue.x-k8s.io": "tests/infra/test_kueue.py (Kueue v0.19.2's CRDs)",
}
"""API groups kubernetes-validate has no schema for, and the test that validates them."""
OPERATOR_LABEL_PREFIX = "training.kubeflow.org/"
"""Labels training operator v1.9 sets on the pods it creates (kubeflow/trainer v1.9.0
`pkg/apis/kubeflow.org/v1/common_types.go`: job-name, operator-name, replica-type/-index)."""
CHECK_IMAGE = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp-eks-trainer@sha256:{'0' * 64}"
"""The check pods' image as `fsdp-eks validate` resolves it: the stack's digest-pinned image."""
NCCL_BENCH = REPO_ROOT / "infra/job/payloads/nccl_allreduce.py"
_SECRET_SIGNATURE = "4dabf18193072939515e22adb298388d"
"""How the Pulumi SDK marks a secret value in serialized inputs (pulumi `rpc.py`)."""


@dataclass(frozen=True)
class Allowed:
    """A checkov finding accepted on purpose: where it may fire, and why."""

    resources: str
    """Regular expression over checkov's resource id (`Kind.namespace.name`, Dockerfile path)."""
    reason: str


ALLOWED: dict[str, Allowed] = {
    # --- the trainer's worker pods: GPU batch work (infra/job/manifest.py) -----------------
    "CKV_K8S_8": Allowed(
        r"^(Pod\..*-(worker-0|node-0-0)|Job\..*-gpu-check)$",
        "No liveness probe: a training step can legitimately take minutes (a checkpoint save, "
        "a first compile) and a restart throws the step away; hangs are caught by the "
        "trainer's step heartbeat watchdog and NCCL's collective timeout instead. The NCCL "
        "check's workers (`<run>-nccl-worker-0`) and the gpu-check run to completion under "
        "activeDeadlineSeconds (infra/job/cluster_checks.py).",
    ),
    "CKV_K8S_9": Allowed(
        r"^(Pod\..*-(worker-0|node-0-0)|Job\..*-gpu-check)$",
        "No readiness probe: workers serve no traffic through a Service a probe would gate; "
        "peers reach worker 0's store by rendezvous, retrying until it listens. The "
        "gpu-check serves nothing at all.",
    ),
    "CKV_K8S_11": Allowed(
        r"^Pod\..*-(worker-0|node-0-0)$",
        "No CPU limit: the worker (and the NCCL check's) is sized to its whole node "
        "(infra/job/manifest.py container_resources); a CFS quota would only throttle data "
        "loading and NCCL proxies.",
    ),
    "CKV_K8S_25": Allowed(
        r"^Pod\..*-(worker-0|node-0-0)$",
        "The init container that creates and chowns the run's directories on FSx (a fresh "
        "file system is root's) runs as root with CHOWN, DAC_OVERRIDE and FOWNER, nothing "
        "else (infra/job/manifest.py PREPARE_CAPABILITIES).",
    ),
    "CKV_K8S_22": Allowed(
        r"^Pod\..*-(worker-0|node-0-0)$",
        "The trainer's root filesystem stays writable for the Triton/Inductor kernel caches "
        "and the HF cache under /tmp (infra/job/manifest.py trainer_security_context).",
    ),
    # --- the cluster checks (infra/job/cluster_checks.py) ---------------------------------
    "CKV_K8S_23": Allowed(
        r"^Job\..*-gpu-check$",
        "With the stack's FSx claim mounted, the gpu-check's probe writes at the volume's "
        "root, which on a new file system is root's (0755): it runs as root, with every "
        "capability dropped (the owner needs none to write its own directory), no privilege "
        "escalation, a read-only root filesystem and RuntimeDefault seccomp "
        "(_gpu_check_security_context); without a claim it runs as the trainer's uid.",
    ),
    "CKV_K8S_40": Allowed(
        r"^Job\..*-gpu-check$",
        "The same root probe as CKV_K8S_23: uid 0 only with the FSx claim mounted.",
    ),
    # --- the training operator and the EFA exporter (infra/platform/observability_manifests.py)
    "CKV_K8S_43": Allowed(
        r"^(Deployment\.kubeflow\.training-operator|DaemonSet\..*-metrics\.efa-exporter)$",
        "The v1.9.4 operator image and node_exporter v1.12.1 are pinned by tag: no digest "
        "for either is published or could be verified from where this was written (no "
        "registry access; infra/config/addons.py, infra/facts/exporter_metrics.py); "
        "addons.trainingOperator.image takes an `@sha256:` pin, with which this check passes.",
    ),
    "CKV_K8S_38": Allowed(
        r"^Deployment\.kubeflow\.training-operator$",
        "The operator is a controller: it calls the Kubernetes API, so its pod needs its "
        "service-account token.",
    ),
    "CKV_K8S_155": Allowed(
        r"^ClusterRole\.default\.training-operator$",
        "`update` on validatingwebhookconfigurations is bound by resourceNames to the "
        "operator's own configuration (test_hardening.py); checkov's RBAC checks ignore "
        "resourceNames (checkov 3.3.30 kubernetes/checks/resource/base_rbac_check.py "
        "rule_can), and the right cannot go: the operator's certificate rotator Updates that "
        "configuration's caBundle on every reconcile (open-policy-agent/cert-controller "
        "v0.16.0, used by v1.9.4, pkg/rotator/rotator.go ReconcileWH.ensureCerts), and the "
        "operator has no switch to turn the rotator off (cmd/training-operator.v1/main.go).",
    ),
    # --- docker/Dockerfile -----------------------------------------------------------------
    "CKV_DOCKER_7": Allowed(
        r"Dockerfile",
        "`FROM ${UV_IMAGE}` / `FROM ${BASE_IMAGE}`: ARGs whose defaults are exact tags (the "
        "build passes the configured base); checkov reads the unexpanded literal.",
    ),
}


@dataclass(frozen=True)
class StackObjects:
    name: str
    config: StackConfig
    manifests: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    """The cluster checks `fsdp-eks validate` submits for the stack, plus the NCCL check's
    worker Pod."""


def _plain(value: Any) -> Any:
    """Inputs as the engine would send them to the API server: secrets unwrapped, and the
    protobuf Struct's floats back to integers where they are whole (ports, modes, replicas)."""
    if isinstance(value, dict):
        if _SECRET_SIGNATURE in value:
            return _plain(value.get("value"))
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def worker_pod(job: dict[str, Any]) -> dict[str, Any]:
    """Worker 0's Pod as training operator v1.9 creates it: the template plus the labels the
    operator adds (kubeflow/trainer v1.9.0 `job_controller.go` GenLabels, `pod.go`)."""
    name = job["metadata"]["name"]
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    labels = {
        **template.get("metadata", {}).get("labels", {}),
        f"{OPERATOR_LABEL_PREFIX}job-name": name,
        f"{OPERATOR_LABEL_PREFIX}operator-name": "pytorchjob-controller",
        f"{OPERATOR_LABEL_PREFIX}replica-type": "worker",
        f"{OPERATOR_LABEL_PREFIX}replica-index": "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-worker-0",
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
        },
        "spec": template["spec"],
    }


def node_pods(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Node 0's Pod of each TrainJob among `manifests`, as JobSet 0.12.0 and the Job controller
    create it from the TrainingRuntime's template: named after its hostname
    (`<jobset>-node-0-0`; the real name adds a random suffix), JobSet's labels added."""
    runtimes = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "TrainingRuntime"}
    pods = []
    for job in (m for m in manifests if m["kind"] == "TrainJob"):
        name = job["metadata"]["name"]
        runtime = runtimes[job["spec"]["runtimeRef"]["name"]]
        [replicated] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        template = replicated["template"]["spec"]["template"]
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
            "batch.kubernetes.io/job-completion-index": "0",
        }
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{replicated['name']}-0-0",
                    "namespace": job["metadata"]["namespace"],
                    "labels": labels,
                },
                "spec": template["spec"],
            }
        )
    return pods


def kubernetes_objects(result: Evaluation) -> list[dict[str, Any]]:
    """Every Kubernetes object the program registers whole (not Helm releases or remote YAML),
    plus each PyTorchJob's worker Pod."""
    objects: list[dict[str, Any]] = []
    for resource in result.resources:
        inputs = resource.inputs
        if not resource.type.startswith("kubernetes:") or "kind" not in inputs:
            continue
        manifest = _plain(inputs)
        objects.append(manifest)
        if manifest["kind"] == PYTORCHJOB_KIND:
            objects.append(worker_pod(manifest))
    return [*objects, *node_pods(objects)]


def cluster_check_objects(name: str, config: StackConfig) -> list[dict[str, Any]]:
    """What `fsdp-eks validate <stack>` applies (scripts/cli/validate.py), plus the NCCL
    PyTorchJob's worker Pod."""
    checks = validation_manifests(
        plan_run(config),
        image=CHECK_IMAGE,
        run_id="validate-0",
        bench_script=NCCL_BENCH.read_text(),
        claim_name=config.storage.claim_name(name),
    )
    return [
        *checks,
        *(worker_pod(m) for m in checks if m["kind"] == PYTORCHJOB_KIND),
        *node_pods(checks),
    ]


@pytest.fixture(scope="module")
def rendered() -> list[StackObjects]:
    out = []
    for name in STACKS:
        config, result = stack(name)
        out.append(
            StackObjects(
                name, config, kubernetes_objects(result), cluster_check_objects(name, config)
            )
        )
    return out


# --- kubernetes-validate -----------------------------------------------------------------


def _schema_version(config: StackConfig) -> str:
    """The cluster's Kubernetes minor version (the model's default for an existing cluster,
    whose version the offline evaluation cannot read)."""
    return config.cluster.kubernetes_version


def test_every_object_is_valid_for_its_cluster_version_in_strict_mode(
    rendered: list[StackObjects],
) -> None:
    problems = []
    checked = 0
    for objects in rendered:
        version = _schema_version(objects.config)
        for manifest in [*objects.manifests, *objects.checks]:
            if manifest["apiVersion"].split("/")[0] in CRD_GROUPS:
                continue  # checked against its pinned CRD schema where CRD_GROUPS says
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
                checked += 1
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                problems.append(
                    f"{objects.name}: {manifest['kind']} {manifest['metadata'].get('name')}: "
                    f"{path}: {error.message}"
                )
            except (kubernetes_validate.SchemaNotFoundError, VersionNotSupportedError) as error:
                problems.append(f"{objects.name}: {manifest['kind']}: {error.message}")
    assert not problems, "\n".join(problems)
    assert checked >= 6 * len(rendered) - 6  # every stack renders namespaces, RBAC, pods...


def careless_pod(**security_context: Any) -> dict[str, Any]:
    """A pod that runs as root, for the checks' negative controls."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "careless", "namespace": "training"},
        "spec": {
            "securityContext": security_context,
            "containers": [{"name": "c", "image": "busybox:1.37", "command": ["true"]}],
        },
    }


def test_strict_validation_rejects_a_field_kubernetes_does_not_know(
    rendered: list[StackObjects],
) -> None:
    """The check above can fail: a misspelt securityContext field is an error in strict mode
    (the API server would drop it silently and the pod would run without it)."""
    broken = careless_pod(runAsNonroot=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="runAsNonroot"):
        kubernetes_validate.validate(broken, _schema_version(rendered[0].config), strict=True)


# --- checkov -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    check_type: str
    check_id: str
    resource: str
    name: str

    def __str__(self) -> str:
        return f"{self.check_type} {self.check_id} {self.resource}: {self.name}"


def run_checkov(root: Path) -> list[Finding]:
    """checkov on `root` with the three frameworks, offline; its failed checks."""
    if not CHECKOV.exists():
        pytest.skip(f"{CHECKOV} is missing: `python3 scripts/dev.py test` installs checkov")
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    command = [
        str(CHECKOV),
        "--directory",
        str(root),
        "--framework",
        "kubernetes",
        "dockerfile",
        "github_actions",
        "--skip-download",
        "--quiet",
        "--compact",
        "--output",
        "json",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    # Exit status 1 means "failed checks found"; anything else is checkov itself failing.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    reports = json.loads(done.stdout)
    findings = []
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        for failed in report["results"]["failed_checks"]:
            findings.append(
                Finding(
                    report["check_type"],
                    failed["check_id"],
                    failed["resource"],
                    failed["check_name"],
                )
            )
    return findings


def _write_scan_tree(root: Path, rendered: list[StackObjects]) -> None:
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    for objects in rendered:
        documents = [m for m in objects.manifests if m["kind"] not in CUSTOM_KINDS]
        (manifests / f"{objects.name}.yaml").write_text(yaml.safe_dump_all(documents))
        checks = [m for m in objects.checks if m["kind"] not in CUSTOM_KINDS]
        (manifests / f"{objects.name}-checks.yaml").write_text(yaml.safe_dump_all(checks))
    shutil.copytree(REPO_ROOT / ".github/workflows", root / ".github/workflows")
    (root / "docker").mkdir()
    shutil.copy(REPO_ROOT / "docker/Dockerfile", root / "docker/Dockerfile")


@pytest.fixture(scope="module")
def checkov_findings(
    rendered: list[StackObjects], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Finding]]:
    root = tmp_path_factory.mktemp("scan")
    _write_scan_tree(root, rendered)
    yield run_checkov(root)  # its time: the suite's figures (docs/benchmarks.md), not a test


def _accepted(finding: Finding) -> bool:
    allowed = ALLOWED.get(finding.check_id)
    return allowed is not None and re.search(allowed.resources, finding.resource) is not None


def test_checkov_finds_nothing_outside_the_allow_list(checkov_findings: list[Finding]) -> None:
    unexpected = [str(f) for f in checkov_findings if not _accepted(f)]
    assert not unexpected, "fix these, or accept one in ALLOWED with its reason:\n" + "\n".join(
        unexpected
    )


def test_every_allow_list_entry_still_fires(checkov_findings: list[Finding]) -> None:
    fired = {f.check_id for f in checkov_findings if _accepted(f)}
    stale = sorted(set(ALLOWED) - fired)
    assert not stale, f"no longer needed, remove from ALLOWED: {stale}"


def test_checkov_scanned_every_stack_and_the_trainer_pods(
    checkov_findings: list[Finding], rendered: list[StackObjects]
) -> None:
    """The allow-list is scoped to worker Pods and the gpu-check Job: each stack's, the
    training job's and the checks', must be among those scanned."""
    scanned = {f.resource for f in checkov_findings}
    for objects in rendered:
        for manifests in (objects.manifests, objects.checks):
            [job] = [m for m in manifests if m["kind"] in (PYTORCHJOB_KIND, "TrainJob")]
            namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
            trainjob = job["kind"] == "TrainJob"
            pod_name = f"{name}-node-0-0" if trainjob else f"{name}-worker-0"
            assert f"Pod.{namespace}.{pod_name}" in scanned
            [pod] = [m for m in manifests if m["kind"] == "Pod"]
            container = "node" if trainjob else CONTAINER_NAME
            assert [c["name"] for c in pod["spec"]["containers"]] == [container]
        [gpu_check] = [m for m in objects.checks if m["kind"] == "Job"]
        namespace, name = gpu_check["metadata"]["namespace"], gpu_check["metadata"]["name"]
        assert f"Job.{namespace}.{name}" in scanned


def test_a_root_container_outside_the_allow_list_is_reported(tmp_path: Path) -> None:
    """The scan can fail: a pod that runs as root with privilege escalation is found."""
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests/careless.yaml").write_text(yaml.safe_dump(careless_pod(runAsUser=0)))
    found = {f.check_id for f in run_checkov(tmp_path) if not _accepted(f)}
    assert {"CKV_K8S_20", "CKV_K8S_23"} <= found  # privilege escalation, root


# --- Helm values against the pinned charts -----------------------------------------------

CHART_VALUE_KEYS: dict[tuple[str, str], frozenset[str]] = {
    # Top-level keys of charts/kubeflow-trainer/values.yaml at kubeflow/trainer tag v2.3.0
    # (commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab); `jobset` is the values of its JobSet
    # 0.12.0 dependency (kubernetes-sigs/jobset v0.12.0 charts/jobset/values.yaml: controller.
    # nodeSelector), read 2026-11-27.
    ("oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.3.0"): frozenset(
        {
            "nameOverride",
            "fullnameOverride",
            "crds",
            "jobset",
            "commonLabels",
            "image",
            "manager",
            "webhook",
            "dataCache",
            "runtimes",
        }
    ),
    # Top-level keys of deployments/helm/nvidia-device-plugin/values.yaml at NVIDIA/
    # k8s-device-plugin tag v0.18.2 (commit fb1242add205d8563f9c604b8ba239607b4083e6),
    # read 2026-11-23.
    (NVIDIA_CHART, "0.18.2"): frozenset(
        {
            "config",
            "compatWithCPUManager",
            "migStrategy",
            "failOnInitError",
            "deviceListStrategy",
            "deviceIDStrategy",
            "nvidiaDriverRoot",
            "gdrcopyEnabled",
            "gdsEnabled",
            "mofedEnabled",
            "deviceDiscoveryStrategy",
            "nameOverride",
            "fullnameOverride",
            "namespaceOverride",
            "selectorLabelsOverride",
            "allowDefaultNamespace",
            "imagePullSecrets",
            "image",
            "updateStrategy",
            "podAnnotations",
            "podSecurityContext",
            "securityContext",
            "resources",
            "nodeSelector",
            "affinity",
            "tolerations",
            "priorityClassName",
            "runtimeClassName",
            "devicePlugin",
            "gfd",
            "nfd",
            "mps",
            "cdi",
        }
    ),
    # Top-level keys of cluster-autoscaler/charts/cluster-autoscaler/values.yaml in
    # kubernetes/autoscaler at commit 55c37cd5eb550756c5ccc5a89e9068d77797e575 (chart 9.59.0,
    # app 1.35.0), read 2026-11-24.
    (AUTOSCALER_CHART, "9.59.0"): frozenset(
        {
            "affinity",
            "additionalLabels",
            "autoDiscovery",
            "autoscalingGroups",
            "autoscalingGroupsnamePrefix",
            "awsAccessKeyID",
            "awsRegion",
            "awsSecretAccessKey",
            "azureClientID",
            "azureClientSecret",
            "azureResourceGroup",
            "azureSubscriptionID",
            "azureTenantID",
            "azureUseManagedIdentityExtension",
            "azureUserAssignedIdentityID",
            "azureUseWorkloadIdentityExtension",
            "azureVMType",
            "azureEnableForceDelete",
            "azureEnableVMSSEtag",
            "civoApiUrl",
            "civoApiKey",
            "civoClusterID",
            "civoRegion",
            "cloudConfigPath",
            "cloudProvider",
            "clusterAPICloudConfigPath",
            "clusterAPIConfigMapsNamespace",
            "clusterAPIKubeconfigSecret",
            "clusterAPIMode",
            "clusterAPIWorkloadKubeconfigPath",
            "containerSecurityContext",
            "deployment",
            "dnsConfig",
            "dnsPolicy",
            "envFromConfigMap",
            "envFromSecret",
            "expanderPriorities",
            "extraArgs",
            "customArgs",
            "extraEnv",
            "extraEnvConfigMaps",
            "extraEnvSecrets",
            "extraObjects",
            "extraVolumeMounts",
            "extraVolumes",
            "extraVolumeSecrets",
            "initContainers",
            "fullnameOverride",
            "hostNetwork",
            "image",
            "kubeTargetVersionOverride",
            "kwokConfigMapName",
            "magnumCABundlePath",
            "magnumClusterName",
            "nameOverride",
            "nodeSelector",
            "podAnnotations",
            "podDisruptionBudget",
            "podLabels",
            "priorityClassName",
            "priorityConfigMapAnnotations",
            "prometheusRule",
            "rbac",
            "replicaCount",
            "resources",
            "revisionHistoryLimit",
            "securityContext",
            "service",
            "serviceMonitor",
            "tolerations",
            "topologySpreadConstraints",
            "updateStrategy",
            "vpa",
            "secretKeyRefNameOverride",
        }
    ),
    # Top-level keys of stable/aws-efa-k8s-device-plugin/values.yaml in aws/eks-charts at
    # commit bfe91c4 (the commit that set the chart's version to v0.5.30), read 2026-11-23;
    # the chart has no `affinity` value (its affinity comes from supportedInstanceLabels).
    (EFA_CHART, "v0.5.30"): frozenset(
        {
            "image",
            "securityContext",
            "supportedInstanceLabels",
            "resources",
            "nodeSelector",
            "updateStrategy",
            "tolerations",
            "additionalPodAnnotations",
            "additionalPodLabels",
            "nameOverride",
            "fullnameOverride",
            "imagePullSecrets",
        }
    ),
    # Top-level keys of deployment/values.yaml in NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2
    # (commit 691c92762eb551313c825f6efe4ceeee20982801, chart 4.8.2), read 2026-11-27, and
    # `customMetrics`, which that file documents commented out and metrics-configmap.yaml reads.
    (DCGM_CHART, DCGM_EXPORTER_CHART_VERSION): frozenset(
        {
            "affinity",
            "arguments",
            "basicAuth",
            "debugDump",
            "extraConfigMapVolumes",
            "extraEnv",
            "extraHostVolumes",
            "extraVolumeMounts",
            "fullnameOverride",
            "hostNetwork",
            "hostPID",
            "image",
            "imagePullSecrets",
            "kubeletPath",
            "kubernetes",
            "kubernetesDRA",
            "livenessProbe",
            "nameOverride",
            "namespaceOverride",
            "nodeSelector",
            "podAnnotations",
            "podLabels",
            "podSecurityContext",
            "priorityClassName",
            "readinessProbe",
            "resources",
            "rollingUpdate",
            "runtimeClassName",
            "securityContext",
            "service",
            "serviceAccount",
            "serviceMonitor",
            "tlsServerConfig",
            "tolerations",
            "customMetrics",
        }
    ),
    # Top-level keys of charts/grafana/values.yaml in grafana/helm-charts at tag grafana-10.5.15
    # (commit 570b7560be8503a031a470cf81a7dfaf865ed5b5), read 2026-11-27.
    # Top-level keys of charts/kueue/values.yaml at kubernetes-sigs/kueue tag v0.19.2 (commit
    # 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb), read 2026-11-27.
    (KUEUE_CHART, KUEUE_CHART_VERSION): frozenset(
        {
            "nameOverride",
            "fullnameOverride",
            "enablePrometheus",
            "enableCertManager",
            "certManager",
            "enableVisibilityAPF",
            "enableMutatingAdmissionPolicy",
            "enableVisibilityAuthReaderRoleBinding",
            "enableKueueViz",
            "kubernetesClusterDomain",
            "controllerManager",
            "managerConfig",
            "metricsService",
            "webhookService",
            "mutatingWebhook",
            "kueueViz",
            "metrics",
        }
    ),
    (GRAFANA_CHART, GRAFANA_CHART_VERSION): frozenset(
        {
            "admin",
            "adminUser",
            "affinity",
            "alerting",
            "assertNoLeakedSecrets",
            "automountServiceAccountToken",
            "autoscaling",
            "containerSecurityContext",
            "createConfigmap",
            "dashboardProviders",
            "dashboards",
            "dashboardsConfigMaps",
            "datasources",
            "defaultCurlOptions",
            "deploymentStrategy",
            "dnsConfig",
            "dnsPolicy",
            "downloadDashboards",
            "downloadDashboardsImage",
            "enableKubeBackwardCompatibility",
            "enableServiceLinks",
            "env",
            "envFromConfigMaps",
            "envFromSecret",
            "envFromSecrets",
            "envRenderSecret",
            "envValueFrom",
            "extraConfigmapMounts",
            "extraContainerVolumes",
            "extraContainers",
            "extraEmptyDirMounts",
            "extraExposePorts",
            "extraInitContainers",
            "extraLabels",
            "extraObjects",
            "extraSecretMounts",
            "extraVolumeMounts",
            "extraVolumes",
            "global",
            "gossipPortName",
            "grafana.ini",
            "headlessService",
            "hostAliases",
            "hostUsers",
            "image",
            "imageRenderer",
            "ingress",
            "initChownData",
            "ldap",
            "lifecycleHooks",
            "livenessProbe",
            "namespaceOverride",
            "networkPolicy",
            "nodeSelector",
            "notifiers",
            "persistence",
            "plugins",
            "podDisruptionBudget",
            "podPortName",
            "rbac",
            "readinessProbe",
            "replicas",
            "resources",
            "revisionHistoryLimit",
            "route",
            "securityContext",
            "service",
            "serviceAccount",
            "serviceMonitor",
            "shareProcessNamespace",
            "sidecar",
            "smtp",
            "testFramework",
            "tolerations",
            "topologySpreadConstraints",
            "useStatefulSet",
        }
    ),
}


@pytest.mark.parametrize("name", STACKS)
def test_helm_values_set_only_keys_the_pinned_chart_accepts(name: str) -> None:
    """Helm ignores an unknown values key in silence: a renamed key would leave a plugin on
    every node (or none). A chart bump must come with the new version's keys here."""
    _, result = stack(name)
    for release in result.of_type("kubernetes:helm.sh/v3:Release"):
        chart, version = release.inputs["chart"], release.inputs["version"]
        accepted = CHART_VALUE_KEYS.get((chart, version))
        assert accepted is not None, (
            f"{chart} {version} has no entry in CHART_VALUE_KEYS: read the chart's values.yaml "
            "at that version and record its top-level keys"
        )
        unknown = set(release.inputs.get("values", {})) - accepted
        assert not unknown, f"{chart} {version} has no values key {sorted(unknown)}"
