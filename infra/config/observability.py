"""The `observability` section: where the run's metrics go while it runs.

The trainer, NVIDIA's DCGM exporter (GPUs) and an EFA exporter (network devices) serve
Prometheus metrics on every GPU node. They are collected one of two ways, chosen by which key
the stack sets:

* Amazon Managed Service for Prometheus (the default): AMP's managed scraper reads the targets
  and writes to a workspace that outlives the cluster; a workspace is created, or an existing
  one is named by `workspaceArn` (required on an existing cluster, whose workspace is its
  operators').
* `clusterPrometheus`: on an existing cluster that runs the Prometheus operator, PodMonitor
  objects for its Prometheus; nothing else is installed for collection.

`enabled: auto` turns collection on where it costs under 1% of the run's GPU cost (the run
plan decides: `infra.estimates.metrics_cost`), and off on an existing cluster that names no
destination.
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
    return problems
