"""The NetworkPolicies the program and `fsdp-eks validate` render, evaluated as the cluster
enforces them (`tests/infra/network_policy_model.py`): every flow a run needs still passes, and
nothing outside a job reaches its rendezvous store or NCCL's sockets.

Flows a policy cannot see are not modelled: EFA traffic is RDMA through the device plugin's
uverbs devices, never an IP packet through the pod's veth where the VPC CNI's agent enforces
(aws/aws-network-policy-agent README), and the Lustre client and the Pod Identity agent run in
the node's network namespace.
"""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfig
from infra.estimates.run_plan import plan_run
from infra.job.cluster_checks import validation_manifests
from infra.job.manifest import RENDEZVOUS_PORT, RENDEZVOUS_PORT_NAME
from infra.offline import Evaluation
from tests.infra.network_policy_model import Cluster, Endpoint, allowed
from tests.infra.test_stacks import JOB, stack

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
EKS_CLUSTER = "eks:index:Cluster"
RUN_ID = "validate-0"
OPERATOR_LABELS = "training.kubeflow.org/"
"""Labels training operator v1.9 adds to a job's pods (kubeflow/trainer v1.9.0
`pkg/apis/kubeflow.org/v1/common_types.go`: job-name, replica-type, replica-index)."""
NCCL_PORT = 43127
"""An ephemeral port, as NCCL's bootstrap and socket transport bind them."""
WEBHOOK_PORT, PROBE_PORT, DNS_PORT = 9443, 8081, 53

API_SERVER = Endpoint("api-server (control-plane ENI)", "10.0.0.5")
S3 = Endpoint("s3 (gateway endpoint)", "52.216.8.1")
HUB = Endpoint("huggingface.co (through the NAT)", "3.160.5.1")
POD_IDENTITY_AGENT = Endpoint("eks-pod-identity-agent", "169.254.170.23")
COREDNS = Endpoint(
    "coredns", "10.0.9.2", "kube-system", {"k8s-app": "kube-dns"}, node_ip="10.0.9.200"
)


def _job_pods(
    job: dict[str, Any], count: int, subnet: int, namespace: str | None = None
) -> list[Endpoint]:
    """The pods the operator makes of a PyTorchJob: its template's labels plus its own."""
    name = job["metadata"]["name"]
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return [
        Endpoint(
            f"{name}-worker-{index}",
            f"10.0.{subnet}.{10 + index}",
            namespace or job["metadata"]["namespace"],
            {
                **template["metadata"]["labels"],
                f"{OPERATOR_LABELS}job-name": name,
                f"{OPERATOR_LABELS}replica-type": "worker",
                f"{OPERATOR_LABELS}replica-index": str(index),
            },
            node_ip=f"10.0.{subnet}.{200 + index}",
            ports={RENDEZVOUS_PORT_NAME: RENDEZVOUS_PORT},
        )
        for index in range(count)
    ]


def _checks(name: str, config: StackConfig) -> list[dict[str, Any]]:
    return validation_manifests(
        plan_run(config),
        image="img@sha256:0",
        run_id=RUN_ID,
        bench_script="",
        claim_name=config.storage.claim_name(name),
    )


def _cluster(config: StackConfig, result: Evaluation, checks: list[dict[str, Any]]) -> Cluster:
    """The cluster's policies: the program's and the checks'. A cluster the stack creates
    enforces them only as its VPC CNI add-on is configured; an existing one's enforcement is
    its operators' (assumed here, to check the policies themselves)."""
    policies = [r.inputs for r in result.of_type(NETWORK_POLICY)]
    policies += [m for m in checks if m["kind"] == "NetworkPolicy"]
    enforced = True
    if config.cluster.mode == "create":
        options = result.one(EKS_CLUSTER).inputs.get("vpcCniOptions") or {}
        enforced = options.get("enableNetworkPolicy") is True
    return Cluster(policies, namespace_labels={}, enforced=enforced)


@pytest.fixture(params=["llama31-8b-p5", "team-cluster", "dev"])
def scene(request: pytest.FixtureRequest) -> dict[str, Any]:
    name = request.param
    config, result = stack(name)
    checks = _checks(name, config)
    job = result.one(JOB).inputs
    workers = _job_pods(job, config.gpu_nodes.count, subnet=1)
    other_job = {**job, "metadata": {**job["metadata"], "name": "someone-elses-job"}}
    [nccl_job] = [m for m in checks if m["kind"] == "PyTorchJob"]
    [gpu_check] = [m for m in checks if m["kind"] == "Job"]
    namespace = config.job.namespace
    return {
        "name": name,
        "config": config,
        "cluster": _cluster(config, result, checks),
        "result": result,
        "workers": workers,
        "other_job": _job_pods(other_job, 1, subnet=2)[0],
        "intruder": Endpoint("curious", "10.0.3.10", "default", {"app": "curious"}),
        "nccl": _job_pods(nccl_job, config.gpu_nodes.count, subnet=4),
        "gpu_check": Endpoint(
            "gpu-check",
            "10.0.5.10",
            namespace,
            gpu_check["spec"]["template"]["metadata"]["labels"],
            node_ip="10.0.5.200",
        ),
    }


def test_a_created_cluster_enforces_its_policies() -> None:
    """pulumi-eks passes enableNetworkPolicy to the VPC CNI add-on only when given (v4.3.0
    `nodejs/eks/addons/cni-addon.ts` `mergeConfigurationValues`; the add-on's default is
    "false"): without it every policy below is stored and ignored."""
    config, result = stack("llama31-8b-p5")
    assert _cluster(config, result, []).enforced


def test_the_job_reaches_what_it_needs(scene: dict[str, Any]) -> None:
    cluster: Cluster = scene["cluster"]
    workers: list[Endpoint] = scene["workers"]
    first, last = workers[0], workers[-1]
    # The rendezvous store on worker 0 and NCCL's sockets between every pair of workers.
    assert allowed(cluster, last, first, RENDEZVOUS_PORT)
    assert allowed(cluster, first, last, NCCL_PORT)
    assert allowed(cluster, last, first, NCCL_PORT)
    # DNS, the API server, S3, the Hub and the Pod Identity agent (egress is never isolated).
    assert allowed(cluster, first, COREDNS, DNS_PORT, "UDP")
    assert allowed(cluster, first, COREDNS, DNS_PORT, "TCP")
    for outside, port in ((API_SERVER, 443), (S3, 443), (HUB, 443), (POD_IDENTITY_AGENT, 80)):
        assert allowed(cluster, first, outside, port), outside.name
    # kubelet (the node's own IP) may always reach its pods.
    kubelet = Endpoint("kubelet", str(first.node_ip))
    assert allowed(cluster, kubelet, first, NCCL_PORT)


def test_nothing_outside_the_job_reaches_its_pods(scene: dict[str, Any]) -> None:
    cluster: Cluster = scene["cluster"]
    worker0 = scene["workers"][0]
    for outsider in (scene["intruder"], scene["other_job"], scene["nccl"][0], scene["gpu_check"]):
        assert not allowed(cluster, outsider, worker0, RENDEZVOUS_PORT), outsider.name
        assert not allowed(cluster, outsider, worker0, NCCL_PORT), outsider.name


def test_the_nccl_check_reaches_only_itself_and_nothing_reaches_the_gpu_check(
    scene: dict[str, Any],
) -> None:
    cluster: Cluster = scene["cluster"]
    nccl: list[Endpoint] = scene["nccl"]
    assert allowed(cluster, nccl[-1], nccl[0], RENDEZVOUS_PORT)
    assert allowed(cluster, nccl[0], nccl[-1], NCCL_PORT)
    assert allowed(cluster, nccl[0], COREDNS, DNS_PORT, "UDP")
    for outsider in (scene["intruder"], scene["workers"][0], scene["gpu_check"]):
        assert not allowed(cluster, outsider, nccl[0], RENDEZVOUS_PORT), outsider.name
    for anyone in (scene["intruder"], scene["workers"][0], nccl[0]):
        assert not allowed(cluster, anyone, scene["gpu_check"], NCCL_PORT), anyone.name


def test_the_api_server_and_kubelet_reach_the_operator_and_nobody_else_does() -> None:
    """The webhook (9443) from the API server, whose addresses no selector names, and the
    probes (8081) from kubelet; the metrics port is closed."""
    config, result = stack("llama31-8b-p5")
    cluster = _cluster(config, result, [])
    [deployment] = result.of_type(DEPLOYMENT)
    operator = Endpoint(
        "training-operator", "10.0.6.10", config.addons.training_operator.namespace,
        deployment.inputs["spec"]["template"]["metadata"]["labels"], node_ip="10.0.6.200",
    )  # fmt: skip
    assert allowed(cluster, API_SERVER, operator, WEBHOOK_PORT)
    assert allowed(cluster, Endpoint("kubelet", "10.0.6.200"), operator, PROBE_PORT)
    intruder = Endpoint("curious", "10.0.3.10", "default", {"app": "curious"})
    assert allowed(
        cluster, intruder, operator, WEBHOOK_PORT
    )  # open by port, as the webhook must be
    assert not allowed(cluster, intruder, operator, 8080)  # metrics


def test_the_model_admits_everything_without_a_policy() -> None:
    """The model can tell: the same intruder reaches a worker when no policy selects it."""
    config, result = stack("llama31-8b-p5")
    workers = _job_pods(result.one(JOB).inputs, 2, subnet=1)
    intruder = Endpoint("curious", "10.0.3.10", "default", {"app": "curious"})
    assert allowed(Cluster([], {}), intruder, workers[0], RENDEZVOUS_PORT)
    enforced = _cluster(config, result, [])
    assert not allowed(enforced, intruder, workers[0], RENDEZVOUS_PORT)
    ignored = Cluster(enforced.policies, {}, enforced=False)
    assert allowed(ignored, intruder, workers[0], RENDEZVOUS_PORT)


# --- the run's metrics: scrapes reach the metrics ports, nothing else does ----------------

TRAINER_METRICS_PORT = 9090
"""Any number: the policies name the trainer's port `metrics` (the job declares it)."""
DCGM_PORT, EFA_PORT, HOSTENGINE_PORT = 9400, 9100, 5555
SCRAPER = Endpoint("AMP managed scraper ENI", "10.0.64.7")
"""In one of the cluster's subnets, so inside the VPC's CIDR (the fake cloud's 10.0.0.0/16)."""
OUTSIDE_VPC = Endpoint("elsewhere", "192.168.7.7")


def _exporters(result: Evaluation) -> list[Endpoint]:
    from infra.platform.observability_manifests import DCGM_APP, EFA_APP, NAME_LABEL

    [namespace] = [
        r.inputs["metadata"]["name"]
        for r in result.of_type("kubernetes:core/v1:Namespace")
        if r.name == "observability-namespace"
    ]
    return [
        Endpoint("dcgm", "10.0.1.40", namespace, {NAME_LABEL: DCGM_APP},
                 node_ip="10.0.1.200", ports={"metrics": DCGM_PORT}),
        Endpoint("efa", "10.0.1.41", namespace, {NAME_LABEL: EFA_APP},
                 node_ip="10.0.1.200", ports={"metrics": EFA_PORT}),
    ]  # fmt: skip


def _with_metrics_port(workers: list[Endpoint]) -> list[Endpoint]:
    return [
        Endpoint(w.name, w.ip, w.namespace, w.labels, node_ip=w.node_ip,
                 ports={**w.ports, "metrics": TRAINER_METRICS_PORT})
        for w in workers
    ]  # fmt: skip


def test_the_managed_scraper_reaches_every_metrics_port_and_nothing_else() -> None:
    config, result = stack("llama31-8b-p5")
    cluster = _cluster(config, result, [])
    worker0 = _with_metrics_port(_job_pods(result.one(JOB).inputs, 2, subnet=1))[0]
    dcgm, efa = _exporters(result)
    assert allowed(cluster, SCRAPER, worker0, TRAINER_METRICS_PORT)
    assert allowed(cluster, SCRAPER, dcgm, DCGM_PORT)
    assert allowed(cluster, SCRAPER, efa, EFA_PORT)
    # The scrape opens only the metrics ports: not the store, NCCL, or DCGM's host engine.
    assert not allowed(cluster, SCRAPER, worker0, RENDEZVOUS_PORT)
    assert not allowed(cluster, SCRAPER, worker0, NCCL_PORT)
    assert not allowed(cluster, SCRAPER, dcgm, HOSTENGINE_PORT)
    for target, port in ((worker0, TRAINER_METRICS_PORT), (dcgm, DCGM_PORT), (efa, EFA_PORT)):
        assert not allowed(cluster, OUTSIDE_VPC, target, port), target.name
    # kubelet's probes still reach the exporters (the agent admits the local node).
    assert allowed(cluster, Endpoint("kubelet", "10.0.1.200"), efa, EFA_PORT)


def test_the_cluster_prometheus_alone_reaches_the_metrics_ports() -> None:
    from tests.infra.test_observability import existing

    config, _ = stack("team-cluster")
    result = existing('{"clusterPrometheus": {"namespace": "monitoring"}}')
    policies = [r.inputs for r in result.of_type(NETWORK_POLICY)]
    namespaces = {
        name: {"kubernetes.io/metadata.name": name}
        for name in ("monitoring", "default", config.job.namespace)
    }
    cluster = Cluster(policies, namespace_labels=namespaces)
    prometheus = Endpoint(
        "prometheus-k8s-0", "10.0.7.10", "monitoring", {"app.kubernetes.io/name": "prometheus"}
    )
    grafana = Endpoint("grafana", "10.0.7.11", "monitoring", {"app.kubernetes.io/name": "grafana"})
    worker0 = _with_metrics_port(_job_pods(result.one(JOB).inputs, 1, subnet=1))[0]
    dcgm, _ = _exporters(result)
    for target, port in ((worker0, TRAINER_METRICS_PORT), (dcgm, DCGM_PORT)):
        assert allowed(cluster, prometheus, target, port), target.name
        for other in (grafana, SCRAPER):
            assert not allowed(cluster, other, target, port), (other.name, target.name)
    assert not allowed(cluster, prometheus, worker0, RENDEZVOUS_PORT)
