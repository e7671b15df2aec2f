"""The run's metrics: GPU and EFA exporters on the GPU nodes, and what collects them.

AMP's managed scraper (agentless, a workspace that outlives the cluster), or PodMonitors for
an existing cluster's Prometheus; metrics ports open only to the collector.
`workspace_id`/`workspace_arn`/`workspace_endpoint` are None when metrics go elsewhere.
Why, with sources, and construction: docs/design/platform.md#observability
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config import PROJECT
from infra.config.parse import dns_name
from infra.estimates.run_plan import RunPlan
from infra.facts.exporter_metrics import (
    DCGM_EXPORTER_CHART_REPOSITORY,
    DCGM_EXPORTER_CHART_VERSION,
)
from infra.job.job_api import job_api
from infra.job.placement import gpu_placement
from infra.platform.kube_args import custom_args, typed_args
from infra.platform.observability_manifests import (
    DCGM_APP,
    EFA_APP,
    NAME_LABEL,
    PART_OF,
    collector_rbac,
    dcgm_values,
    efa_exporter_daemonset,
    pod_monitor,
    scrape_configuration,
    scrape_network_policy,
    scrape_sources,
    trainer_selector,
)

DCGM_CHART = "dcgm-exporter"


RELEASE_TIMEOUT_SECONDS = 600


@dataclass
class ObservabilityArgs:
    plan: RunPlan
    """The run plan: `plan.metrics` says whether and where (`enabled: auto` resolved)."""
    cluster_name: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    k8s_provider: k8s.Provider
    job_namespace: pulumi.Input[str]
    cluster_ready: Sequence[pulumi.Resource] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


class Observability(pulumi.ComponentResource):
    """DCGM and EFA exporters, their NetworkPolicies, and the AMP workspace and scraper (or the
    cluster Prometheus's PodMonitors)."""

    workspace_id: pulumi.Output[str] | None
    workspace_arn: pulumi.Output[str] | None
    workspace_endpoint: pulumi.Output[str] | None
    """The workspace's Prometheus endpoint (`.../workspaces/<id>/`): query and rules."""
    namespace: pulumi.Output[str] | None
    """Where the exporters run."""
    ready: list[pulumi.Resource]
    """The exporters' releases: the job waits for them, so its first steps are scraped."""

    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:observability:Observability", name, None, opts)
        self.workspace_id = self.workspace_arn = self.workspace_endpoint = None
        self.namespace = None
        self.ready = []
        # The trainer pods' label is the job API's (a TrainJob's pods carry JobSet's).
        self._job_label = job_api(args.plan.config.job.api).job_name_label
        metrics = args.plan.metrics
        if metrics.enabled:
            self._build(name, args)
        self.register_outputs(
            {
                "enabled": metrics.enabled,
                "workspaceId": self.workspace_id,
                "workspaceArn": self.workspace_arn,
                "workspaceEndpoint": self.workspace_endpoint,
            }
        )

    def _build(self, name: str, args: ObservabilityArgs) -> None:
        plan = args.plan
        stack = plan.config
        obs = stack.observability
        job_name = str(stack.job.name)
        # The `stack` label of every series: the job's name, as the trainer's pod gives it.
        stack_name = job_name
        placement = gpu_placement(stack.gpu_nodes)
        efa = stack.gpu_nodes.efa_enabled
        k8s_opts = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=list(args.cluster_ready)
        )

        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": f"{job_name}-metrics"[:63].rstrip("-"), "labels": dict(PART_OF)},
            opts=k8s_opts,
        )
        self.namespace = namespace.metadata.apply(lambda meta: str(meta["name"]))
        in_namespace = pulumi.ResourceOptions(
            parent=self, provider=args.k8s_provider, depends_on=[namespace]
        )
        dcgm = k8s.helm.v3.Release(
            f"{name}-dcgm-exporter",
            name=DCGM_CHART,
            chart=DCGM_CHART,
            version=DCGM_EXPORTER_CHART_VERSION,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=DCGM_EXPORTER_CHART_REPOSITORY),
            namespace=self.namespace,
            values=dcgm_values(placement),
            # A DaemonSet on GPU nodes that scale from zero has nothing to wait for.
            skip_await=True,
            timeout=RELEASE_TIMEOUT_SECONDS,
            opts=in_namespace,
        )
        self.ready.append(dcgm)
        if efa:
            self.ready.append(
                k8s.apps.v1.DaemonSet(
                    f"{name}-efa-exporter",
                    **typed_args(
                        efa_exporter_daemonset(
                            name=EFA_APP,
                            namespace=self.namespace,
                            placement=placement,
                            interval_seconds=obs.scrape_interval_seconds,
                        )
                    ),
                    opts=in_namespace,
                )
            )

        prometheus = obs.cluster_prometheus
        vpc_cidr = (
            None
            if prometheus is not None
            else aws.ec2.get_vpc_output(
                id=args.vpc_id, opts=pulumi.InvokeOutputOptions(parent=self)
            ).cidr_block
        )
        sources = scrape_sources(
            vpc_cidr=vpc_cidr, prometheus_namespace=prometheus.namespace if prometheus else None
        )
        # The exporters' namespace admits scrapes of `metrics` and nothing else.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-exporters-policy",
            **typed_args(
                scrape_network_policy(
                    name="metrics-scrapes-only",
                    namespace=self.namespace,
                    pod_selector={},
                    sources=sources,
                )
            ),
            opts=in_namespace,
        )
        # Beside the job's same-job rule (policies add up): its `metrics` port, for scrapes.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-trainer-policy",
            **typed_args(
                scrape_network_policy(
                    name=f"{job_name}-metrics-scrapes",
                    namespace=args.job_namespace,
                    pod_selector=trainer_selector(job_name, self._job_label),
                    sources=sources,
                )
            ),
            opts=k8s_opts,
        )

        if prometheus is not None:
            self._pod_monitors(name, args, job_name, stack_name, k8s_opts, in_namespace)
        else:
            self._managed_scraper(name, args, job_name, stack_name, efa, k8s_opts)

    def _pod_monitors(
        self,
        name: str,
        args: ObservabilityArgs,
        job_name: str,
        stack_name: str,
        k8s_opts: pulumi.ResourceOptions,
        in_namespace: pulumi.ResourceOptions,
    ) -> None:
        obs = args.plan.config.observability
        assert obs.cluster_prometheus is not None
        common: dict[str, Any] = {
            "labels": dict(obs.cluster_prometheus.monitor_labels),
            "stack": stack_name,
            "interval_seconds": obs.scrape_interval_seconds,
        }
        monitors = [
            (
                "trainer",
                args.job_namespace,
                trainer_selector(job_name, self._job_label)["matchLabels"],
                True,
                k8s_opts,
            ),
            ("dcgm", self.namespace, {NAME_LABEL: DCGM_APP}, False, in_namespace),
            ("efa", self.namespace, {NAME_LABEL: EFA_APP}, False, in_namespace),
        ]
        for role, namespace, selector, honor, opts in monitors:
            if role == "efa" and not args.plan.config.gpu_nodes.efa_enabled:
                continue
            k8s.apiextensions.CustomResource(
                f"{name}-{role}-monitor",
                **custom_args(
                    pod_monitor(
                        name=f"{job_name}-{role}"[:63],
                        namespace=namespace,
                        selector=selector,
                        honor_labels=honor,
                        **common,
                    )
                ),
                opts=opts,
            )

    def _managed_scraper(
        self,
        name: str,
        args: ObservabilityArgs,
        job_name: str,
        stack_name: str,
        efa: bool,
        k8s_opts: pulumi.ResourceOptions,
    ) -> None:
        obs = args.plan.config.observability
        tags = dict(args.tags)
        child = pulumi.ResourceOptions(parent=self)
        if obs.workspace_arn is None:
            workspace = aws.amp.Workspace(
                f"{name}-workspace",
                alias=f"{PROJECT}-{dns_name(pulumi.get_stack())}"[:100],
                tags=tags,
                opts=child,
            )
            self.workspace_id = workspace.id
            self.workspace_arn = workspace.arn
            self.workspace_endpoint = workspace.prometheus_endpoint
        else:
            found = aws.amp.get_workspace_output(
                workspace_id=obs.workspace_arn.rsplit("/", 1)[-1],
                opts=pulumi.InvokeOutputOptions(parent=self),
            )
            self.workspace_id = found.workspace_id
            self.workspace_arn = pulumi.Output.from_input(obs.workspace_arn)
            self.workspace_endpoint = found.prometheus_endpoint
        role, binding = collector_rbac()
        rbac = [
            k8s.rbac.v1.ClusterRole(f"{name}-collector-role", **typed_args(role), opts=k8s_opts),
            k8s.rbac.v1.ClusterRoleBinding(
                f"{name}-collector-binding", **typed_args(binding), opts=k8s_opts
            ),
        ]
        cluster = aws.eks.get_cluster_output(
            name=args.cluster_name, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        aws.amp.Scraper(
            f"{name}-scraper",
            alias=f"{PROJECT}-{dns_name(pulumi.get_stack())}"[:100],
            source=aws.amp.ScraperSourceArgs(
                eks=aws.amp.ScraperSourceEksArgs(
                    cluster_arn=cluster.arn,
                    # The cluster's subnets (two AZs or more, as the scraper requires) and its
                    # security group, which every node (and so every pod) carries.
                    subnet_ids=cluster.vpc_config.subnet_ids,
                    security_group_ids=[args.cluster_security_group_id],
                )
            ),
            destination=aws.amp.ScraperDestinationArgs(
                amp=aws.amp.ScraperDestinationAmpArgs(workspace_arn=self.workspace_arn)
            ),
            scrape_configuration=pulumi.Output.all(args.job_namespace, self.namespace).apply(
                lambda names: scrape_configuration(
                    stack=stack_name,
                    job_name=job_name,
                    job_namespace=str(names[0]),
                    metrics_namespace=str(names[1]),
                    interval_seconds=obs.scrape_interval_seconds,
                    efa=efa,
                    job_label=self._job_label,
                )
            ),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=rbac),
        )
