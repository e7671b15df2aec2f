"""The run's metrics rendered: the exporters, the scrape configuration, monitors and policies.

Pure functions over plain values (no pulumi), so the tests and the NetworkPolicy model read
exactly what the `Observability` component registers. The names the rules and dashboards use
are in `infra.facts.exporter_metrics`; every target here serves on a container port named
`metrics` (the trainer's is declared by the job: `infra.job.manifest`).
"""

from __future__ import annotations

from typing import Any

import yaml

from infra.facts.exporter_metrics import (
    DCGM_EXPORTER_IMAGE,
    DCGM_EXPORTER_PORT,
    EFA_COUNTERS,
    EFA_EXPORTER_PORT,
    NODE_EXPORTER_IMAGE,
    dcgm_counters_csv,
    efa_metric_name,
)
from infra.job.manifest import JOB_NAME_LABEL
from infra.job.placement import Placement

METRICS_PORT_NAME = "metrics"
"""The container port every scrape target names (trainer, DCGM chart, EFA exporter)."""
NAME_LABEL = "app.kubernetes.io/name"
DCGM_APP = "dcgm-exporter"
"""The chart's `app.kubernetes.io/name` on its pods (`_helpers.tpl` selectorLabels)."""
EFA_APP = "efa-exporter"
PART_OF = {"app.kubernetes.io/part-of": "fsdp-eks"}
PROMETHEUS_POD_LABELS = {NAME_LABEL: "prometheus"}
"""What prometheus-operator labels its Prometheus pods with (v0.93.0
`pkg/prometheus/statefulset.go`): the pods a cluster Prometheus scrapes from."""
NONROOT_UID = 65534
"""`nobody`, node_exporter's image user (its Dockerfile `USER nobody`)."""
DCGM_UID = 1000
"""The uid dcgm-exporter's chart documents for running without root (values.yaml, 4.8.2)."""
TEXTFILE_DIR = "/var/lib/efa-textfile"
HOST_SYS = "/host/sys"


def restricted_security_context(uid: int) -> dict[str, Any]:
    """A container that can change nothing: non-root, no escalation, no capabilities."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --- DCGM exporter (Helm values of the pinned chart) ---------------------------------------


def dcgm_values(placement: Placement) -> dict[str, Any]:
    """Values for NVIDIA's dcgm-exporter chart 4.8.2 (keys of its `deployment/values.yaml`)."""
    repository, tag = DCGM_EXPORTER_IMAGE.rsplit(":", 1)
    context = restricted_security_context(DCGM_UID)
    # DCGM's embedded host engine writes its log and state under the image's filesystem; the
    # chart enables a read-only root only with tmpfs volumes it does not declare (values.yaml).
    context["readOnlyRootFilesystem"] = False
    return {
        "image": {"repository": repository, "tag": tag},
        # Our counters (no DCGM_FI_PROF_* field: those need root with SYS_ADMIN); the chart
        # mounts `customMetrics` where `-f` points (metrics-configmap.yaml, daemonset.yaml).
        "customMetrics": dcgm_counters_csv(),
        "arguments": ["-f", "/etc/dcgm-exporter/default-counters.csv"],
        # Non-root: the kubelet's pod-resources socket is then unreadable and the exporter
        # only skips pod labels ("Don't fail the whole scrape": transformation/kubernetes.go).
        "securityContext": context,
        "podSecurityContext": {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "podLabels": dict(PART_OF),
        "service": {"enable": False},
        # No prometheus-operator on a cluster this stack creates: monitors are ours.
        "serviceMonitor": {"enabled": False},
        "nodeSelector": dict(placement.node_selector),
        "tolerations": [dict(t) for t in placement.tolerations],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "200m", "memory": "512Mi"},
        },
    }


# --- EFA exporter (a DaemonSet of our own, node_exporter's image) ---------------------------


def efa_counters_script(interval_seconds: int) -> str:
    """The loop that turns each EFA port's hw_counters into node_exporter's textfile format.

    The EFA driver exposes its port stats under `ports/<n>/hw_counters/<name>`
    (amzn-drivers `kernel/linux/efa/src/efa_verbs.c` EFA_DEFINE_PORT_STATS); a counter absent
    on this driver is skipped. The file is written aside and renamed, so a scrape never reads
    half of it (node_exporter `collector/textfile.go` reads whole `*.prom` files).
    """
    help_lines = "\n".join(
        f"# HELP {efa_metric_name(c)} {text}\n# TYPE {efa_metric_name(c)} counter"
        for c, text in EFA_COUNTERS
    )
    counters = " ".join(c for c, _ in EFA_COUNTERS)
    return f"""set -eu
out={TEXTFILE_DIR}/efa.prom
while true; do
  tmp="$out.$$"
  cat > "$tmp" <<'HELP'
{help_lines}
HELP
  for port in {HOST_SYS}/class/infiniband/*/ports/*; do
    [ -d "$port/hw_counters" ] || continue
    device=$(basename "$(dirname "$(dirname "$port")")")
    number=$(basename "$port")
    for counter in {counters}; do
      file="$port/hw_counters/$counter"
      [ -r "$file" ] || continue
      labels="device=\\"$device\\",port=\\"$number\\""
      echo "efa_${{counter}}_total{{$labels}} $(cat "$file")" >> "$tmp"
    done
  done
  mv "$tmp" "$out"
  sleep {interval_seconds}
done
"""


def efa_exporter_daemonset(
    *, name: str, namespace: Any, placement: Placement, interval_seconds: int
) -> dict[str, Any]:
    """EFA counters per device on the GPU nodes: a shell loop reading /sys (read-only) and
    node_exporter v1.12.1 serving what it writes, both non-root on a read-only root."""
    labels = {NAME_LABEL: EFA_APP, **PART_OF}
    resources = {
        "requests": {"cpu": "10m", "memory": "16Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    }
    # The loop is alive while its file is fresh (busybox `find -mmin`): two missed rounds fail.
    fresh_minutes = max(2, 2 * interval_seconds // 60 + 1)
    fresh = {
        "exec": {
            "command": [
                "/bin/sh",
                "-c",
                f"find {TEXTFILE_DIR}/efa.prom -mmin -{fresh_minutes} | grep -q .",
            ]
        },
        "initialDelaySeconds": 30,
        "periodSeconds": 60,
    }
    counters = {
        "name": "counters",
        "image": NODE_EXPORTER_IMAGE,
        # Always: the tag is re-resolved at each start (no digest could be read: see tests).
        "imagePullPolicy": "Always",
        "livenessProbe": fresh,
        "readinessProbe": fresh,
        "command": ["/bin/sh", "-c", efa_counters_script(interval_seconds)],
        "securityContext": restricted_security_context(NONROOT_UID),
        "resources": resources,
        "volumeMounts": [
            {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
            {"name": "textfile", "mountPath": TEXTFILE_DIR},
        ],
    }
    probe = {"httpGet": {"path": "/", "port": METRICS_PORT_NAME}, "periodSeconds": 30}
    exporter = {
        "name": "node-exporter",
        "image": NODE_EXPORTER_IMAGE,
        "imagePullPolicy": "Always",
        "args": [
            f"--web.listen-address=:{EFA_EXPORTER_PORT}",
            # Only the textfile collector: the node's own metrics are not this run's business.
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={TEXTFILE_DIR}",
            "--web.disable-exporter-metrics",
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": EFA_EXPORTER_PORT}],
        "securityContext": restricted_security_context(NONROOT_UID),
        "resources": resources,
        "livenessProbe": probe,
        "readinessProbe": probe,
        "volumeMounts": [{"name": "textfile", "mountPath": TEXTFILE_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {NAME_LABEL: EFA_APP}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(placement.node_selector),
                    "tolerations": [dict(t) for t in placement.tolerations],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [counters, exporter],
                    "volumes": [
                        # /sys whole: /sys/class/infiniband holds links into /sys/devices.
                        {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
                        {"name": "textfile", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    ],
                },
            },
        },
    }


# --- what scrapes them ----------------------------------------------------------------------


def _keep(label: str, value: str) -> dict[str, Any]:
    return {
        "source_labels": [f"__meta_kubernetes_pod_label_{_meta(label)}"],
        "regex": value,
        "action": "keep",
    }


def _meta(label: str) -> str:
    """A label's name in Kubernetes service discovery (`/`, `.`, `-` become `_`)."""
    return "".join(ch if ch.isalnum() else "_" for ch in label)


def scrape_configuration(
    *,
    stack: str,
    job_name: str,
    job_namespace: str,
    metrics_namespace: str,
    interval_seconds: int,
    efa: bool,
    job_label: str = JOB_NAME_LABEL,
) -> str:
    """The managed scraper's Prometheus configuration: the job's pods (those `job_label`
    names: the job API's pod label, `infra.job.job_api`), DCGM and EFA.

    The trainer labels its own series with stack, run, node and rank, so its job honours them
    (`honor_labels`); the exporters' series get `node` from the pod's node and `stack`.
    """
    port = {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": METRICS_PORT_NAME,
        "action": "keep",
    }
    node = {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
    stack_label = {"target_label": "stack", "replacement": stack}

    def job(name: str, namespace: str, keep: dict[str, Any], honor: bool) -> dict[str, Any]:
        return {
            "job_name": name,
            "honor_labels": honor,
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [namespace]}}],
            "relabel_configs": [keep, port, node, stack_label],
        }

    jobs = [
        job("fsdp-trainer", job_namespace, _keep(job_label, job_name), True),
        job("dcgm-exporter", metrics_namespace, _keep(NAME_LABEL, DCGM_APP), False),
    ]
    if efa:
        jobs.append(job("efa-exporter", metrics_namespace, _keep(NAME_LABEL, EFA_APP), False))
    config = {
        "global": {"scrape_interval": f"{interval_seconds}s"},
        "scrape_configs": jobs,
    }
    return yaml.safe_dump(config, sort_keys=False)


COLLECTOR_USER = "aps-collector-user"
"""The Kubernetes user AMP's access entry maps the scraper's role to (AMP user guide, 'Set up
managed collectors for Amazon EKS'); the entry itself AMP creates on clusters whose
authentication mode includes the API (aws-solutions-library-samples issue #8, 2024-07)."""


def collector_rbac() -> list[dict[str, Any]]:
    """The read-only rights the managed scraper's user needs to discover and scrape pods."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "fsdp-eks-aps-collector", "labels": dict(PART_OF)},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "fsdp-eks-aps-collector", "labels": dict(PART_OF)},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "fsdp-eks-aps-collector",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COLLECTOR_USER}
        ],
    }
    return [role, binding]


def pod_monitor(
    *,
    name: str,
    namespace: Any,
    selector: dict[str, str],
    labels: dict[str, str],
    stack: str,
    interval_seconds: int,
    honor_labels: bool,
) -> dict[str, Any]:
    """A prometheus-operator PodMonitor (monitoring.coreos.com/v1, v0.93.0 CRD) for one kind
    of target, with the same labels as the managed scraper's job."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": {**PART_OF, **labels}},
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [
                {
                    "port": METRICS_PORT_NAME,
                    "interval": f"{interval_seconds}s",
                    "honorLabels": honor_labels,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                            "targetLabel": "node",
                        },
                        {"targetLabel": "stack", "replacement": stack},
                    ],
                }
            ],
        },
    }


# --- who may reach the metrics ports --------------------------------------------------------


def scrape_sources(
    *, vpc_cidr: Any | None, prometheus_namespace: str | None
) -> list[dict[str, Any]]:
    """NetworkPolicy peers a scrape comes from: the managed scraper's network interfaces (in the
    cluster's subnets, so the VPC's range) or the cluster Prometheus's pods."""
    if prometheus_namespace is not None:
        return [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": prometheus_namespace}
                },
                "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)},
            }
        ]
    assert vpc_cidr is not None, "a managed scraper needs the VPC's CIDR"
    return [{"ipBlock": {"cidr": vpc_cidr}}]


def scrape_network_policy(
    *, name: str, namespace: Any, pod_selector: dict[str, Any], sources: list[dict[str, Any]]
) -> dict[str, Any]:
    """Ingress to the selected pods' `metrics` port from the scrape sources, nothing else
    (policies add up: the job's own same-job rule still holds beside it)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(PART_OF)},
        "spec": {
            "podSelector": pod_selector,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": sources, "ports": [{"protocol": "TCP", "port": METRICS_PORT_NAME}]}
            ],
        },
    }


def trainer_selector(job_name: str, job_label: str = JOB_NAME_LABEL) -> dict[str, Any]:
    """The job's pods, by the label its job API puts on them (`infra.job.job_api`)."""
    return {"matchLabels": {job_label: job_name}}


DCGM_METRICS_PORT = DCGM_EXPORTER_PORT
