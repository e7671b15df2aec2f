"""Add-ons under the mock runtime: pinned plugin charts on GPU nodes only, the operator with the
PyTorchJob scheme alone, CRD before Deployment, install switches that leave clusters alone."""

from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from infra.config.addons import TRAINING_OPERATOR_RELEASES, AddonsConfig
from infra.job.placement import Placement, gpu_placement
from infra.offline import Evaluation, evaluate
from infra.platform.addons import Addons, AddonsArgs, gpu_node_affinity
from infra.platform.training_operator import crd_url

RELEASE = "kubernetes:helm.sh/v3:Release"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
WEBHOOK = "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
SELECTOR = {"fsdp-eks/node-role": "gpu", "node.kubernetes.io/instance-type": "p5.48xlarge"}
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"},
]


def addons_program(data: dict[str, Any], *, efa: bool = True) -> Callable[[], None]:
    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="{}")
        nodes = k8s.core.v1.ConfigMap(
            "node-group-stand-in", opts=pulumi.ResourceOptions(provider=provider)
        )
        addons = Addons(
            "addons",
            AddonsArgs(
                config=AddonsConfig.model_validate(data),
                k8s_provider=provider,
                gpu_placement=Placement(SELECTOR, TOLERATIONS),
                efa_enabled=efa,
                cluster_ready=[nodes],
                operator_node_selector={"fsdp-eks/node-role": "system"},
            ),
        )
        pulumi.export("ready", [resource.urn for resource in addons.ready])

    return program


def run(data: dict[str, Any] | None = None, **kwargs: Any) -> Evaluation:
    return evaluate(addons_program(data or {}, **kwargs), config={})


@pytest.fixture(scope="module")
def default() -> Evaluation:
    return run()


def release(result: Evaluation, chart: str):
    [match] = [r for r in result.of_type(RELEASE) if r.inputs["chart"] == chart]
    return match


def test_plugin_charts_are_pinned_to_exact_versions(default):
    nvidia = release(default, "nvidia-device-plugin")
    assert nvidia.inputs["version"] == "0.18.2"
    assert nvidia.inputs["repositoryOpts"] == {"repo": "https://nvidia.github.io/k8s-device-plugin"}
    efa = release(default, "aws-efa-k8s-device-plugin")
    assert efa.inputs["version"] == "v0.5.30"
    assert efa.inputs["repositoryOpts"] == {"repo": "https://aws.github.io/eks-charts"}
    for plugin in (nvidia, efa):
        assert plugin.inputs["namespace"] == "kube-system"


def test_configured_versions_reach_the_releases():
    result = run(
        {"nvidiaDevicePlugin": {"version": "0.17.4"}, "efaDevicePlugin": {"version": "v0.5.18"}}
    )
    assert release(result, "nvidia-device-plugin").inputs["version"] == "0.17.4"
    assert release(result, "aws-efa-k8s-device-plugin").inputs["version"] == "v0.5.18"


def test_plugins_run_only_on_gpu_nodes_and_tolerate_their_taints(default):
    for chart in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        values = release(default, chart).inputs["values"]
        assert values["nodeSelector"] == SELECTOR, chart
        assert values["tolerations"] == TOLERATIONS, chart


def test_nvidia_affinity_replaces_the_charts_feature_discovery_default(default):
    values = release(default, "nvidia-device-plugin").inputs["values"]
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "fsdp-eks/node-role", "operator": "In", "values": ["gpu"]},
                {
                    "key": "node.kubernetes.io/instance-type",
                    "operator": "In",
                    "values": ["p5.48xlarge"],
                },
            ]
        }
    ]
    assert gpu_node_affinity({"a": "1"})["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "a", "operator": "In", "values": ["1"]}
    ]


def test_every_kubernetes_child_itself_waits_for_the_node_groups(default):
    """Each resource that talks to the cluster names the node groups in its own dependencies.

    `Evaluation.depends_on` also counts a parent component's `depends_on`, which the engine
    never sees for a child: pulumi `sdk/python/lib/pulumi/runtime/resource.py`
    `prepare_resource` sends only the resource's own `depends_on` (plus input dependencies),
    and `Resource.__init__` inherits protect and providers from the parent, not dependencies
    (pulumi/pulumi#8721: a component's dependencies do not hold back its children). So the
    check here is on each registration's own list. The operator's Deployment and Service,
    both awaited until their pod runs, raced the node groups before.
    """
    nodes = default.one("kubernetes:core/v1:ConfigMap")
    children = [
        r
        for r in default.resources
        if r.type.startswith("kubernetes:") and (r.custom or r.remote) and r.urn != nodes.urn
    ]
    assert {DEPLOYMENT, "kubernetes:core/v1:Service", CONFIG_FILE, RELEASE} <= {
        r.type for r in children
    }
    late = [f"{r.type} {r.name}" for r in children if nodes.urn not in r.dependencies]
    assert late == []


def test_plugins_wait_for_the_node_groups(default):
    nodes = default.one("kubernetes:core/v1:ConfigMap")
    for plugin in default.of_type(RELEASE):
        assert default.depends_on(plugin, nodes)


def test_no_efa_plugin_for_instances_without_efa():
    result = run(efa=False)
    assert [r.inputs["chart"] for r in result.of_type(RELEASE)] == ["nvidia-device-plugin"]


def test_operator_enables_only_the_pytorchjob_scheme_with_the_pinned_image(default):
    deployment = default.one(DEPLOYMENT)
    [container] = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489"
    assert container["args"] == ["--enable-scheme=pytorchjob"]
    env = {item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"]}
    assert env["MY_POD_NAMESPACE"] == "metadata.namespace"
    pod = deployment.inputs["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "training-operator"
    assert pod["nodeSelector"] == {"fsdp-eks/node-role": "system"}
    assert pod["volumes"][0]["secret"]["secretName"] == "training-operator-webhook-cert"
    assert deployment.inputs["metadata"]["namespace"] == "kubeflow"


def test_operator_image_override():
    result = run(
        {"trainingOperator": {"image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/to:v1.9.0"}}
    )
    [container] = result.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith("/to:v1.9.0")


def test_only_the_pytorchjob_crd_is_applied_from_the_release_commit(default):
    """Pinned by the commit of tag v1.9.4 in kubeflow/trainer (the renamed repository), not
    by the tag: a tag can be moved, a commit's content cannot."""
    crd = default.one(CONFIG_FILE)
    assert crd.remote
    assert crd.inputs["file"] == crd_url(TRAINING_OPERATOR_RELEASES["v1.9.4"])
    assert crd.inputs["file"] == (
        "https://raw.githubusercontent.com/kubeflow/trainer/"
        "4445c12aa62e4345b0c2c6ac9b215a70eca46ed7/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    )
    assert "mpijob" not in crd.inputs["file"]


def test_webhook_validates_pytorchjobs_only(default):
    webhook = default.one(WEBHOOK)
    assert webhook.inputs["metadata"]["name"] == "validator.training-operator.kubeflow.org"
    [entry] = webhook.inputs["webhooks"]
    assert entry["rules"][0]["resources"] == ["pytorchjobs"]
    assert entry["clientConfig"]["service"] == {
        "name": "training-operator",
        "namespace": "kubeflow",
        "path": "/validate-kubeflow-org-v1-pytorchjob",
    }
    assert "caBundle" not in entry["clientConfig"]


def test_cluster_role_covers_pytorchjobs_and_no_other_job_kind(default):
    role = default.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    kubeflow = [
        resource
        for rule in role.inputs["rules"]
        if "kubeflow.org" in rule["apiGroups"]
        for resource in rule["resources"]
    ]
    assert sorted(kubeflow) == ["pytorchjobs", "pytorchjobs/finalizers", "pytorchjobs/status"]
    for rule in role.inputs["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]


def test_deployment_waits_for_crd_rbac_secret_and_webhook(default):
    deployment = default.one(DEPLOYMENT)
    for token in (
        CONFIG_FILE,
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
        "kubernetes:core/v1:Secret",
        WEBHOOK,
    ):
        assert default.depends_on(deployment, default.one(token)), token
    # Namespaced children read their namespace from the Namespace resource.
    assert default.depends_on(deployment, default.one("kubernetes:core/v1:Namespace"))
    assert default.depends_on(deployment, default.one("kubernetes:core/v1:ConfigMap"))


def test_service_does_not_block_the_deployment(default):
    # Pulumi waits for a Service's endpoints: the Deployment must not wait for the Service.
    assert not default.depends_on(
        default.one(DEPLOYMENT), default.one("kubernetes:core/v1:Service")
    )


def test_every_kubernetes_child_uses_the_stack_provider(default):
    provider = default.one("pulumi:providers:kubernetes")
    for resource in default.resources:
        if resource.type.startswith("kubernetes:") and (resource.custom or resource.remote):
            assert resource.provider.startswith(provider.urn), resource.type


def test_ready_holds_plugins_crd_operator_and_service(default):
    expected = {r.urn for r in default.of_type(RELEASE)}
    expected |= {
        default.one(CONFIG_FILE).urn,
        default.one(DEPLOYMENT).urn,
        default.one("kubernetes:core/v1:Service").urn,
    }
    assert set(default.stack_outputs["ready"]) == expected


def test_install_switches_leave_an_existing_clusters_addons_alone():
    result = run(
        {
            "nvidiaDevicePlugin": {"install": False},
            "efaDevicePlugin": {"install": False},
            "trainingOperator": {"install": False},
        }
    )
    kubernetes = [r for r in result.resources if r.type.startswith("kubernetes:")]
    assert [r.type for r in kubernetes] == ["kubernetes:core/v1:ConfigMap"]
    assert result.stack_outputs["ready"] == []


def test_only_the_missing_addon_is_installed():
    result = run({"nvidiaDevicePlugin": {"install": False}, "efaDevicePlugin": {"install": False}})
    assert result.of_type(RELEASE) == []
    assert len(result.of_type(DEPLOYMENT)) == 1


def test_an_empty_gpu_selector_is_refused():
    def program() -> None:
        Addons(
            "addons",
            AddonsArgs(
                config=AddonsConfig(),
                k8s_provider=k8s.Provider("k8s", kubeconfig="{}"),
                gpu_placement=Placement({}, []),
                efa_enabled=True,
            ),
        )

    with pytest.raises(ValueError, match="no node selector"):
        evaluate(program, config={})


def test_wired_to_the_real_cluster_component():
    """The plugins select the cluster's GPU nodes, tolerate its taints and wait for its nodes."""
    from tests.infra.platform_util import real_platform

    def program() -> None:
        stack, cluster = real_platform(
            {
                "instanceType": "p5.48xlarge",
                "count": 2,
                "taints": [{"key": "team", "value": "ml"}],
            }
        )
        Addons(
            "addons",
            AddonsArgs(
                config=stack.addons,
                k8s_provider=cluster.k8s_provider,
                gpu_placement=gpu_placement(stack.gpu_nodes),
                efa_enabled=stack.gpu_nodes.efa_enabled,
                cluster_ready=cluster.ready,
            ),
        )

    result = evaluate(program, config={"aws:region": "us-west-2"})
    gpu_nodes = result.one("aws:eks/nodeGroup:NodeGroup", "platform-gpu-nodes")
    for plugin in result.of_type(RELEASE):
        values = plugin.inputs["values"]
        assert values["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
        # Every taint the node group was created with is tolerated.
        keys = {t["key"] for t in values["tolerations"]}
        assert {t["key"] for t in gpu_nodes.inputs["taints"]} == keys == {"nvidia.com/gpu", "team"}
        assert result.depends_on(plugin, gpu_nodes)
    assert len(result.of_type(RELEASE)) == 2
    assert result.depends_on(result.one(DEPLOYMENT), gpu_nodes)
    # The ~600 KB PyTorchJob CRD needs server-side apply: the provider must not switch it off.
    provider = result.one("pulumi:providers:kubernetes")
    assert provider.inputs.get("enableServerSideApply") in (None, True, "true")


def test_the_projects_guardrails_pass(default):
    from infra.policy.offline import run_policies

    assert [str(v) for v in run_policies(default)] == []
