"""Kueue on a cluster the stack creates (`scheduling.kueue: true`): the job waits in a queue
whose quota is the GPU group, and is admitted only once the cluster autoscaler has accepted
one ProvisioningRequest for all of its nodes.

Order: the ProvisioningRequest CRD, Kueue's chart (kueue v0.19.2), then its objects.
Why this order, with sources: docs/design/platform.md#kueue
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.stack import StackConfig
from infra.job.queueing import kueue_integrations
from infra.platform.kube_args import custom_args
from infra.platform.kueue_manifests import kueue_objects, manager_config_yaml

CHART = "oci://registry.k8s.io/kueue/charts/kueue"
CHART_VERSION = "0.19.2"
"""kubernetes-sigs/kueue v0.19.2 `charts/kueue/Chart.yaml` (version 0.19.2, appVersion v0.19.2);
published where its README says, `oci://registry.k8s.io/kueue/charts/kueue`."""
NAMESPACE = "kueue-system"
AUTOSCALER_COMMIT = "2d42588803c71fe9b35dcd9e3669ac6bb550ca22"
"""kubernetes/autoscaler tag cluster-autoscaler-1.35.2, pinned by its commit (a tag can move)."""
PROVISIONING_REQUEST_CRD_URL = (
    f"https://raw.githubusercontent.com/kubernetes/autoscaler/{AUTOSCALER_COMMIT}/"
    "cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml"
)
PROVISIONING_REQUEST_CRD_SHA256 = "064b0c2c6156bdf39225a11a7d3e199107e1126c714f336e695a269395946782"
"""sha256 of that file at that commit (what the provider downloads at `up`)."""
RELEASE_TIMEOUT_SECONDS = 600


def chart_values(frameworks: tuple[str, ...], system_selector: Mapping[str, str]) -> dict[str, Any]:
    """Values of the pinned chart (keys of its `values.yaml`): the manager on the system nodes,
    its configuration with only the job API's integration on."""
    return {
        "controllerManager": {"nodeSelector": dict(system_selector)},
        "managerConfig": {"controllerManagerConfigYaml": manager_config_yaml(frameworks)},
    }


@dataclass
class KueueArgs:
    config: StackConfig
    job_api: str
    """`job.api` (`pytorchjob` | `trainjob`): which integration Kueue switches on."""
    k8s_provider: k8s.Provider
    system_selector: Mapping[str, str]
    namespace: pulumi.Input[str]
    """The job's namespace (an output of the resource that makes it): the LocalQueue's."""
    cluster_ready: Sequence[pulumi.Resource] = ()


class Kueue(pulumi.ComponentResource):
    """The ProvisioningRequest CRD, Kueue's release and the queue's objects."""

    release: k8s.helm.v3.Release
    ready: list[pulumi.Resource]
    """What the job waits for: Kueue serving its webhooks and the LocalQueue existing."""

    def __init__(
        self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:kueue:Kueue", name, None, opts)

        def child(*depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
            # A component's depends_on does not reach its children: each names its own.
            return pulumi.ResourceOptions(
                parent=self,
                provider=args.k8s_provider,
                depends_on=[*args.cluster_ready, *depends_on],
            )

        crd = k8s.yaml.v2.ConfigFile(
            f"{name}-provisioningrequest-crd", file=PROVISIONING_REQUEST_CRD_URL, opts=child()
        )
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name="kueue",
            chart=CHART,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            create_namespace=True,
            values=chart_values(kueue_integrations(args.job_api), args.system_selector),
            timeout=RELEASE_TIMEOUT_SECONDS,
            opts=child(crd),
        )
        objects: list[pulumi.Resource] = []
        for manifest in kueue_objects(args.config):
            kind = manifest["kind"]
            slug = re.sub(r"(?<!^)([A-Z])", r"-\1", kind).lower()
            metadata: dict[str, Any] = dict(manifest["metadata"])
            if "namespace" in metadata:
                metadata["namespace"] = args.namespace  # waits for the namespace to exist
            objects.append(
                k8s.apiextensions.CustomResource(
                    f"{name}-{slug}",
                    **custom_args({**manifest, "metadata": metadata}),
                    opts=child(self.release, *objects),
                )
            )
        self.ready = [self.release, *objects]
        self.register_outputs({})
