"""Where the run's dashboard is shown, and the in-cluster Grafana that shows it (pure).

`observability.grafana`: `in-cluster` (the stack's own Grafana chart, reached by port-forward,
the default because Amazon Managed Grafana needs IAM Identity Center or SAML), `managed` (an
AMG workspace) or `none`. Everything `infra.platform.grafana` registers is named here.
Why and sources: docs/design/job.md#grafana
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from infra.job.dashboard import dashboard_uid

if TYPE_CHECKING:
    from infra.estimates.run_plan import RunPlan

GRAFANA_CHART = "grafana"
GRAFANA_CHART_REPOSITORY = "https://grafana.github.io/helm-charts"
GRAFANA_CHART_VERSION = "10.5.15"
"""grafana/helm-charts `charts/grafana` at tag grafana-10.5.15 (its last release there; the
chart continues as grafana-community/helm-charts, whose releases ship Grafana 13)."""
GRAFANA_IMAGE_TAG = "12.3.1"
"""The chart's appVersion, pinned. Not Grafana 13: it drops SigV4 from the core Prometheus data
source (Grafana docs, "Migrate from Prometheus SigV4 to Amazon Managed Service for
Prometheus"), which would need a plugin downloaded from grafana.com."""

RELEASE_NAME = "grafana"
"""The Helm release, and the Deployment, Service and admin Secret the chart names after it: a
release name that contains the chart's name is the full name (`_helpers.tpl` `grafana.fullname`)."""
SERVICE_ACCOUNT = RELEASE_NAME
SERVICE_PORT = 80
CONTAINER_PORT = 3000
"""The chart's `service.port` and `service.targetPort` defaults (values.yaml at the tag)."""
ADMIN_USER = "admin"
ADMIN_PASSWORD_KEY = "admin-password"
"""The key of the chart's admin Secret (`admin.passwordKey`); the chart fills it with
`randAlphaNum 40` once and keeps it (`_helpers.tpl` `grafana.password`, a `lookup`)."""
DASHBOARD_PROVIDER = "fsdp-eks"
DATASOURCE_UID = "amp"
APP_LABELS = {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/instance": RELEASE_NAME}
"""The chart's selector labels on the Grafana pod (`_helpers.tpl` `grafana.selectorLabels`)."""

QUERY_ACTIONS = ("aps:QueryMetrics", "aps:GetLabels", "aps:GetSeries", "aps:GetMetricMetadata")
"""What Grafana needs of a workspace (AMP user guide, "Set up Grafana open source or Grafana
Enterprise for use with Amazon Managed Service for Prometheus"), and no more."""
POD_IDENTITY_AGENT = ("169.254.170.23/32", 80)
"""Where pods fetch Pod Identity credentials (EKS user guide, "EKS Pod Identity agent"; the
agent's host-network listener): Grafana's egress must reach it."""

GrafanaMode = Literal["in-cluster", "managed", "none"]


@dataclass(frozen=True)
class GrafanaPlan:
    """Where `fsdp-eks dashboard --open` shows the run, and why."""

    mode: GrafanaMode
    reason: str
    namespace: str
    """The metrics namespace (the in-cluster Grafana's)."""
    dashboard_uid: str
    workspace_url: str | None = None

    @property
    def dashboard_path(self) -> str:
        """Grafana's URL path of a dashboard by uid (`/d/<uid>`)."""
        return f"/d/{self.dashboard_uid}"

    def summary(self) -> str:
        """One line for the plan: where `fsdp-eks dashboard --open` shows the run, and why."""
        where = {
            "in-cluster": f"in-cluster {GRAFANA_IMAGE_TAG} (`fsdp-eks dashboard --open`)",
            "managed": f"Amazon Managed Grafana {self.workspace_url}",
            "none": "none, the dashboard as a file",
        }[self.mode]
        return f"{where}; {self.reason}"


def metrics_namespace(job_name: str) -> str:
    """The exporters' (and Grafana's) namespace: `infra.platform.observability` creates it."""
    return f"{job_name}-metrics"[:63].rstrip("-")


def grafana_plan(plan: RunPlan) -> GrafanaPlan:
    """`observability.grafana` resolved: `auto` is managed with a workspace URL, in-cluster
    where the stack creates its cluster and the metrics go to AMP, else none (an existing
    cluster is its operators': nothing is installed there unless the stack asks)."""
    config = plan.config
    obs = config.observability
    job_name = str(config.job.name)
    common = {"namespace": metrics_namespace(job_name), "dashboard_uid": dashboard_uid(job_name)}
    amp = plan.metrics.enabled and plan.metrics.destination == "managed-prometheus"
    if obs.grafana_workspace_url is not None:
        return GrafanaPlan(
            mode="managed",
            reason="observability.grafanaWorkspaceUrl",
            workspace_url=obs.grafana_workspace_url,
            **common,
        )
    if obs.grafana == "in-cluster":
        return GrafanaPlan(mode="in-cluster", reason="observability.grafana", **common)
    if obs.grafana == "none":
        return GrafanaPlan(mode="none", reason="observability.grafana", **common)
    if not amp:
        return GrafanaPlan(mode="none", reason="auto: no metrics in a workspace", **common)
    if config.cluster.mode != "create":
        return GrafanaPlan(
            mode="none",
            reason="auto: an existing cluster (set observability.grafana in-cluster to install "
            "one)",
            **common,
        )
    return GrafanaPlan(
        mode="in-cluster", reason="auto: a created cluster, metrics in AMP", **common
    )


def grafana_problems(plan: RunPlan) -> list[str]:
    """An explicit in-cluster Grafana whose metrics the plan turned off (`enabled: auto`)."""
    obs = plan.config.observability
    if obs.grafana == "in-cluster" and not plan.metrics.enabled and obs.enabled == "auto":
        return [
            "observability.grafana 'in-cluster' needs the run's metrics, which are off here "
            f"({plan.metrics.reason}): set observability.enabled true"
        ]
    return []


def query_policy(workspace_arn: str) -> dict[str, Any]:
    """Grafana's role: read the one workspace."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "QueryTheRunsWorkspace",
                "Effect": "Allow",
                "Action": list(QUERY_ACTIONS),
                "Resource": workspace_arn,
            }
        ],
    }


def datasources(query_url: str, region: str) -> dict[str, Any]:
    """Grafana's provisioning file: the workspace as the default Prometheus data source, signed
    with SigV4 from the AWS SDK's default chain (Pod Identity's container credentials).
    Grafana docs, "Connect to Amazon Managed Service for Prometheus" (v12.x): `sigV4Auth`,
    `sigV4AuthType: default`, `sigV4Region`; the URL is the workspace's endpoint."""
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Amazon Managed Service for Prometheus",
                "type": "prometheus",
                "uid": DATASOURCE_UID,
                "access": "proxy",
                "url": query_url.rstrip("/"),
                "isDefault": True,
                "editable": False,
                "jsonData": {
                    "httpMethod": "POST",
                    "sigV4Auth": True,
                    "sigV4AuthType": "default",
                    "sigV4Region": region,
                },
            }
        ],
    }


def dashboard_config_map(name: str, namespace: Any, job_name: str, document: str) -> dict[str, Any]:
    """The run's dashboard as the chart's `dashboardsConfigMaps` mounts it (one JSON file)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {f"{job_name}.json": document},
    }


def grafana_values(
    *, query_url: str, region: str, dashboard_config_map_name: str
) -> dict[str, Any]:
    """The chart's values (grafana/helm-charts `charts/grafana/values.yaml`, grafana-10.5.15):
    ClusterIP only, no Ingress, non-root with a read-only root file system, no Kubernetes API
    access (no sidecars: the dashboard and data source are files), no outbound calls but AMP."""
    return {
        "image": {"tag": GRAFANA_IMAGE_TAG},
        "service": {"type": "ClusterIP", "port": SERVICE_PORT, "targetPort": CONTAINER_PORT},
        "ingress": {"enabled": False},
        "testFramework": {"enabled": False},
        "persistence": {"enabled": False},
        # No sidecar watches the API: neither RBAC nor a Kubernetes token in the pod. Pod
        # Identity mounts a token of its own audience regardless (EKS user guide).
        "rbac": {"create": False},
        "serviceAccount": {
            "create": True,
            "name": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
        },
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 472,
            "runAsGroup": 472,
            "fsGroup": 472,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containerSecurityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # Writable places on a read-only root: /var/lib/grafana and the search index are the
        # chart's own emptyDirs; these are the rest Grafana writes.
        "extraEmptyDirMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "logs", "mountPath": "/var/log/grafana"},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},
        },
        "env": {
            # The AMP setup guide's two settings for SigV4 in a self-managed Grafana.
            "AWS_SDK_LOAD_CONFIG": "true",
            "GF_AUTH_SIGV4_AUTH_ENABLED": "true",
            "AWS_REGION": region,
        },
        "grafana.ini": {
            "auth": {"sigv4_auth_enabled": True},
            "auth.anonymous": {"enabled": False},
            "users": {"allow_sign_up": False},
            # Its egress reaches AMP only: no update checks, reports or plugin downloads.
            "analytics": {"check_for_updates": False, "reporting_enabled": False},
            "plugins": {"preinstall_disabled": True},
        },
        "datasources": {"datasources.yaml": datasources(query_url, region)},
        "dashboardProviders": {
            "dashboardproviders.yaml": {
                "apiVersion": 1,
                "providers": [
                    {
                        "name": DASHBOARD_PROVIDER,
                        "orgId": 1,
                        "folder": "",
                        "type": "file",
                        "disableDeletion": True,
                        "editable": False,
                        "options": {"path": f"/var/lib/grafana/dashboards/{DASHBOARD_PROVIDER}"},
                    }
                ],
            }
        },
        "dashboardsConfigMaps": {DASHBOARD_PROVIDER: dashboard_config_map_name},
    }


def grafana_network_policy(namespace: Any) -> dict[str, Any]:
    """Nothing reaches Grafana over the pod network (kubectl port-forward does not use it: the
    kubelet's runtime dials the port inside the pod's own network namespace, containerd v1.7
    `pkg/cri/server/sandbox_portforward_linux.go`); Grafana reaches DNS, the Pod Identity agent
    and HTTPS (AMP's query endpoint has no fixed addresses to name)."""
    agent_cidr, agent_port = POD_IDENTITY_AGENT
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "grafana-port-forward-only", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": dict(APP_LABELS)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                {
                    "to": [{"ipBlock": {"cidr": agent_cidr}}],
                    "ports": [{"protocol": "TCP", "port": agent_port}],
                },
                {"ports": [{"protocol": "TCP", "port": 443}]},
            ],
        },
    }
