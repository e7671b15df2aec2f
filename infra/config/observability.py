"""The `observability` section: where the run's metrics go while it runs.

Trainer, DCGM and EFA exporter metrics go to Amazon Managed Service for Prometheus (default)
or an existing cluster's Prometheus (`clusterPrometheus`); `enabled: auto` by cost (run plan).
`grafana` says where `fsdp-eks dashboard --open` shows the dashboard.
Why each choice, with sources: docs/design/config.md#observability
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from infra.config.base import ConfigSection

AUTO_SHARE_OF_GPU_COST = 0.01
"""`enabled: auto` collects when the metrics cost under this share of the run's GPU cost."""

_AMP_WORKSPACE_ARN = re.compile(
    r"^arn:aws[a-z-]*:aps:[a-z0-9-]+:\d{12}:workspace/ws-[A-Za-z0-9-]+$"
)
# AMG workspace URLs: `g-<id>.grafana-workspace.<region>.amazonaws.com` (AMG user guide).
_AMG_WORKSPACE_URL = re.compile(
    r"^https://g-[a-z0-9]+\.grafana-workspace\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/?$"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Kubernetes label keys and values (apimachinery validation.IsQualifiedName / IsValidLabelValue).
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class ClusterPrometheusConfig(ConfigSection):
    """An existing cluster's own Prometheus (prometheus-operator): PodMonitors, nothing else."""

    namespace: str = Field(
        default="monitoring",
        description=(
            "Namespace the cluster's Prometheus pods run in: the NetworkPolicies admit "
            "scrapes from its pods labelled app.kubernetes.io/name=prometheus."
        ),
    )
    monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Labels on the PodMonitors, for the Prometheus's podMonitorSelector (e.g. "
            "{release: kube-prometheus-stack})."
        ),
    )

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, namespace: str) -> str:
        if not _DNS1123_LABEL.match(namespace):
            raise ValueError(
                f"observability.clusterPrometheus.namespace {namespace!r} is not a namespace "
                "name: lowercase letters, digits and '-', at most 63 characters"
            )
        return namespace

    @field_validator("monitor_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ValueError(
                    f"observability.clusterPrometheus.monitorLabels {key!r}: {value!r} is not "
                    "a Kubernetes label (name of at most 63 letters, digits, '-', '_', '.', "
                    "optionally prefixed by a DNS domain and '/')"
                )
        return labels


class ObservabilityConfig(ConfigSection):
    """`fsdp-eks:observability`: the run's metrics (trainer, GPUs, EFA) and where they go."""

    enabled: Literal["auto", True, False] = Field(
        default="auto",
        description=(
            "Collect the run's metrics. auto: on where they cost under 1% of the run's GPU "
            "cost (the plan says which and why), off on an existing cluster that names no "
            "workspaceArn or clusterPrometheus; false: nothing is installed (the plan still "
            "shows what it would cost)."
        ),
    )
    workspace_arn: str | None = Field(
        default=None,
        description=(
            "An existing Amazon Managed Service for Prometheus workspace the managed scraper "
            "writes to (none is created). Default on a created cluster: a workspace of the "
            "stack's own."
        ),
    )
    cluster_prometheus: ClusterPrometheusConfig | None = Field(
        default=None,
        description=(
            "Existing clusters only: PodMonitor objects for the cluster's own Prometheus "
            "(prometheus-operator) instead of Amazon Managed Service for Prometheus."
        ),
    )
    scrape_interval_seconds: int = Field(
        default=30,
        ge=10,
        le=300,
        description=(
            "Seconds between scrapes of every target: samples (and so the metrics' cost) "
            "scale with 1/interval."
        ),
    )

    grafana: Literal["auto", "in-cluster", "managed", "none"] = Field(
        default="auto",
        description=(
            "Where `fsdp-eks dashboard --open` shows the run's dashboard. in-cluster: a "
            "Grafana in the created cluster (ClusterIP only, reached by kubectl port-forward, "
            "reading the AMP workspace with SigV4, dashboard provisioned); managed: the Amazon "
            "Managed Grafana workspace at grafanaWorkspaceUrl (yours; nothing is installed); "
            "none: the dashboard file only. auto: managed when grafanaWorkspaceUrl is set, "
            "else in-cluster where the stack creates the cluster and its metrics go to AMP, "
            "else none."
        ),
    )
    grafana_workspace_url: str | None = Field(
        default=None,
        description=(
            "An Amazon Managed Grafana workspace you already have "
            "(https://g-<id>.grafana-workspace.<region>.amazonaws.com): the dashboard opens "
            "there; import the dashboard file into it once."
        ),
    )

    @field_validator("grafana_workspace_url")
    @classmethod
    def _grafana_workspace_url(cls, url: str | None) -> str | None:
        if url is not None and not _AMG_WORKSPACE_URL.match(url):
            raise ValueError(
                f"observability.grafanaWorkspaceUrl {url!r} is not an Amazon Managed Grafana "
                "workspace URL (https://g-<id>.grafana-workspace.<region>.amazonaws.com)"
            )
        return url.rstrip("/") if url is not None else None

    @field_validator("workspace_arn")
    @classmethod
    def _workspace_arn(cls, arn: str | None) -> str | None:
        if arn is not None and not _AMP_WORKSPACE_ARN.match(arn):
            raise ValueError(
                f"observability.workspaceArn {arn!r} is not an Amazon Managed Service for "
                "Prometheus workspace ARN (arn:aws:aps:<region>:<account>:workspace/ws-...)"
            )
        return arn

    @property
    def destination(self) -> Literal["managed-prometheus", "cluster-prometheus"]:
        """Where the metrics go, read from which key the stack sets."""
        return "cluster-prometheus" if self.cluster_prometheus is not None else "managed-prometheus"


def observability_problems(config: ObservabilityConfig, *, cluster_mode: str) -> list[str]:
    """Rules between `observability` and `cluster.mode`, one message each."""
    problems: list[str] = []
    if config.cluster_prometheus is not None and config.workspace_arn is not None:
        problems.append(
            "observability.clusterPrometheus and observability.workspaceArn are both set: "
            "choose one destination for the metrics"
        )
    if cluster_mode == "create" and config.cluster_prometheus is not None:
        problems.append(
            "observability.clusterPrometheus needs cluster.mode 'existing': a cluster this "
            "stack creates runs no Prometheus; leave it out (metrics go to Amazon Managed "
            "Service for Prometheus)"
        )
    if (
        cluster_mode == "existing"
        and config.enabled is True
        and config.cluster_prometheus is None
        and config.workspace_arn is None
    ):
        problems.append(
            "observability.enabled true on an existing cluster needs a destination: set "
            "observability.workspaceArn (an Amazon Managed Service for Prometheus workspace) "
            "or observability.clusterPrometheus (PodMonitors for the cluster's Prometheus)"
        )
    problems.extend(_grafana_problems(config))
    return problems


def _grafana_problems(config: ObservabilityConfig) -> list[str]:
    """`grafana` against what it needs: a workspace URL for managed, AMP for in-cluster."""
    url = config.grafana_workspace_url
    if config.grafana == "managed" and url is None:
        return [
            "observability.grafana 'managed' needs observability.grafanaWorkspaceUrl (your "
            "Amazon Managed Grafana workspace's URL)"
        ]
    if url is not None and config.grafana in ("in-cluster", "none"):
        return [
            f"observability.grafanaWorkspaceUrl is set but observability.grafana is "
            f"{config.grafana!r}: set grafana to 'managed' (or 'auto'), or leave the URL out"
        ]
    if config.grafana == "in-cluster" and config.enabled is False:
        return [
            "observability.grafana 'in-cluster' needs the run's metrics: observability.enabled "
            "is false"
        ]
    if config.grafana == "in-cluster" and config.cluster_prometheus is not None:
        return [
            "observability.grafana 'in-cluster' reads Amazon Managed Service for Prometheus, "
            "not observability.clusterPrometheus: use the cluster's own Grafana (grafana 'none')"
        ]
    return []
