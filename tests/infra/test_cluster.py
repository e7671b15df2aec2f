"""The cluster: an owned, encrypted, API-auth EKS platform, or a look-up that owns nothing."""

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import settings

from infra.config import StackConfigError, read_stack_file
from infra.config.cluster import ClusterConfig, GpuNodesConfig
from infra.job.kubeconfig import same_iam_principal
from infra.offline import Evaluation, FakeCloud, evaluate
from infra.offline.outputs import ACCOUNT_ID, INVOKE_RESULTS, RESOURCE_OUTPUTS, short_hash
from infra.platform.cluster import Cluster, ClusterArgs, default_cluster_name
from infra.platform.network import Network, NetworkArgs
from infra.program import main as program

EKS = "eks:index:Cluster"
MNG = "eks:index:ManagedNodeGroup"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"
ADMIN_ROLE = f"arn:aws:iam::{ACCOUNT_ID}:role/platform-admins"
GPU = {"instanceType": "p5.48xlarge", "count": 2, "availabilityZone": "us-west-2b"}
K8S_PROVIDER = "pulumi:providers:kubernetes"
STACKS = Path(__file__).resolve().parents[2] / "stacks"


def unsecret(value: Any) -> Any:
    """The plain value of an input that was sent as a Pulumi secret."""
    if isinstance(value, dict) and "value" in value and len(value) == 2:
        return value["value"]
    return value


def build(
    cluster: dict[str, Any], gpu: dict[str, Any] | None = None, fake: FakeCloud | None = None
) -> Evaluation:
    cluster_config = ClusterConfig.model_validate(cluster)
    gpu_config = GpuNodesConfig.model_validate(gpu or GPU)

    def program() -> None:
        network = None
        if cluster_config.mode == "create":
            network = Network(
                "net",
                NetworkArgs(
                    config=cluster_config.network,
                    gpu_availability_zone=gpu_config.availability_zone,
                    gpu_instance_type=gpu_config.instance_type,
                ),
            )
        platform = Cluster(
            "platform", ClusterArgs(cluster=cluster_config, gpu_nodes=gpu_config, network=network)
        )
        pulumi.export("name", platform.name)
        pulumi.export("kubeconfig", platform.kubeconfig)
        pulumi.export("clusterSg", platform.cluster_security_group_id)
        pulumi.export("oidc", platform.oidc_provider_arn)
        pulumi.export("vpcId", platform.vpc_id)
        pulumi.export("gpuSubnet", platform.gpu_subnet_id)
        pulumi.export("efa", platform.efa_interfaces_per_node)
        pulumi.export("ready", [r.urn for r in platform.ready])

    return evaluate(program, config={}, fake_cloud=fake)


@pytest.fixture(scope="module")
def created() -> Evaluation:
    return build({"name": "train", "adminRoleArn": ADMIN_ROLE})


def test_api_authentication_with_an_admin_access_entry(created: Evaluation) -> None:
    cluster = created.one(EKS).inputs
    assert cluster["authenticationMode"] == "API"
    entry = cluster["accessEntries"]["admin"]
    assert entry["principalArn"] == ADMIN_ROLE
    policy = entry["accessPolicies"]["cluster-admin"]
    assert policy["policyArn"] == (
        "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    )
    assert policy["accessScope"] == {"type": "cluster"}


def test_deployer_is_not_given_a_second_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The deployer (caller identity → session issuer) is admitted as cluster creator; an
    # explicit entry for the same principal would collide.
    deployer = f"arn:aws:iam::{ACCOUNT_ID}:role/ci-deployer"
    real = INVOKE_RESULTS["aws:index/getCallerIdentity:getCallerIdentity"]

    def assumed_role(args: dict[str, Any]) -> dict[str, Any]:
        return {**real(args), "arn": f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/ci-deployer/run-7"}

    monkeypatch.setitem(
        INVOKE_RESULTS, "aws:index/getCallerIdentity:getCallerIdentity", assumed_role
    )
    result = build({"name": "train", "adminRoleArn": deployer})
    assert result.one(EKS).inputs.get("accessEntries", {}) == {}
    tokens = [token for token, _ in result.invokes]
    assert "aws:iam/getSessionContext:getSessionContext" in tokens


def test_deployer_role_with_a_path_is_recognised_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SSO roles: the session issuer carries the path, users write the ARN without it.
    sso = "AWSReservedSSO_Admin_0123456789abcdef"
    real_caller = INVOKE_RESULTS["aws:index/getCallerIdentity:getCallerIdentity"]
    real_session = INVOKE_RESULTS["aws:iam/getSessionContext:getSessionContext"]

    def caller(args: dict[str, Any]) -> dict[str, Any]:
        return {**real_caller(args), "arn": f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/{sso}/me"}

    def session(args: dict[str, Any]) -> dict[str, Any]:
        issuer = f"arn:aws:iam::{ACCOUNT_ID}:role/aws-reserved/sso.amazonaws.com/{sso}"
        return {**real_session(args), "issuerArn": issuer}

    monkeypatch.setitem(INVOKE_RESULTS, "aws:index/getCallerIdentity:getCallerIdentity", caller)
    monkeypatch.setitem(INVOKE_RESULTS, "aws:iam/getSessionContext:getSessionContext", session)
    same = build({"name": "train", "adminRoleArn": f"arn:aws:iam::{ACCOUNT_ID}:role/{sso}"})
    other = build({"name": "train", "adminRoleArn": ADMIN_ROLE})
    assert same.one(EKS).inputs.get("accessEntries", {}) == {}
    assert list(other.one(EKS).inputs["accessEntries"]) == ["admin"]


def test_same_iam_principal_ignores_paths_but_not_names_kinds_or_accounts() -> None:
    role = f"arn:aws:iam::{ACCOUNT_ID}:role/ops"
    assert same_iam_principal(role, f"arn:aws:iam::{ACCOUNT_ID}:role/team/a/ops")
    assert not same_iam_principal(role, f"arn:aws:iam::{ACCOUNT_ID}:role/ops2")
    assert not same_iam_principal(role, f"arn:aws:iam::{ACCOUNT_ID}:user/ops")
    assert not same_iam_principal(role, "arn:aws:iam::210987654321:role/ops")


def test_secrets_encrypted_with_a_rotating_key_the_control_plane_may_use(
    created: Evaluation,
) -> None:
    key = created.one("aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    cluster = created.one(EKS).inputs
    assert cluster["encryptionConfigKeyArn"] == key.outputs["arn"]
    role = created.one("aws:iam/role:Role", "platform-control-plane")
    # a resource input is sent as its URN (components) or ID (custom resources)
    assert cluster["serviceRole"] in (role.urn, f"{role.name}-id")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "eks.amazonaws.com"}
    (policy,) = created.of_type("aws:iam/rolePolicy:RolePolicy")
    statement = json.loads(policy.inputs["policy"])["Statement"][0]
    assert statement["Resource"] == key.outputs["arn"]
    assert all(action.startswith("kms:") for action in statement["Action"])


def test_an_existing_key_is_used_and_none_created() -> None:
    key_arn = f"arn:aws:kms:us-west-2:{ACCOUNT_ID}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    result = build({"name": "train", "secretsKmsKeyArn": key_arn})
    assert result.of_type("aws:kms/key:Key") == []
    assert result.one(EKS).inputs["encryptionConfigKeyArn"] == key_arn


def test_control_plane_logs_go_to_a_log_group_the_stack_owns(created: Evaluation) -> None:
    cluster = created.one(EKS)
    assert cluster.inputs["enabledClusterLogTypes"] == ["api", "audit", "authenticator"]
    group = created.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == "/aws/eks/train/cluster"
    assert group.inputs["retentionInDays"] == 30
    assert created.depends_on(cluster, group)


def test_no_logs_no_log_group() -> None:
    result = build({"name": "train", "logTypes": []})
    assert result.of_type("aws:cloudwatch/logGroup:LogGroup") == []
    assert result.one(EKS).inputs.get("enabledClusterLogTypes", []) == []


def test_version_endpoint_access_and_subnets_from_config() -> None:
    result = build(
        {
            "name": "train",
            "kubernetesVersion": "1.34",
            "endpointPublicAccess": True,
            "publicAccessCidrs": ["203.0.113.0/24"],
        }
    )
    cluster = result.one(EKS).inputs
    assert cluster["version"] == "1.34"
    assert cluster["endpointPrivateAccess"] is True
    assert cluster["publicAccessCidrs"] == ["203.0.113.0/24"]
    assert cluster["createOidcProvider"] is True
    assert cluster["skipDefaultNodeGroup"] is True
    assert len(cluster["privateSubnetIds"]) == 2
    private = result.one(EKS).inputs["privateSubnetIds"]
    assert all(s.startswith("subnet-") for s in private)
    private_only = build({"name": "train", "endpointPublicAccess": False}).one(EKS).inputs
    assert private_only["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in private_only


def test_default_version_upgrades_at_the_end_of_standard_support(created: Evaluation) -> None:
    # EKS's own default policy is EXTENDED: billed extra once the version leaves standard support.
    cluster = created.one(EKS).inputs
    assert cluster["version"] == "1.35"
    assert cluster["upgradePolicy"] == {"supportType": "STANDARD"}
    assert created.one(NODE_GROUP).inputs["version"] == "1.35"


def pulumi_eks_node_group_version(inputs: dict[str, Any], cluster_version: str) -> str | None:
    """The `version` pulumi-eks gives a ManagedNodeGroup's EKS node group: its own, else the
    cluster's, but never the cluster's beside a launch template (pulumi/pulumi-eks v4.3.0
    `nodejs/eks/nodes/nodegroup.ts` `createManagedNodeGroupInternal`: "default the version to
    the cluster version if not provided ... if the user doesn't provide a launch template").
    EKS then fixes the group at the version it was created with."""
    if "version" in inputs:
        return str(inputs["version"])
    return None if "launchTemplate" in inputs else cluster_version


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_every_node_group_follows_the_kubernetes_version(version: str) -> None:
    """Bumping `cluster.kubernetesVersion` upgrades the control plane and every node group,
    the system group (on its own launch template) included."""
    result = build({"name": "train", "kubernetesVersion": version})
    assert result.one(EKS).inputs["version"] == version
    system = result.one(MNG, "platform-system").inputs
    assert "launchTemplate" in system
    assert pulumi_eks_node_group_version(system, version) == version
    assert result.one(NODE_GROUP).inputs["version"] == version


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_coredns_and_the_node_monitoring_agent_are_eks_add_ons_that_follow_the_version(
    version: str,
) -> None:
    """pulumi-eks creates no CoreDNS add-on without a default node group (v4.3.0
    `nodejs/eks/cluster/cluster.ts`), so EKS's self-managed copy would never be upgraded; both
    add-ons take EKS's default version for the cluster's Kubernetes version, asked of EKS."""
    result = build({"name": "train", "kubernetesVersion": version})
    system = result.one(MNG, "platform-system")
    asked = {
        args["addonName"]: args
        for token, args in result.invokes
        if token == "aws:eks/getAddonVersion:getAddonVersion"
    }
    for addon_name, resource_name in (
        ("coredns", "platform-coredns"),
        ("eks-node-monitoring-agent", "platform-node-monitoring-agent"),
    ):
        addon = result.one(ADDON, resource_name)
        assert addon.inputs["addonName"] == addon_name
        assert addon.inputs["clusterName"] == "train"
        assert asked[addon_name]["kubernetesVersion"] == version
        assert not asked[addon_name].get("mostRecent")  # EKS's default, not the newest
        assert addon.inputs["addonVersion"] == f"v1.{version.split('.')[1]}.0-eksbuild.1"
        assert result.depends_on(addon, system)  # its pods need nodes to become ACTIVE
    coredns = result.one(ADDON, "platform-coredns").inputs
    # Takes over the Deployment EKS installed at creation, and keeps DNS if ever removed.
    assert coredns["resolveConflictsOnCreate"] == "OVERWRITE"
    assert coredns["preserve"] is True
    assert result.one(ADDON, "platform-coredns").urn in result.stack_outputs["ready"]


def test_an_existing_cluster_gets_neither_add_on() -> None:
    result = build({"mode": "existing", "name": "team-gpu"})
    assert result.of_type(ADDON) == []


def test_default_name_is_project_and_stack() -> None:
    assert build({}).one(EKS).inputs["name"] == "fsdp-eks-dev"
    assert default_cluster_name("fsdp-eks", "llama.8b") == "fsdp-eks-llama-8b"


def test_system_node_group_for_add_ons(created: Evaluation) -> None:
    system = created.one(MNG, "platform-system").inputs
    assert system["cluster"] == created.one(EKS).urn
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert system["instanceTypes"] == ["m6i.xlarge"]
    assert system["scalingConfig"] == {"desiredSize": 2, "minSize": 1, "maxSize": 4}
    assert "taints" not in system  # add-ons and operators schedule here without tolerations


LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
PULUMI_EKS_LT_ARGS = ("enableIMDSv2", "userData", "amiId", "enableEfaSupport")
"""Inputs that make pulumi-eks build a managed group's launch template itself (v4.3.0
`nodejs/eks/nodes/nodegroup.ts` `customLaunchTemplateArgs`, `requiresCustomLaunchTemplate`)."""


def imds_hop_limit(group: dict[str, Any], templates: dict[str, dict[str, Any]]) -> int:
    """The IMDS hop limit a managed node group's nodes get.

    Its own launch template's, when given; else pulumi-eks's, whose `metadataOptions` set
    `httpPutResponseHopLimit: 2` (`createMNGCustomLaunchTemplate`); else the one EKS generates
    from the AL2023 AMI, registered with ImdsSupport v2.0, which EC2 launches with hop limit 2.
    """
    template = group.get("launchTemplate")
    if template is not None:
        return int(templates[template["id"]]["metadataOptions"]["httpPutResponseHopLimit"])
    return 2


def test_system_nodes_answer_imds_to_their_own_processes_only(created: Evaluation) -> None:
    """Hop limit 1, as on the GPU nodes: no pod on a system node (the autoscaler, CoreDNS,
    the operator, anything a user schedules there) can read the node role's credentials."""
    system = created.one(MNG, "platform-system").inputs
    # The mock's ids (infra/offline/outputs.py RESOURCE_OUTPUTS).
    templates = {f"lt-{short_hash(t.name)}": t.inputs for t in created.of_type(LAUNCH_TEMPLATE)}
    assert imds_hop_limit(system, templates) == 1
    assert not any(key in system for key in PULUMI_EKS_LT_ARGS)
    # EKS refuses a node group's disk size beside a launch template: the template has it.
    assert "diskSize" not in system
    template = templates[system["launchTemplate"]["id"]]
    assert template["metadataOptions"]["httpTokens"] == "required"
    [root] = template["blockDeviceMappings"]
    assert (root["deviceName"], root["ebs"]["volumeSize"]) == ("/dev/xvda", 50)
    assert root["ebs"]["encrypted"] == "true"


def test_gpu_nodes_in_the_gpu_subnet_after_the_cluster(created: Evaluation) -> None:
    node_group = created.one(NODE_GROUP)
    assert node_group.inputs["clusterName"] == "train"
    gpu_subnet = created.one("aws:ec2/subnet:Subnet", "net-gpu")
    assert gpu_subnet.inputs["availabilityZone"] == "us-west-2b"
    assert node_group.inputs["subnetIds"] == [created.stack_outputs["gpuSubnet"]]
    assert created.one(EKS).urn in node_group.dependencies
    template = created.one("aws:ec2/launchTemplate:LaunchTemplate", "platform-gpu-lt").inputs
    for nic in template["networkInterfaces"]:
        assert created.stack_outputs["clusterSg"] in nic["securityGroups"]
    assert created.stack_outputs["efa"] == 32


def test_node_groups_and_cluster_wait_for_their_role_policies(created: Evaluation) -> None:
    attachments = created.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    gpu = created.one(NODE_GROUP)
    system = created.one(MNG, "platform-system")
    cluster = created.one(EKS)
    # Declared on the resources themselves: a component's depends_on does not reach children.
    for attachment in attachments:
        if attachment.name.startswith("platform-gpu-nodes"):
            assert attachment.urn in gpu.dependencies
        elif attachment.name.startswith("platform-system-nodes"):
            assert attachment.urn in system.dependencies
        else:
            assert attachment.urn in cluster.dependencies
    assert created.one("aws:iam/rolePolicy:RolePolicy").urn in cluster.dependencies


def test_node_roles_are_scoped(created: Evaluation) -> None:
    roles = {r.name: r for r in created.of_type("aws:iam/role:Role")}
    assert set(roles) == {"platform-control-plane", "platform-system-nodes", "platform-gpu-nodes"}
    for name in ("platform-system-nodes", "platform-gpu-nodes"):
        trust = json.loads(roles[name].inputs["assumeRolePolicy"])
        assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    attached = sorted(
        a.inputs["policyArn"].rsplit("/", 1)[1]
        for a in created.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith("platform-gpu-nodes")
    )
    assert attached == [
        "AmazonEC2ContainerRegistryPullOnly",
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
    ]


def test_no_wildcard_action_on_wildcard_resource(created: Evaluation) -> None:
    documents = [
        json.loads(r.inputs["policy"]) for r in created.of_type("aws:iam/rolePolicy:RolePolicy")
    ] + [json.loads(r.inputs["assumeRolePolicy"]) for r in created.of_type("aws:iam/role:Role")]
    assert documents
    for document in documents:
        for statement in document["Statement"]:
            actions = statement.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            assert "*" not in actions
            assert not ("*" in str(statement.get("Resource")) and any("*" in a for a in actions))


def test_pod_identity_agent_installed_and_ready(created: Evaluation) -> None:
    addon = created.one(ADDON, "platform-pod-identity-agent")
    assert addon.inputs["addonName"] == "eks-pod-identity-agent"
    assert addon.inputs["clusterName"] == "train"
    assert created.depends_on(addon, created.one(MNG, "platform-system"))
    assert addon.urn in created.stack_outputs["ready"]
    assert created.one(NODE_GROUP).urn in created.stack_outputs["ready"]
    assert created.one(MNG, "platform-system").urn in created.stack_outputs["ready"]


def test_kubernetes_provider(created: Evaluation) -> None:
    provider = created.one("pulumi:providers:kubernetes")
    kubeconfig = json.loads(unsecret(provider.inputs["kubeconfig"]))
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:2] == ["eks", "get-token"]


def test_capacity_block_through_the_cluster() -> None:
    result = build(
        {"name": "train"},
        {**GPU, "capacity": {"type": "block", "reservationId": "cr-0123456789abcdef0"}},
    )
    assert result.one(NODE_GROUP).inputs["capacityType"] == "CAPACITY_BLOCK"
    assert result.of_type("aws:ec2/placementGroup:PlacementGroup") == []


def test_create_mode_requires_the_network() -> None:
    def program() -> None:
        Cluster(
            "platform",
            ClusterArgs(
                cluster=ClusterConfig.model_validate({}),
                gpu_nodes=GpuNodesConfig.model_validate(GPU),
            ),
        )

    try:
        with pytest.raises(ValueError, match="needs the Network component"):
            evaluate(program, config={})
    finally:
        # A failed run leaves pending outputs in the SDK's process-wide set (see test_gpu_nodes).
        settings.SETTINGS.outputs.clear()


# -- existing mode ---------------------------------------------------------------------------


def test_existing_cluster_creates_nothing_it_does_not_own() -> None:
    result = build({"mode": "existing", "name": "team-gpu"})
    owned = [r.type for r in result.resources if r.custom]
    assert owned == ["pulumi:providers:kubernetes"]
    assert result.of_type(EKS) == result.of_type("aws:ec2/vpc:Vpc") == []
    assert ("aws:eks/getCluster:getCluster", {"name": "team-gpu"}) in result.invokes
    assert result.stack_outputs["name"] == "team-gpu"
    assert result.stack_outputs["vpcId"].startswith("vpc-")
    assert result.stack_outputs["clusterSg"].startswith("sg-")
    assert result.stack_outputs["oidc"].startswith(
        f"arn:aws:iam::{ACCOUNT_ID}:oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/"
    )
    assert result.stack_outputs["ready"] == []
    assert result.stack_outputs["efa"] == 32
    # no configured subnet, no platform stack: the cluster's first subnet
    assert result.stack_outputs["gpuSubnet"] == f"subnet-{short_hash('team-gpu' + 'us-west-2a')}"


@pytest.mark.parametrize(
    ("gpu", "warned"),
    [
        (GPU, True),  # p5: 32 EFA interfaces
        ({"instanceType": "g5.xlarge", "count": 1, "availabilityZone": "us-west-2b"}, False),
        ({**GPU, "efa": False}, False),
    ],
)
def test_existing_cluster_with_efa_warns_about_locked_memory(gpu: dict[str, Any], warned: bool):
    """Only the launch template this project creates lifts RLIMIT_MEMLOCK (gpu_nodes.py
    NODE_CONFIG); the AMI's base runtime spec sets only RLIMIT_NOFILE (awslabs/amazon-eks-ami
    `nodeadm/internal/containerd/base-runtime-spec.json`). A team cluster's EFA nodes most
    likely fail the preflight: `pulumi preview` and the plan say so first, in one line."""
    result = build({"mode": "existing", "name": "team-gpu"}, gpu)
    lines = [w for w in result.warnings if "RLIMIT_MEMLOCK" in w]
    assert len(lines) == (1 if warned else 0)
    if warned:
        [line] = lines
        assert "\n" not in line
        assert line.startswith("cluster.mode existing with EFA (p5.48xlarge)")
        assert "fsdp-eks validate dev --skip nccl" in line  # the stack evaluated
        assert "spec.containerd.baseRuntimeSpec" in line
    # A created cluster's GPU nodes lift the limit themselves: no warning there.
    assert not [w for w in build({"name": "train"}, gpu).warnings if "RLIMIT_MEMLOCK" in w]


def test_existing_cluster_kubeconfig_uses_aws_eks_get_token() -> None:
    result = build({"mode": "existing", "name": "team-gpu"})
    kubeconfig = json.loads(result.stack_outputs["kubeconfig"])
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"].startswith("https://")
    assert cluster["certificate-authority-data"]
    args = kubeconfig["users"][0]["user"]["exec"]["args"]
    assert args == [
        "eks", "get-token", "--cluster-name", "team-gpu", "--region", "us-west-2",
        "--output", "json",
    ]  # fmt: skip
    provider = result.one("pulumi:providers:kubernetes")
    assert json.loads(unsecret(provider.inputs["kubeconfig"])) == kubeconfig


def test_existing_cluster_reads_the_platform_stack() -> None:
    result = build(
        {"mode": "existing", "name": "team-gpu", "platformStack": "org/fsdp-eks/platform"}
    )
    # A StackReference is read, not registered; the fake answers with the platform's outputs.
    expected = f"subnet-{short_hash('org/fsdp-eks/platform' + 'gpu')}"
    assert result.stack_outputs["gpuSubnet"] == expected
    assert [r.type for r in result.resources if r.custom] == ["pulumi:providers:kubernetes"]


def test_a_platform_stack_without_a_gpu_subnet_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = RESOURCE_OUTPUTS["pulumi:pulumi:StackReference"]

    def without_subnet(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        answer = real(name, inputs)
        outputs = {k: v for k, v in answer["outputs"].items() if k != "gpuSubnetId"}
        return {**answer, "outputs": outputs}

    monkeypatch.setitem(RESOURCE_OUTPUTS, "pulumi:pulumi:StackReference", without_subnet)
    result = build({"mode": "existing", "name": "team-gpu", "platformStack": "org/fsdp-eks/old"})
    assert result.stack_outputs["gpuSubnet"] == f"subnet-{short_hash('team-gpu' + 'us-west-2a')}"
    assert any(
        "cluster.platformStack 'org/fsdp-eks/old' exports no gpuSubnetId" in w
        for w in result.warnings
    )


def test_existing_cluster_with_a_configured_subnet_and_the_agent() -> None:
    result = build(
        {
            "mode": "existing",
            "name": "team-gpu",
            "podIdentityAgent": True,
            "network": {"gpuSubnetId": "subnet-fsx"},
        }
    )
    assert result.stack_outputs["gpuSubnet"] == "subnet-fsx"
    addon = result.one(ADDON)
    assert addon.inputs["clusterName"] == "team-gpu"
    assert result.stack_outputs["ready"] == [addon.urn]


# -- who the Kubernetes provider is ---------------------------------------------------------


def run_stack(name: str, *, cluster: dict[str, Any], **config: Any) -> Evaluation:
    """The real program on stack file `name`, its cluster section extended, `config` added."""
    stack = read_stack_file(name, STACKS)
    entries = {**stack.config, **config}
    entries["fsdp-eks:cluster"] = {**entries.get("fsdp-eks:cluster", {}), **cluster}
    return evaluate(program, config=entries, stack=stack.stack_name)


def token_command(result: Evaluation) -> list[str]:
    """`aws <args>` the Kubernetes provider runs for a token, from its kubeconfig."""
    kubeconfig = json.loads(unsecret(result.one(K8S_PROVIDER).inputs["kubeconfig"]))
    (user,) = kubeconfig["users"]
    return [user["user"]["exec"]["command"], *user["user"]["exec"]["args"]]


def test_created_clusters_provider_signs_with_the_stacks_profile_as_the_admin_role() -> None:
    # aws:profile reaches the AWS provider only; pulumi-eks's kubeconfigJson drops it, so with
    # other ambient credentials every Kubernetes call was signed by someone else.
    result = run_stack("dev", cluster={"adminRoleArn": ADMIN_ROLE}, **{"aws:profile": "ml-lab"})
    command = token_command(result)
    assert command[:3] == ["aws", "eks", "get-token"]
    assert command[command.index("--cluster-name") + 1] == "fsdp-eks-dev"
    assert command[command.index("--profile") + 1] == "ml-lab"
    assert command[command.index("--role-arn") + 1] == ADMIN_ROLE


def test_created_clusters_provider_keeps_the_cluster_pulumi_eks_reported() -> None:
    # pulumi-kubernetes replaces every Kubernetes resource when the kubeconfig's active cluster
    # (server, CA) changes; moving off kubeconfigJson must change only the user.
    result = run_stack("dev", cluster={"adminRoleArn": ADMIN_ROLE})
    ours = json.loads(unsecret(result.one(K8S_PROVIDER).inputs["kubeconfig"]))
    theirs = result.one(EKS).outputs["kubeconfig"]
    assert ours["clusters"][0]["cluster"] == theirs["clusters"][0]["cluster"]


def test_no_profile_no_profile_flag_and_the_admin_role_is_not_assumed_by_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = INVOKE_RESULTS["aws:index/getCallerIdentity:getCallerIdentity"]

    def as_admin_role(args: dict[str, Any]) -> dict[str, Any]:
        session = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/platform-admins/ci-run-7"
        return {**real(args), "arn": session}

    monkeypatch.setitem(
        INVOKE_RESULTS, "aws:index/getCallerIdentity:getCallerIdentity", as_admin_role
    )
    # CI running as the admin role itself: a role may not assume itself unless its trust
    # policy names it, so the token is signed directly.
    command = token_command(run_stack("dev", cluster={"adminRoleArn": ADMIN_ROLE}))
    assert "--role-arn" not in command
    assert "--profile" not in command


def test_existing_clusters_provider_signs_with_the_profile_and_the_admin_role() -> None:
    role = f"arn:aws:iam::{ACCOUNT_ID}:role/ml-team-admins"
    result = run_stack("team-cluster", cluster={"adminRoleArn": role}, **{"aws:profile": "ml"})
    command = token_command(result)
    assert command[command.index("--cluster-name") + 1] == "ml-team-cluster"
    assert command[command.index("--profile") + 1] == "ml"
    assert command[command.index("--role-arn") + 1] == role


def test_creating_a_cluster_without_an_admin_role_is_reported() -> None:
    """The program's warning (`pulumi.log.warn`), as the offline evaluation keeps it."""
    warned = "\n".join(build({"name": "train"}).warnings)
    assert "cluster.adminRoleArn is not set: only the principal creating the cluster" in warned
    assert f"arn:aws:iam::{ACCOUNT_ID}:user/deployer" in warned
    warned = "\n".join(build({"name": "train", "adminRoleArn": ADMIN_ROLE}).warnings)
    assert "cluster.adminRoleArn is not set" not in warned


GET_INSTANCE_TYPE = "aws:ec2/getInstanceType:getInstanceType"


class EC2WithoutTheType(FakeCloud):
    """EC2 as it answers DescribeInstanceTypes for a type it does not have: the invoke fails
    (the provider's error comes back as the invoke's failure)."""

    def call(self, args: Any) -> tuple[dict[str, Any], list[Any]]:
        if args.token == GET_INSTANCE_TYPE and args.args.get("instanceType") == "m6j.xlarge":
            self.invokes.append((args.token, dict(args.args)))
            return {}, [("instanceType", "InvalidInstanceType: m6j.xlarge does not exist")]
        return super().call(args)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("unknown", r"'m6j\.xlarge': EC2 does not describe it in this region"),
        ("arm64", r"'m6j\.xlarge' runs arm64 architecture, but the system nodes' AMI"),
    ],
)
def test_ec2_is_asked_about_the_system_type_before_the_control_plane(
    answer: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that passes the config model's pattern but that EC2 lacks (or an arm64 one) is
    refused before anything of the cluster is registered, not by CreateNodegroup after the
    control plane's 10 minutes."""
    real = INVOKE_RESULTS[GET_INSTANCE_TYPE]

    def arm64(args: dict[str, Any]) -> dict[str, Any]:
        return {**real(args), "supportedArchitectures": ["arm64"]}

    if answer == "arm64":
        monkeypatch.setitem(INVOKE_RESULTS, GET_INSTANCE_TYPE, arm64)
    fake = EC2WithoutTheType() if answer == "unknown" else None
    try:
        with pytest.raises(StackConfigError, match=message):
            build({"name": "train", "systemNodes": {"instanceType": "m6j.xlarge"}}, fake=fake)
    finally:
        settings.SETTINGS.outputs.clear()  # the failed run's pending outputs (test_gpu_nodes)
    monkeypatch.setitem(INVOKE_RESULTS, GET_INSTANCE_TYPE, real)
    asked = [args for token, args in build({"name": "train"}).invokes if token == GET_INSTANCE_TYPE]
    assert "m6i.xlarge" in [args["instanceType"] for args in asked]
