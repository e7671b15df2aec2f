"""The Pulumi program: one stack config in, one training run's resources out.

Read top-down it is the architecture: config → network → cluster → namespace → storage,
add-ons, the run's metrics (exporters and their collector) and the Grafana that shows them,
the GPU lease (autoscaler), the queue (Kueue), the run's S3 access (no FSx) and image → the
PyTorchJob → outputs. It lives in a function (called by the root `__main__.py`) so that tests
and the offline plan can evaluate it repeatedly under the mock runtime. The config is read
from the engine, parsed and checked first (the run plan's memory, deadline and cost, and the
whole-stack checks): a bad stack file raises before any resource is registered.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws
from pulumi.runtime import config as runtime_config

from infra.config import PROJECT, StackConfig
from infra.config.parse import dns_name
from infra.estimates.run_plan import RunPlan
from infra.image.trainer_image import TrainerImage, TrainerImageArgs
from infra.job.alert_rules import alert_thresholds
from infra.job.dashboard import stack_dashboard
from infra.job.flags import s3_run_prefix
from infra.job.grafana import grafana_plan
from infra.job.manifest import S3Bucket
from infra.job.placement import gpu_placement
from infra.job.stack_checks import checked_run_plan
from infra.launch.training_job import JobNamespace, JobNamespaceArgs, TrainingJob, TrainingJobArgs
from infra.platform.addons import Addons, AddonsArgs
from infra.platform.autoscaler import SYSTEM_NODE_SELECTOR, ClusterAutoscaler, ClusterAutoscalerArgs
from infra.platform.capacity_block import check_capacity_block
from infra.platform.cluster import Cluster, ClusterArgs
from infra.platform.gpu_lease import existing_gpu_lease, lease_line
from infra.platform.grafana import Grafana, GrafanaArgs
from infra.platform.kueue import Kueue, KueueArgs
from infra.platform.network import Network, NetworkArgs
from infra.platform.observability import Observability, ObservabilityArgs
from infra.platform.run_access import CheckpointAccess, CheckpointAccessArgs
from infra.platform.run_alerts import RunAlerts, RunAlertsArgs
from infra.platform.storage import Storage, StorageArgs


def resource_tags(stack: StackConfig) -> dict[str, str]:
    """Tags on every AWS resource: who owns it and which experiment it serves."""
    return {
        "Project": pulumi.get_project(),
        "Stack": pulumi.get_stack(),
        "fsdp-eks:job": str(stack.job.name),
    }


def checked_run() -> RunPlan:
    """The running stack's config, from every key the engine passed, parsed and checked.

    Reads the whole config map, not single keys, so that a misspelt key is an error instead of
    a silently ignored setting (the Pulumi CLI accepts undeclared keys).
    """
    values: dict[str, Any] = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret_keys = {k for k in values if pulumi.runtime.is_config_secret(k)}
    secret_keys |= set(runtime_config.get_config_secret_keys_env())
    return checked_run_plan(values, stack_name=pulumi.get_stack(), secret_keys=secret_keys)


def main() -> None:
    plan = checked_run()
    stack = plan.config
    check_capacity_block(plan, source=f"stack {pulumi.get_stack()!r}")  # it must hold the run
    tags = resource_tags(stack)

    aws_profile = pulumi.Config("aws").get("profile")

    network = None
    if stack.cluster.mode == "create":
        network = Network(
            "network",
            NetworkArgs(
                config=stack.cluster.network,
                gpu_availability_zone=stack.gpu_nodes.availability_zone,
                gpu_instance_type=stack.gpu_nodes.instance_type,
                gpu_capacity_reserved=stack.gpu_nodes.capacity.is_reserved,
                tags=tags,
            ),
        )
    cluster = Cluster(
        "platform",
        ClusterArgs(
            cluster=stack.cluster,
            gpu_nodes=stack.gpu_nodes,
            network=network,
            aws_profile=aws_profile,
            tags=tags,
        ),
    )
    namespace = JobNamespace(
        "job-namespace",
        JobNamespaceArgs(
            config=stack.job, k8s_provider=cluster.k8s_provider, depends_on=cluster.ready
        ),
    )
    storage = Storage(
        "storage",
        StorageArgs(
            config=stack.storage,
            cluster_name=cluster.name,
            k8s_provider=cluster.k8s_provider,
            namespace=namespace.name,
            vpc_id=cluster.vpc_id,
            subnet_id=cluster.gpu_subnet_id,
            client_security_group_ids=[cluster.cluster_security_group_id],
            cluster_ready=cluster.ready,
            owns_network=stack.cluster.mode == "create" and stack.cluster.network.creates_vpc,
            tags=tags,
        ),
    )
    addons = Addons(
        "addons",
        AddonsArgs(
            config=stack.addons,
            k8s_provider=cluster.k8s_provider,
            gpu_placement=gpu_placement(stack.gpu_nodes),
            efa_enabled=stack.gpu_nodes.efa_enabled,
            cluster_ready=cluster.ready,
            # The job API's operator: training operator v1, or Trainer v2 with JobSet.
            job_api=stack.job.api,
            owns_cluster=stack.cluster.mode == "create",
        ),
    )
    # The run's metrics: GPU and EFA exporters, collected by AMP's managed scraper into a
    # workspace that outlives the cluster (or by the cluster's own Prometheus).
    observability = Observability(
        "observability",
        ObservabilityArgs(
            plan=plan,
            cluster_name=cluster.name,
            vpc_id=cluster.vpc_id,
            cluster_security_group_id=cluster.cluster_security_group_id,
            k8s_provider=cluster.k8s_provider,
            job_namespace=namespace.name,
            cluster_ready=cluster.ready,
            tags=tags,
        ),
    )
    # The run's dashboard, where `fsdp-eks dashboard --open` shows it: a Grafana of the
    # stack's own (ClusterIP, port-forward), reading the workspace with SigV4.
    grafana = grafana_plan(plan)
    if grafana.mode == "in-cluster":
        assert observability.namespace is not None and observability.workspace_arn is not None
        assert observability.workspace_endpoint is not None  # metrics in AMP (grafana_plan)
        Grafana(
            "grafana",
            GrafanaArgs(
                plan=plan,
                cluster_name=cluster.name,
                namespace=observability.namespace,
                workspace_arn=observability.workspace_arn,
                workspace_endpoint=observability.workspace_endpoint,
                region=aws.get_region_output().region,
                k8s_provider=cluster.k8s_provider,
                cluster_ready=cluster.ready,
                tags=tags,
            ),
        )
    # The GPU nodes are leased to the run: from zero for the job's pods, back to zero after.
    leased: list[pulumi.Resource] = []
    if cluster.gpu_nodes is not None and stack.addons.cluster_autoscaler.install:
        autoscaler = ClusterAutoscaler(
            "autoscaler",
            ClusterAutoscalerArgs(
                cluster_name=cluster.name,
                region=aws.get_region_output().region,
                k8s_provider=cluster.k8s_provider,
                system_selector=SYSTEM_NODE_SELECTOR,
                scale_down_minutes=stack.addons.cluster_autoscaler.scale_down_unneeded_minutes,
                gpu_asg_name=cluster.gpu_nodes.asg_name,
                gpu_nodes=stack.gpu_nodes,
                efa_interfaces=cluster.gpu_nodes.efa_interface_count,
                provisioning_requests=stack.scheduling.kueue,
                cluster_ready=cluster.ready,
                tags=tags,
            ),
        )
        leased.extend(autoscaler.ready)
    # The queue (scheduling.kueue, create mode): the job is admitted once the autoscaler has
    # accepted one request for all its nodes. On an existing cluster the job's labels name
    # the cluster's queue and nothing is installed.
    queue: list[pulumi.Resource] = []
    if stack.scheduling.kueue:
        kueue = Kueue(
            "kueue",
            KueueArgs(
                config=stack,
                job_api=stack.job.api,
                k8s_provider=cluster.k8s_provider,
                system_selector=SYSTEM_NODE_SELECTOR,
                namespace=namespace.name,
                cluster_ready=cluster.ready,
            ),
        )
        queue.extend(kueue.ready)
    # Who holds the GPU nodes while no job runs: this stack, or the existing cluster's operators.
    gpu_lease = (
        pulumi.Output.from_input(lease_line(stack))
        if stack.cluster.mode == "create"
        else existing_gpu_lease(
            cluster.name,
            instance_type=stack.gpu_nodes.instance_type,
            count=stack.gpu_nodes.count,
            auto_mode=cluster.auto_mode,
            parent=cluster,
        )
    )
    # Without FSx the run lives in the bucket: its pods may touch only their run's prefix.
    run_access = None
    if storage.pvc_name is None:
        run_access = CheckpointAccess(
            "run-access",
            CheckpointAccessArgs(
                cluster_name=cluster.name,
                namespace=namespace.name,
                job_name=str(stack.job.name),
                bucket_arn=storage.bucket_arn,
                prefix=s3_run_prefix(plan),
                k8s_provider=cluster.k8s_provider,
                cluster_ready=cluster.ready,
                tags=tags,
            ),
        )
    image = TrainerImage(
        "trainer-image",
        TrainerImageArgs(
            config=stack.image,
            name_prefix=f"{PROJECT}-{dns_name(pulumi.get_stack())}"[:61].rstrip("-"),
            aws_profile=aws_profile,
            tags=tags,
        ),
    )
    # Watching the run: its alert rules where its metrics are (the workspace, when the
    # observability component makes one) and the people they reach; the dashboard.
    alerts = RunAlerts(
        "alerts",
        RunAlertsArgs(
            config=stack.alerts,
            thresholds=alert_thresholds(plan),
            workspace_id=observability.workspace_id,
            workspace_arn=observability.workspace_arn,
            tags=tags,
        ),
    )

    job = TrainingJob(
        "job",
        TrainingJobArgs(
            plan=plan,
            image_uri=image.image_uri,
            k8s_provider=cluster.k8s_provider,
            kubeconfig=cluster.kubeconfig,
            namespace=namespace.name,
            pvc_name=storage.pvc_name,
            mount_path=storage.mount_path,
            service_account_name=run_access.service_account_name if run_access else None,
            bucket=(
                S3Bucket(name=storage.bucket_name, region=aws.get_region_output().region)
                if run_access
                else None
            ),
            depends_on=[
                *cluster.ready,
                *addons.ready,
                *observability.ready,
                *storage.ready,
                *leased,
                *queue,
                *(run_access.ready if run_access else []),
            ],
        ),
    )

    estimate = plan.cost
    assert estimate is not None  # a checked plan is priced
    pulumi.export("clusterName", cluster.name)
    pulumi.export("vpcId", cluster.vpc_id)
    pulumi.export("gpuSubnetId", cluster.gpu_subnet_id)
    pulumi.export("clusterSecurityGroupId", cluster.cluster_security_group_id)
    pulumi.export("oidcProviderArn", cluster.oidc_provider_arn)
    pulumi.export("bucketName", storage.bucket_name)
    pulumi.export("jobName", job.job_name)
    pulumi.export("jobApi", stack.job.api)  # which API the verbs talk to (infra.job.job_api)
    pulumi.export("namespace", job.namespace)
    pulumi.export("image", job.image)
    pulumi.export("runId", job.run_id)
    pulumi.export("checkpointPath", job.checkpoint_path)
    pulumi.export(
        "kubectl",
        {
            # With the region: without it the AWS CLI's default region is asked, which may
            # be another one (AWS CLI `eks update-kubeconfig --region`).
            "updateKubeconfig": pulumi.Output.concat(
                "aws eks update-kubeconfig --name ",
                cluster.name,
                " --region ",
                aws.get_region_output().region,
            ),
            **job.kubectl,
        },
    )
    pulumi.export("gpuLease", gpu_lease)
    # Where the run's metrics are (null when collected elsewhere or not at all): alert rules
    # and dashboards read this workspace.
    pulumi.export("metricsWorkspaceId", observability.workspace_id)
    pulumi.export("metricsWorkspaceArn", observability.workspace_arn)
    pulumi.export("metricsWorkspaceEndpoint", observability.workspace_endpoint)
    pulumi.export("estimatedUsdPerHour", estimate.usd_per_hour)
    # Beside the run's cost: what the stack bills every day until `pulumi destroy`.
    pulumi.export("standingUsdPerDay", plan.standing.usd_per_day)
    pulumi.export(
        "cost",
        {
            **estimate.as_outputs(),
            "standing": plan.standing.as_outputs(),
            "metrics": plan.metrics.as_outputs(),
        },
    )
    pulumi.export("alerts", {"topicArn": alerts.topic_arn, "topicPolicy": alerts.topic_policy})
    pulumi.export("dashboard", stack_dashboard(plan))
    pulumi.export(
        "grafana",
        {
            "mode": grafana.mode,
            "namespace": grafana.namespace if grafana.mode == "in-cluster" else None,
            "dashboardPath": grafana.dashboard_path,
            "workspaceUrl": grafana.workspace_url,
        },
    )
