"""The in-cluster Grafana that `fsdp-eks dashboard --open` port-forwards to.

Registered when `observability.grafana` resolves to `in-cluster` (`infra.job.grafana`): the
run's dashboard as a ConfigMap, a Pod Identity role that may only query the run's AMP workspace,
the NetworkPolicy that admits nothing over the pod network, and the Grafana Helm release that
mounts the dashboard and signs its queries with SigV4. Rendering is in `infra.job.grafana`.

Construction (after `Observability`, which makes the namespace and the workspace):

    Grafana("grafana", GrafanaArgs(plan=plan, workspace_arn=..., ...))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra.estimates.run_plan import RunPlan
from infra.job.dashboard import stack_dashboard
from infra.job.grafana import (
    GRAFANA_CHART,
    GRAFANA_CHART_REPOSITORY,
    GRAFANA_CHART_VERSION,
    RELEASE_NAME,
    SERVICE_ACCOUNT,
    dashboard_config_map,
    grafana_network_policy,
    grafana_values,
    query_policy,
)
from infra.platform.iam import pod_identity_role
from infra.platform.kube_args import typed_args
from infra.platform.observability import RELEASE_TIMEOUT_SECONDS

DASHBOARD_CONFIG_MAP = "fsdp-eks-dashboard"


@dataclass
class GrafanaArgs:
    plan: RunPlan
    cluster_name: pulumi.Input[str]
    namespace: pulumi.Input[str]
    """The metrics namespace (an output of its Namespace resource, so everything waits)."""
    workspace_arn: pulumi.Input[str]
    workspace_endpoint: pulumi.Input[str]
    region: pulumi.Input[str]
    k8s_provider: k8s.Provider
    cluster_ready: Sequence[pulumi.Resource] = ()
    """The cluster and its Pod Identity agent: the association needs both."""
    tags: Mapping[str, str] = field(default_factory=dict)


class Grafana(pulumi.ComponentResource):
    """Grafana (Helm), its dashboard ConfigMap, its NetworkPolicy and its query-only role."""

    def __init__(
        self, name: str, args: GrafanaArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:observability:Grafana", name, None, opts)
        job_name = str(args.plan.config.job.name)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)
        dashboard = k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            **typed_args(
                dashboard_config_map(
                    DASHBOARD_CONFIG_MAP,
                    args.namespace,
                    job_name,
                    stack_dashboard(args.plan),
                )
            ),
            opts=in_cluster,
        )
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            **typed_args(grafana_network_policy(args.namespace)),
            opts=in_cluster,
        )
        identity = pod_identity_role(
            name,
            cluster_name=args.cluster_name,
            namespace=args.namespace,
            service_account=SERVICE_ACCOUNT,
            policy=pulumi.Output.from_input(args.workspace_arn).apply(
                lambda arn: json.dumps(query_policy(arn))
            ),
            description=f"Grafana of {job_name} (Pod Identity): query its AMP workspace",
            parent=self,
            cluster_ready=args.cluster_ready,
            tags=args.tags,
            sid="EksPodIdentityForThisGrafana",
        )
        values = pulumi.Output.all(args.workspace_endpoint, args.region).apply(
            lambda resolved: grafana_values(
                query_url=str(resolved[0]),
                region=str(resolved[1]),
                dashboard_config_map_name=DASHBOARD_CONFIG_MAP,
            )
        )
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            chart=GRAFANA_CHART,
            version=GRAFANA_CHART_VERSION,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=GRAFANA_CHART_REPOSITORY),
            namespace=args.namespace,
            values=values,
            timeout=RELEASE_TIMEOUT_SECONDS,
            # Pod Identity gives credentials only to pods created after the association.
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=args.k8s_provider,
                depends_on=[dashboard, identity.policy, identity.association],
            ),
        )
        self.register_outputs({"release": self.release.name})
