"""Kubeflow Trainer v2 (2.3.0), as its release ships it: the `kubeflow-trainer` Helm chart.

The chart (kubeflow/trainer v2.3.0 `charts/kubeflow-trainer`) brings the CRDs, the controller
and JobSet; none of its ClusterTrainingRuntimes (the stack renders its own). The Release waits
for the manager, so a TrainJob that depends on `ready` races neither CRDs nor webhooks.
Why and sources: docs/design/platform.md#kubeflow_trainer
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

CHART = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
CHART_VERSION = "2.3.0"
"""The Trainer release whose CRD schemas tests/schemas/ holds (tests/schemas/SOURCES.md)."""
JOBSET_CHART_VERSION = "0.12.0"
"""What chart 2.3.0 installs as its `jobset` dependency (`charts/kubeflow-trainer/Chart.yaml`)."""
NAMESPACE = "kubeflow-system"
RELEASE_NAME = "kubeflow-trainer"
RELEASE_TIMEOUT_SECONDS = 600


@dataclass
class KubeflowTrainerArgs:
    k8s_provider: k8s.Provider
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where the trainer and JobSet controllers may run; empty: any untainted node."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What must exist first (the node groups): the Python SDK does not pass a component's
    `depends_on` down to its children."""


def chart_values(node_selector: Mapping[str, str]) -> dict[str, object]:
    """The chart's values: its defaults, with both controllers placed by `node_selector`."""
    return {
        "crds": {"enabled": True},
        "jobset": {"install": True, "controller": {"nodeSelector": dict(node_selector)}},
        "manager": {"nodeSelector": dict(node_selector)},
        "runtimes": {"defaultEnabled": False},
    }


class KubeflowTrainer(pulumi.ComponentResource):
    """`fsdp-eks:kubeflow_trainer:KubeflowTrainer`: the Trainer v2 chart, pinned."""

    release: k8s.helm.v3.Release
    ready: list[pulumi.Resource]

    def __init__(
        self, name: str, args: KubeflowTrainerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:kubeflow_trainer:KubeflowTrainer", name, None, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-chart",
            name=RELEASE_NAME,
            chart=CHART,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            create_namespace=True,
            values=chart_values(args.node_selector),
            timeout=RELEASE_TIMEOUT_SECONDS,
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.k8s_provider, depends_on=list(args.depends_on)
            ),
        )
        self.ready = [self.release]
        self.register_outputs({"version": CHART_VERSION})
