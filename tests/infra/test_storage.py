"""Storage under the mock runtime: bucket hardening, FSx + S3 link, SG ports, CSI + Pod Identity,
static PV/PVC wiring, and what `dataPolicy` keeps on `pulumi destroy`."""

import json
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pytest

from infra.config.storage import StorageConfig, claim_name_for
from infra.offline import Evaluation, evaluate
from infra.offline.outputs import short_hash
from infra.platform.storage import Storage, StorageArgs

BUCKET = "aws:s3/bucket:Bucket"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ADDON = "aws:eks/addon:Addon"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
CLIENT_SG = "sg-0cluster"


def storage_program(data: dict[str, Any], *, owns_network: bool = True) -> Callable[[], None]:
    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="{}")
        agent = aws.eks.Addon(
            "pod-identity-agent", cluster_name="train", addon_name="eks-pod-identity-agent"
        )
        storage = Storage(
            "storage",
            StorageArgs(
                config=StorageConfig.model_validate(data),
                cluster_name="train",
                k8s_provider=provider,
                namespace="training",
                vpc_id="vpc-0abc",
                subnet_id="subnet-0gpu",
                client_security_group_ids=[CLIENT_SG],
                cluster_ready=[agent],
                owns_network=owns_network,
                tags={"project": "fsdp-eks"},
            ),
        )
        pulumi.export("bucketName", storage.bucket_name)
        pulumi.export("pvcName", storage.pvc_name)
        pulumi.export("mountPath", storage.mount_path)
        pulumi.export("ready", [resource.urn for resource in storage.ready])

    return program


def run(data: dict[str, Any] | None = None, **kwargs: Any) -> Evaluation:
    return evaluate(storage_program(data or {}, **kwargs), config={})


@pytest.fixture(scope="module")
def default() -> Evaluation:
    return run()


def one_for_bucket(result: Evaluation, token: str) -> dict[str, Any]:
    return result.one(token).inputs


def test_bucket_is_versioned_encrypted_private_and_tls_only(default):
    bucket = default.one(BUCKET)
    versioning = one_for_bucket(default, "aws:s3/bucketVersioning:BucketVersioning")
    assert versioning["versioningConfiguration"] == {"status": "Enabled"}
    encryption = one_for_bucket(
        default,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    )
    rule = encryption["rules"][0]["applyServerSideEncryptionByDefault"]
    assert rule["sseAlgorithm"] == "AES256"
    block = one_for_bucket(default, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for key in flags:
        assert block[key] is True, key
    ownership = one_for_bucket(default, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")
    assert ownership["rule"]["objectOwnership"] == "BucketOwnerEnforced"

    policy_resource = default.one("aws:s3/bucketPolicy:BucketPolicy")
    policy = json.loads(policy_resource.inputs["policy"])
    [statement] = policy["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    bucket_arn = bucket.outputs["arn"]
    assert sorted(statement["Resource"]) == [bucket_arn, f"{bucket_arn}/*"]
    assert default.depends_on(
        policy_resource, default.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    )
    assert default.stack_outputs["bucketName"] == bucket.outputs["bucket"]


def test_hardening_targets_the_created_bucket(default):
    bucket = default.one(BUCKET)
    for resource in default.resources:
        if resource.type.startswith("aws:s3/bucket") and resource.type != BUCKET:
            assert resource.inputs["bucket"] == f"{bucket.name}-id", resource.type
            assert resource.parent == bucket.parent


def test_file_system_is_persistent_2_in_the_gpu_subnet(default):
    fsx = default.one(FSX).inputs
    assert fsx["deploymentType"] == "PERSISTENT_2"
    assert fsx["fileSystemTypeVersion"] == "2.15"
    assert fsx["subnetIds"] == "subnet-0gpu"
    assert fsx["storageCapacity"] == 1200
    assert fsx["perUnitStorageThroughput"] == 125
    sg = default.one("aws:ec2/securityGroup:SecurityGroup")
    assert fsx["securityGroupIds"] == [f"sg-{short_hash(sg.name)}"]
    assert sg.inputs["vpcId"] == "vpc-0abc"


def test_file_system_waits_for_its_security_group(default):
    assert default.depends_on(default.one(FSX), default.one("aws:ec2/securityGroup:SecurityGroup"))


@pytest.mark.parametrize("owns_network", [True, False])
def test_file_system_waits_for_every_rule_of_its_security_group(owns_network):
    """CreateFileSystem validates the LNet rules synchronously (InvalidNetworkSettings, "... do
    not permit Lustre LNET network traffic on port 988": docs.aws.amazon.com/fsx/latest/
    LustreGuide/cannot-create-fs.html; aws/aws-parallelcluster#6181). Waiting for the group
    alone lets FSx race its rules, which are separate resources, so it must wait for each."""
    result = run(owns_network=owns_network)
    fsx = result.one(FSX)
    fsx_sg = fsx.inputs["securityGroupIds"][0]
    rules = [
        rule
        for rule in result.of_type(INGRESS) + result.of_type(EGRESS)
        if fsx_sg in (rule.inputs["securityGroupId"], rule.inputs["referencedSecurityGroupId"])
    ]
    # Self 988 and 1018-1023 in, client 988 and 1018-1023 in (both ways), egress to both.
    assert len(rules) == 8
    assert [rule.name for rule in rules if not result.depends_on(fsx, rule)] == []


def test_data_repository_association_links_the_bucket_both_ways():
    result = run({"fsx": {"dataRepositoryPrefix": "runs/", "fileSystemPath": "/data"}})
    dra = result.one(DRA)
    bucket_name = result.one(BUCKET).outputs["bucket"]
    assert dra.inputs["dataRepositoryPath"] == f"s3://{bucket_name}/runs/"
    assert dra.inputs["fileSystemPath"] == "/data"
    assert dra.inputs["fileSystemId"] == f"fs-{short_hash(result.one(FSX).name)}"
    assert dra.inputs["batchImportMetaDataOnCreate"] is True
    events = ["NEW", "CHANGED", "DELETED"]
    assert dra.inputs["s3"]["autoImportPolicy"]["events"] == events
    assert dra.inputs["s3"]["autoExportPolicy"]["events"] == events


@pytest.mark.parametrize(("prefix", "linked"), [("runs", "runs/"), ("a/b", "a/b/"), ("", "")])
def test_data_repository_prefix_is_a_directory(prefix, linked):
    result = run({"fsx": {"dataRepositoryPrefix": prefix}})
    bucket_name = result.one(BUCKET).outputs["bucket"]
    assert result.one(DRA).inputs["dataRepositoryPath"] == f"s3://{bucket_name}/{linked}"


def test_auto_import_and_export_can_be_switched_off():
    result = run({"fsx": {"autoImport": False, "autoExport": False}})
    s3 = result.one(DRA).inputs.get("s3") or {}
    assert "autoImportPolicy" not in s3 and "autoExportPolicy" not in s3


def _port_ranges(rules, **match):
    return sorted(
        (r.inputs["fromPort"], r.inputs["toPort"])
        for r in rules
        if all(r.inputs.get(k) == v for k, v in match.items())
    )


def test_lustre_ports_open_only_between_fsx_its_clients_and_itself(default):
    fsx_sg = default.one(FSX).inputs["securityGroupIds"][0]
    ingress = default.of_type(INGRESS)
    lustre = [(988, 988), (1018, 1023)]
    assert _port_ranges(ingress, securityGroupId=fsx_sg, referencedSecurityGroupId=fsx_sg) == lustre
    assert (
        _port_ranges(ingress, securityGroupId=fsx_sg, referencedSecurityGroupId=CLIENT_SG) == lustre
    )
    # Lustre servers call clients back: the clients' group admits the file system.
    assert (
        _port_ranges(ingress, securityGroupId=CLIENT_SG, referencedSecurityGroupId=fsx_sg) == lustre
    )
    for rule in ingress + default.of_type(EGRESS):
        assert rule.inputs["ipProtocol"] == "tcp"
        assert "cidrIpv4" not in rule.inputs and "cidrIpv6" not in rule.inputs
    assert len(ingress) == 6


def test_csi_addon_uses_pod_identity_for_the_controller_and_waits_for_the_agent(default):
    addon = default.one(ADDON, "storage-fsx-csi")
    assert addon.inputs["addonName"] == "aws-fsx-csi-driver"
    assert addon.inputs["clusterName"] == "train"
    assert "serviceAccountRoleArn" not in addon.inputs
    association = default.one(ASSOCIATION)
    assert association.inputs["namespace"] == "kube-system"
    assert association.inputs["serviceAccount"] == "fsx-csi-controller-sa"
    role = default.one("aws:iam/role:Role")
    assert association.inputs["roleArn"] == role.outputs["arn"]
    assert default.depends_on(addon, association)
    assert default.depends_on(addon, default.one(ADDON, "pod-identity-agent"))
    assert default.depends_on(association, default.one(ADDON, "pod-identity-agent"))
    # Never take over a driver installed by someone else (Helm) on a shared cluster.
    assert addon.inputs["resolveConflictsOnCreate"] == "NONE"


def test_csi_role_trusts_only_this_clusters_controller_and_touches_only_this_file_system(default):
    trust = json.loads(default.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    [statement] = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": "train",
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": "fsx-csi-controller-sa",
    }
    policy = json.loads(default.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    [grant] = policy["Statement"]
    assert grant["Resource"] == default.one(FSX).outputs["arn"]
    assert all(action.startswith("fsx:") and "*" not in action for action in grant["Action"])


def _statements(document: str) -> list[dict[str, Any]]:
    statements = json.loads(document)["Statement"]
    return statements if isinstance(statements, list) else [statements]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_allow_statement_grants_everything_on_everything(default):
    documents = [r.inputs["policy"] for r in default.of_type("aws:iam/rolePolicy:RolePolicy")]
    documents += [r.inputs["assumeRolePolicy"] for r in default.of_type("aws:iam/role:Role")]
    documents += [r.inputs["policy"] for r in default.of_type("aws:s3/bucketPolicy:BucketPolicy")]
    assert len(documents) == 3
    for document in documents:
        for statement in _statements(document):
            if statement["Effect"] != "Allow":
                continue
            actions = _as_list(statement.get("Action", []))
            resources = _as_list(statement.get("Resource", []))
            assert "*" not in actions, statement
            assert "*" not in resources, statement


def test_static_volume_points_at_the_file_system_and_the_claim_binds_to_it(default):
    fsx = default.one(FSX)
    volume = default.one(PV)
    csi = volume.inputs["spec"]["csi"]
    assert csi["driver"] == "fsx.csi.aws.com"
    assert csi["volumeHandle"] == f"fs-{short_hash(fsx.name)}"
    assert csi["volumeAttributes"] == {
        "dnsname": fsx.outputs["dnsName"],
        "mountname": fsx.outputs["mountName"],
    }
    assert volume.inputs["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume.inputs["spec"]["storageClassName"] == ""
    assert volume.inputs["spec"]["claimRef"] == {"namespace": "training", "name": "dev-fsx"}
    claim = default.one(PVC)
    assert claim.inputs["metadata"] == {"name": claim_name_for("dev"), "namespace": "training"}
    assert claim.inputs["spec"]["volumeName"] == volume.inputs["metadata"]["name"]
    assert claim.inputs["spec"]["storageClassName"] == ""
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim.inputs["spec"]["resources"]["requests"]["storage"] == "1200Gi"
    assert volume.inputs["spec"]["capacity"]["storage"] == "1200Gi"
    provider = default.one("pulumi:providers:kubernetes")
    assert claim.provider.startswith(provider.urn) and volume.provider.startswith(provider.urn)
    assert default.depends_on(claim, volume)
    assert default.stack_outputs["pvcName"] == "dev-fsx"
    assert default.stack_outputs["mountPath"] == "/fsx"


def test_ready_holds_the_csi_driver_and_the_claim(default):
    ready = set(default.stack_outputs["ready"])
    assert ready == {default.one(ADDON, "storage-fsx-csi").urn, default.one(PVC).urn}


@pytest.mark.parametrize(
    ("stack", "expected"),
    [("dev", "dev-fsx"), ("Llama_8B.p5", "llama-8b-p5-fsx"), ("___", "stack-fsx")],
)
def test_claim_names_are_valid_kubernetes_names(stack, expected):
    assert claim_name_for(stack) == expected


def _retained(result: Evaluation) -> set[str]:
    return {r.type for r in result.resources if r.retain_on_delete}


def test_retain_keeps_the_bucket_and_its_hardening_but_not_fsx_in_a_stack_owned_vpc(default):
    retained = _retained(default)
    assert BUCKET in retained
    assert "aws:s3/bucketPolicy:BucketPolicy" in retained
    assert "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock" in retained
    assert FSX not in retained
    assert default.one(BUCKET).inputs["forceDestroy"] is False


def test_retain_keeps_the_file_system_in_a_network_the_stack_does_not_own():
    result = run(owns_network=False)
    assert result.one(FSX).retain_on_delete
    assert result.one(DRA).retain_on_delete
    assert result.one("aws:ec2/securityGroup:SecurityGroup").retain_on_delete
    # A kept rule naming the cluster's group would block deleting that group.
    for rule in result.of_type(INGRESS) + result.of_type(EGRESS):
        if rule.inputs["referencedSecurityGroupId"] == CLIENT_SG or (
            rule.inputs["securityGroupId"] == CLIENT_SG
        ):
            assert not rule.retain_on_delete, rule.name


def test_delete_policy_retains_nothing_and_empties_the_bucket():
    result = run({"dataPolicy": "delete"}, owns_network=False)
    assert _retained(result) == set()
    assert result.one(BUCKET).inputs["forceDestroy"] is True
    assert result.one(FSX).inputs["skipFinalBackup"] is True


def test_existing_bucket_is_referenced_never_modified():
    result = run({"bucket": {"create": False, "name": "team-datasets"}})
    assert [r for r in result.resources if r.type.startswith("aws:s3/")] == []
    assert result.one(DRA).inputs["dataRepositoryPath"] == "s3://team-datasets/"
    assert result.stack_outputs["bucketName"] == "team-datasets"


def test_existing_claim_creates_no_file_system_or_driver():
    result = run({"fsx": {"existingClaimName": "shared-lustre", "installCsiDriver": True}})
    for token in (FSX, DRA, PV, PVC, ASSOCIATION):
        assert result.of_type(token) == [], token
    assert [a.name for a in result.of_type(ADDON)] == ["pod-identity-agent"]
    assert result.stack_outputs["pvcName"] == "shared-lustre"
    assert result.stack_outputs["ready"] == []


def test_without_fsx_there_is_no_volume():
    result = run({"fsx": {"enabled": False}})
    assert result.of_type(FSX) == [] and result.of_type(PVC) == []
    assert result.stack_outputs.get("pvcName") is None
    assert result.stack_outputs.get("mountPath") is None
    assert result.of_type(BUCKET) != []


def test_csi_driver_already_on_the_cluster_is_left_alone():
    result = run({"fsx": {"installCsiDriver": False}})
    assert [a.name for a in result.of_type(ADDON)] == ["pod-identity-agent"]
    assert result.of_type(ASSOCIATION) == [] and result.of_type("aws:iam/role:Role") == []
    assert len(result.of_type(PVC)) == 1
    assert result.stack_outputs["ready"] == [result.one(PVC).urn]


def test_addon_version_is_passed_when_pinned():
    result = run({"fsx": {"csiDriverVersion": "v1.5.0-eksbuild.1"}})
    assert result.one(ADDON, "storage-fsx-csi").inputs["addonVersion"] == "v1.5.0-eksbuild.1"


def test_wired_to_the_real_cluster_component():
    """FSx in the cluster's GPU subnet, Lustre open to the cluster SG, CSI after the agent."""
    from tests.infra.platform_util import real_platform

    def program() -> None:
        stack, cluster = real_platform({"instanceType": "p5.48xlarge", "count": 2})
        Storage(
            "storage",
            StorageArgs(
                config=stack.storage,
                cluster_name=cluster.name,
                k8s_provider=cluster.k8s_provider,
                namespace=stack.job.namespace,
                vpc_id=cluster.vpc_id,
                subnet_id=cluster.gpu_subnet_id,
                client_security_group_ids=[cluster.cluster_security_group_id],
                cluster_ready=cluster.ready,
            ),
        )
        pulumi.export("gpuSubnetId", cluster.gpu_subnet_id)
        pulumi.export("clusterSg", cluster.cluster_security_group_id)
        pulumi.export("clusterName", cluster.name)

    result = evaluate(program, config={"aws:region": "us-west-2"})
    outputs = result.stack_outputs
    fsx = result.one(FSX)
    assert fsx.inputs["subnetIds"] == outputs["gpuSubnetId"]
    fsx_sg = fsx.inputs["securityGroupIds"][0]
    client_rules = [
        r
        for r in result.of_type(INGRESS)
        if r.inputs["securityGroupId"] == fsx_sg
        and r.inputs["referencedSecurityGroupId"] == outputs["clusterSg"]
    ]
    assert len(client_rules) == 2
    addon = result.one(ADDON, "storage-fsx-csi")
    assert addon.inputs["clusterName"] == outputs["clusterName"]
    agent = result.one(ADDON, "platform-pod-identity-agent")
    assert agent.inputs["addonName"] == "eks-pod-identity-agent"
    assert result.depends_on(addon, agent)
    assert result.depends_on(result.one(ASSOCIATION), agent)
    claim = result.one(PVC)
    assert claim.provider.startswith(result.one("pulumi:providers:kubernetes").urn)


@pytest.mark.parametrize("policy", ["retain", "delete"])
def test_the_projects_guardrails_pass(policy):
    from infra.policy.offline import run_policies

    assert [str(v) for v in run_policies(run({"dataPolicy": policy}))] == []


LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"


@pytest.mark.parametrize("policy", ["retain", "delete"])
def test_run_bucket_prunes_noncurrent_versions_and_abandoned_uploads(policy):
    """Every checkpoint `keep_last` prunes becomes a noncurrent version of the versioned bucket,
    and a save cut short leaves multipart parts: without a lifecycle rule both bill for ever."""
    result = run({"dataPolicy": policy})
    lifecycle = result.one(LIFECYCLE)
    assert lifecycle.inputs["bucket"] == f"{result.one(BUCKET).name}-id"
    [rule] = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled"
    assert rule["filter"] == {}  # every key of the bucket
    assert rule["noncurrentVersionExpiration"]["noncurrentDays"] <= 7
    assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 1
    # Current objects (the run's checkpoints and exports) never expire.
    assert rule["expiration"] == {"expiredObjectDeleteMarker": True}
    # Noncurrent-version actions need versioning on: ordered after it.
    assert result.depends_on(lifecycle, result.one("aws:s3/bucketVersioning:BucketVersioning"))
    # A retained bucket keeps its rule (it goes on billing otherwise).
    assert lifecycle.retain_on_delete is (policy == "retain")
