"""Cluster add-ons a GPU training job needs: the device plugins and the job API's operator.

The NVIDIA and EFA device plugins (pinned Helm releases, GPU nodes only, placement from
`infra.job.placement`) make nodes advertise `nvidia.com/gpu` and `vpc.amazonaws.com/efa`; the
operator follows `job.api`. On an existing cluster each has an `install` switch.
Why, and construction: docs/design/platform.md#addons
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.addons import AddonsConfig
from infra.job.placement import Placement
from infra.platform.kubeflow_trainer import KubeflowTrainer, KubeflowTrainerArgs
from infra.platform.training_operator import TrainingOperator, TrainingOperatorArgs

NVIDIA_CHART_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_CHART = "nvidia-device-plugin"
EFA_CHART_REPO = "https://aws.github.io/eks-charts"
EFA_CHART = "aws-efa-k8s-device-plugin"
PLUGIN_NAMESPACE = "kube-system"
RELEASE_TIMEOUT_SECONDS = 600


@dataclass
class AddonsArgs:
    config: AddonsConfig
    k8s_provider: k8s.Provider
    gpu_placement: Placement
    """The GPU nodes' selector and the tolerations of their taints (`infra.job.placement`)."""
    efa_enabled: bool
    """Whether the GPU nodes have EFA interfaces (`GpuNodesConfig.efa_enabled`)."""
    cluster_ready: Sequence[pulumi.Resource] = ()
    """What must exist before anything is scheduled (node groups)."""
    operator_node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where the training operator may run (e.g. system nodes); empty: any untainted node."""
    job_api: str = "pytorchjob"
    """`job.api`: which operator the job needs."""
    owns_cluster: bool = True
    """Whether the stack created the cluster (Trainer v2 is installed only there)."""


def gpu_node_affinity(selector: Mapping[str, str]) -> dict[str, Any]:
    """A required node affinity equal to `selector`.

    The NVIDIA chart's default affinity asks for labels that node feature discovery would
    set; EKS nodes have none of them, so the plugin would never schedule. Giving our own
    `nodeSelectorTerms` replaces that list (Helm merges maps but replaces lists).
    """
    expressions = [
        {"key": key, "operator": "In", "values": [value]} for key, value in sorted(selector.items())
    ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]
            }
        }
    }


class Addons(pulumi.ComponentResource):
    """NVIDIA + EFA device plugins (Helm) and the Kubeflow training operator."""

    nvidia_device_plugin: k8s.helm.v3.Release | None
    efa_device_plugin: k8s.helm.v3.Release | None
    training_operator: TrainingOperator | None
    kubeflow_trainer: KubeflowTrainer | None
    ready: list[pulumi.Resource]
    """Everything the PyTorchJob must wait for (empty when nothing is installed)."""

    def __init__(
        self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:addons:Addons", name, None, opts)
        if not args.gpu_placement.node_selector:
            raise ValueError(
                "AddonsArgs.gpu_placement has no node selector: the device plugins would run on "
                "every node; pass `infra.job.placement.gpu_placement` of the GPU nodes"
            )
        config = args.config
        self._args = args
        self.ready = []
        self.nvidia_device_plugin = None
        self.efa_device_plugin = None
        self.training_operator = None
        self.kubeflow_trainer = None

        if config.nvidia_device_plugin.install:
            self.nvidia_device_plugin = self._plugin(
                f"{name}-nvidia-device-plugin",
                release=NVIDIA_CHART,
                chart=NVIDIA_CHART,
                repo=NVIDIA_CHART_REPO,
                version=config.nvidia_device_plugin.version,
                values={"affinity": gpu_node_affinity(args.gpu_placement.node_selector)},
            )
            self.ready.append(self.nvidia_device_plugin)
        if args.efa_enabled and config.efa_device_plugin.install:
            self.efa_device_plugin = self._plugin(
                f"{name}-efa-device-plugin",
                release=EFA_CHART,
                chart=EFA_CHART,
                repo=EFA_CHART_REPO,
                version=config.efa_device_plugin.version,
                values={},
            )
            self.ready.append(self.efa_device_plugin)
        if args.job_api == "trainjob" and args.owns_cluster:
            self.kubeflow_trainer = KubeflowTrainer(
                f"{name}-kubeflow-trainer",
                KubeflowTrainerArgs(
                    k8s_provider=args.k8s_provider,
                    node_selector=args.operator_node_selector,
                    depends_on=list(args.cluster_ready),
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.ready.extend(self.kubeflow_trainer.ready)
        elif args.job_api == "pytorchjob" and config.training_operator.install:
            self.training_operator = TrainingOperator(
                f"{name}-training-operator",
                TrainingOperatorArgs(
                    config=config.training_operator,
                    k8s_provider=args.k8s_provider,
                    node_selector=args.operator_node_selector,
                    depends_on=list(args.cluster_ready),
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.ready.extend(self.training_operator.ready)

        self.register_outputs(
            {
                "nvidiaDevicePluginVersion": config.nvidia_device_plugin.version
                if self.nvidia_device_plugin
                else None,
                "efaDevicePluginVersion": config.efa_device_plugin.version
                if self.efa_device_plugin
                else None,
                "trainingOperatorVersion": config.training_operator.version
                if self.training_operator
                else None,
            }
        )

    def _plugin(
        self,
        resource_name: str,
        *,
        release: str,
        chart: str,
        repo: str,
        version: str,
        values: dict[str, Any],
    ) -> k8s.helm.v3.Release:
        """A device-plugin DaemonSet pinned to `version`, on the GPU nodes and nowhere else."""
        args = self._args
        return k8s.helm.v3.Release(
            resource_name,
            name=release,
            chart=chart,
            version=version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo),
            namespace=PLUGIN_NAMESPACE,
            values={
                **values,
                "nodeSelector": dict(args.gpu_placement.node_selector),
                "tolerations": [dict(toleration) for toleration in args.gpu_placement.tolerations],
            },
            # A DaemonSet on nodes still joining is not a failure; give them time.
            timeout=RELEASE_TIMEOUT_SECONDS,
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.k8s_provider, depends_on=list(args.cluster_ready)
            ),
        )
