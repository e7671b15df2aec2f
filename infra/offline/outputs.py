"""Realistic outputs for resources and invokes, so an offline evaluation reads like a real plan.

The values follow AWS's formats (ARNs, IDs, FSx DNS names, ECR URLs) so that code deriving
strings from them (kubeconfigs, PV specs, image URIs, IAM policies) is exercised as it would be
in `pulumi up`. IDs are derived from the resource name, which keeps evaluations deterministic.
`aws:iam/getPolicyDocument` renders the real JSON, because IAM checks read the policy text.

Helpers that add a resource type with outputs the program reads: add a rule to
`RESOURCE_OUTPUTS` (type token → function of name and inputs); keep the rules alphabetical.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pulumi.runtime import mocks as pulumi_mocks

from infra.facts.eks_versions import DEFAULT_KUBERNETES_VERSION
from infra.facts.instances import INSTANCE_FACTS
from infra.job.kubeconfig import exec_kubeconfig

ACCOUNT_ID = "123456789012"
DEPLOYER_ARN = f"arn:aws:iam::{ACCOUNT_ID}:user/deployer"
"""The offline caller identity: who runs `pulumi up` is only known at preview."""
DEFAULT_REGION = "us-west-2"
"""The region of a stack file without `aws:region` (the AWS provider would use the
environment's; offline there is none)."""
_DIRECTIONS = {
    "north": "n",
    "south": "s",
    "east": "e",
    "west": "w",
    "central": "c",
    "northeast": "ne",
    "southeast": "se",
    "northwest": "nw",
    "southwest": "sw",
}


@dataclass(frozen=True)
class MockRegion:
    """The region the fake cloud answers for: the stack's `aws:region`, so that the AZs,
    subnets, endpoints and ARNs of an offline plan are the ones `pulumi up` would see."""

    name: str = DEFAULT_REGION

    @property
    def partition(self) -> str:
        """The ARN partition of the region (`aws`, `aws-cn`, `aws-us-gov`)."""
        if self.name.startswith("cn-"):
            return "aws-cn"
        return "aws-us-gov" if self.name.startswith("us-gov-") else "aws"

    @property
    def az_names(self) -> list[str]:
        return [f"{self.name}{suffix}" for suffix in "abcd"]

    @property
    def az_ids(self) -> list[str]:
        """AZ IDs as AWS spells them (`usw2-az1`, `apse2-az1`, `euc1-az1`): geography,
        direction initials, number."""
        geography, direction, number = [*self.name.split("-"), "", "", ""][:3]
        code = f"{geography}{_DIRECTIONS.get(direction, direction[:1])}{number}"
        return [f"{code}-az{i}" for i in range(1, 5)]


_region = MockRegion()


def region() -> MockRegion:
    """The region of the evaluation under way (`FakeCloud(region=...)` sets it)."""
    return _region


def short_hash(text: str, length: int = 17) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def arn(service: str, resource: str, *, region_name: str | None = None) -> str:
    return (
        f"arn:{_region.partition}:{service}:{region_name or _region.name}:{ACCOUNT_ID}:{resource}"
    )


OutputRule = Callable[[str, dict[str, Any]], dict[str, Any]]


def _eks_cluster(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    cluster_name = inputs.get("name", name)
    # Endpoint and issuer belong to the cluster (its EKS name), so a look-up by name
    # (`aws.eks.get_cluster`) answers the same ones the creating resource reported.
    cluster_id = short_hash(cluster_name, 32).upper()
    issuer = f"https://oidc.eks.{_region.name}.amazonaws.com/id/{cluster_id}"
    return {
        "arn": arn("eks", f"cluster/{cluster_name}"),
        "name": cluster_name,
        "endpoint": f"https://{cluster_id}.gr7.{_region.name}.eks.amazonaws.com",
        "certificateAuthority": {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
        "identities": [{"oidcs": [{"issuer": issuer}]}],
        "vpcConfig": {
            **inputs.get("vpcConfig", {}),
            "clusterSecurityGroupId": f"sg-{short_hash(name + 'cluster')}",
            "vpcId": inputs.get("vpcConfig", {}).get("vpcId", f"vpc-{short_hash(name)}"),
        },
        "version": inputs.get("version", DEFAULT_KUBERNETES_VERSION),
        "status": "ACTIVE",
    }


def _pulumi_eks_cluster(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    eks = _eks_cluster(name, inputs)
    # pulumi-eks's own kubeconfig output, in the shape of the project's one builder: the
    # program reads neither (it builds its provider's from `aws.eks.get_cluster`).
    kubeconfig = exec_kubeconfig(
        eks["name"], eks["endpoint"], eks["certificateAuthority"]["data"], _region.name
    )
    issuer = eks["identities"][0]["oidcs"][0]["issuer"]
    return {
        "kubeconfig": kubeconfig,
        "kubeconfigJson": json.dumps(kubeconfig),
        "clusterSecurityGroupId": eks["vpcConfig"]["clusterSecurityGroupId"],
        "nodeSecurityGroupId": f"sg-{short_hash(name + 'node')}",
        "oidcProviderArn": f"arn:aws:iam::{ACCOUNT_ID}:oidc-provider/{issuer.removeprefix('https://')}",
        "oidcProviderUrl": issuer,
        "oidcIssuer": issuer.removeprefix("https://"),
        # `eksCluster`, `core` and other resource-typed outputs are left unset: with references
        # off they cannot be typed, so the program reads the scalar outputs above instead.
    }


RESOURCE_OUTPUTS: dict[str, OutputRule] = {
    "aws:cloudwatch/logGroup:LogGroup": lambda name, inputs: {
        "arn": arn("logs", f"log-group:{inputs.get('name', name)}"),
        "name": inputs.get("name", name),
    },
    "aws:codebuild/project:Project": lambda name, inputs: {
        "arn": arn("codebuild", f"project/{inputs.get('name', name)}"),
        "name": inputs.get("name", name),
    },
    "aws:ec2/launchTemplate:LaunchTemplate": lambda name, inputs: {
        "id": f"lt-{short_hash(name)}",
        "latestVersion": 1,
        "arn": arn("ec2", f"launch-template/lt-{short_hash(name)}"),
    },
    "aws:ec2/placementGroup:PlacementGroup": lambda name, inputs: {
        "id": inputs.get("name", name),
        "name": inputs.get("name", name),
        "arn": arn("ec2", f"placement-group/{inputs.get('name', name)}"),
    },
    "aws:ec2/securityGroup:SecurityGroup": lambda name, inputs: {
        "id": f"sg-{short_hash(name)}",
        "arn": arn("ec2", f"security-group/sg-{short_hash(name)}"),
    },
    "aws:ec2/subnet:Subnet": lambda name, inputs: {
        "id": f"subnet-{short_hash(name)}",
        "arn": arn("ec2", f"subnet/subnet-{short_hash(name)}"),
    },
    "aws:ec2/vpc:Vpc": lambda name, inputs: {
        "id": f"vpc-{short_hash(name)}",
        "arn": arn("ec2", f"vpc/vpc-{short_hash(name)}"),
        "defaultSecurityGroupId": f"sg-{short_hash(name + 'default')}",
        "mainRouteTableId": f"rtb-{short_hash(name + 'main')}",
    },
    "aws:ecr/repository:Repository": lambda name, inputs: {
        "arn": arn("ecr", f"repository/{inputs.get('name', name)}"),
        "name": inputs.get("name", name),
        "repositoryUrl": (
            f"{ACCOUNT_ID}.dkr.ecr.{_region.name}.amazonaws.com/{inputs.get('name', name)}"
        ),
        "registryId": ACCOUNT_ID,
    },
    "aws:eks/cluster:Cluster": _eks_cluster,
    "aws:eks/nodeGroup:NodeGroup": lambda name, inputs: {
        "arn": arn("eks", f"nodegroup/{inputs.get('clusterName', 'cluster')}/{name}"),
        "nodeGroupName": inputs.get("nodeGroupName", name),
        "status": "ACTIVE",
        # DescribeNodegroup `resources.autoScalingGroups`: EKS names the group's ASG
        # `eks-<node group>-<uuid>`.
        "resources": [
            {"autoscalingGroups": [{"name": f"eks-{name}-{short_hash(name + 'asg', 8)}"}]}
        ],
    },
    "aws:fsx/lustreFileSystem:LustreFileSystem": lambda name, inputs: {
        "id": f"fs-{short_hash(name)}",
        "arn": arn("fsx", f"file-system/fs-{short_hash(name)}"),
        "dnsName": f"fs-{short_hash(name)}.fsx.{_region.name}.amazonaws.com",
        "mountName": short_hash(name + "mount", 8),
    },
    "aws:iam/role:Role": lambda name, inputs: {
        "arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{inputs.get('name', name)}",
        "name": inputs.get("name", name),
        "uniqueId": f"AROA{short_hash(name, 16).upper()}",
    },
    "aws:iam/policy:Policy": lambda name, inputs: {
        "arn": f"arn:aws:iam::{ACCOUNT_ID}:policy/{inputs.get('name', name)}",
    },
    "aws:kms/key:Key": lambda name, inputs: {
        "arn": arn("kms", f"key/{short_hash(name, 32)}"),
        "keyId": short_hash(name, 32),
    },
    "aws:s3/bucket:Bucket": lambda name, inputs: {
        "bucket": inputs.get("bucket", f"{name}-{short_hash(name, 7)}"),
        "arn": f"arn:aws:s3:::{inputs.get('bucket', f'{name}-{short_hash(name, 7)}')}",
        "bucketRegionalDomainName": (
            f"{inputs.get('bucket', name)}.s3.{_region.name}.amazonaws.com"
        ),
    },
    "eks:index:Cluster": _pulumi_eks_cluster,
    # The image build's dynamic resource: the digest CodeBuild would report for the tag.
    "pulumi-python:dynamic/image:ImageBuild": lambda name, inputs: {
        "image_digest": f"sha256:{short_hash(str(inputs.get('image_tag')), 64)}",
        "image_uri": (
            f"{inputs.get('repository_url')}@sha256:{short_hash(str(inputs.get('image_tag')), 64)}"
        ),
        "build_id": f"{inputs.get('project_name')}:{short_hash(name, 32)}",
    },
}


def _policy_document(args: dict[str, Any]) -> dict[str, Any]:
    """`aws.iam.get_policy_document` → the IAM JSON the real provider would render."""
    statements = []
    for stmt in args.get("statements", []):
        rendered: dict[str, Any] = {"Effect": stmt.get("effect", "Allow")}
        if "sid" in stmt:
            rendered["Sid"] = stmt["sid"]
        for key, out in (
            ("actions", "Action"),
            ("notActions", "NotAction"),
            ("resources", "Resource"),
            ("notResources", "NotResource"),
        ):
            if key in stmt:
                values = stmt[key]
                rendered[out] = values[0] if len(values) == 1 else values
        for key, out in (("principals", "Principal"), ("notPrincipals", "NotPrincipal")):
            if key in stmt:
                principal: dict[str, Any] = {}
                for entry in stmt[key]:
                    ids = entry["identifiers"]
                    principal[entry["type"]] = ids[0] if len(ids) == 1 else ids
                rendered[out] = "*" if principal == {"*": "*"} else principal
        if "conditions" in stmt:
            condition: dict[str, dict[str, Any]] = {}
            for entry in stmt["conditions"]:
                values = entry["values"]
                condition.setdefault(entry["test"], {})[entry["variable"]] = (
                    values[0] if len(values) == 1 else values
                )
            rendered["Condition"] = condition
        statements.append(rendered)
    document = {"Version": "2012-10-17", "Statement": statements}
    minified = json.dumps(document, separators=(",", ":"))
    return {"json": json.dumps(document), "minifiedJson": minified}


def _instance_type(args: dict[str, Any]) -> dict[str, Any]:
    instance_type = args["instanceType"]
    facts = INSTANCE_FACTS.get(instance_type)
    if facts is None:  # a CPU type (the system nodes')
        return {
            "instanceType": instance_type,
            "gpuses": [],
            "efaSupported": False,
            "supportedArchitectures": ["x86_64"],
        }
    return {
        "instanceType": instance_type,
        "supportedArchitectures": ["x86_64"],
        "defaultVcpus": facts.vcpus,
        "memorySize": facts.memory_gib * 1024,
        # pulumi-aws names the list `gpuses` (its pluralisation of the `gpus` block).
        "gpuses": [
            {
                "count": facts.gpus,
                "manufacturer": "NVIDIA",
                "name": facts.gpu_model,
                "memorySize": facts.gpu_memory_gib * 1024,
            }
        ],
        "efaSupported": facts.efa_interfaces > 0,
        "efaMaximumInterfaces": facts.efa_interfaces,
        "maximumNetworkCards": max(facts.efa_interfaces, 1),
    }


def _existing_cluster(args: dict[str, Any]) -> dict[str, Any]:
    eks = _eks_cluster(args["name"], {"name": args["name"]})
    return {
        **eks,
        "id": args["name"],
        "certificateAuthorities": [eks["certificateAuthority"]],
        "vpcConfigs": [
            {
                **eks["vpcConfig"],
                "subnetIds": [
                    f"subnet-{short_hash(args['name'] + az)}" for az in _region.az_names[:3]
                ],
                "securityGroupIds": [],
                "endpointPrivateAccess": True,
                "endpointPublicAccess": True,
                "publicAccessCidrs": ["0.0.0.0/0"],
            }
        ],
        "roleArn": f"arn:aws:iam::{ACCOUNT_ID}:role/{args['name']}-cluster",
        "accessConfigs": [{"authenticationMode": "API_AND_CONFIG_MAP"}],
    }


INVOKE_RESULTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "aws:ec2/getInstanceType:getInstanceType": _instance_type,
    "aws:eks/getCluster:getCluster": _existing_cluster,
    "aws:iam/getPolicyDocument:getPolicyDocument": _policy_document,
    "aws:index/getAvailabilityZones:getAvailabilityZones": lambda args: {
        "names": _region.az_names,
        "zoneIds": _region.az_ids,
        "id": _region.name,
    },
    "aws:index/getCallerIdentity:getCallerIdentity": lambda args: {
        "accountId": ACCOUNT_ID,
        "arn": DEPLOYER_ARN,
        "userId": "AIDAEXAMPLE",
        "id": ACCOUNT_ID,
    },
    "aws:index/getPartition:getPartition": lambda args: {
        "partition": _region.partition,
        "dnsSuffix": "amazonaws.com.cn" if _region.partition == "aws-cn" else "amazonaws.com",
        "id": _region.partition,
    },
    "aws:index/getRegion:getRegion": lambda args: {
        "name": _region.name,
        "region": _region.name,
        "id": _region.name,
        "endpoint": f"ec2.{_region.name}.amazonaws.com",
    },
    "aws:ssm/getParameter:getParameter": lambda args: {
        "name": args["name"],
        "value": f"ami-{short_hash(args['name'])}",
        "type": "String",
        "id": args["name"],
    },
}


class FakeCloud(pulumi_mocks.Mocks):
    """Answers registrations and invokes with AWS-shaped values; records the invokes made."""

    def __init__(self, region_name: str | None = None) -> None:
        global _region
        self.invokes: list[tuple[str, dict[str, Any]]] = []
        self.region = MockRegion(region_name or DEFAULT_REGION)
        _region = self.region  # one evaluation at a time: the program runs to completion

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        rule = RESOURCE_OUTPUTS.get(args.typ)
        outputs = rule(args.name, dict(args.inputs)) if rule else {}
        resource_id = str(outputs.pop("id", f"{args.name}-id"))
        return resource_id, {**args.inputs, **outputs}

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        self.invokes.append((args.token, dict(args.args)))
        handler = INVOKE_RESULTS.get(args.token)
        return (handler(dict(args.args)) if handler else {}), []


# --- PLATFORM-A: network look-ups, the deployer's role, platform stack outputs -----------------


def _subnet(args: dict[str, Any]) -> dict[str, Any]:
    subnet_id = args.get("id", "subnet-unknown")
    return {
        "id": subnet_id,
        "arn": arn("ec2", f"subnet/{subnet_id}"),
        "availabilityZone": _region.az_names[0],
        "availabilityZoneId": _region.az_ids[0],
        "vpcId": f"vpc-{short_hash(subnet_id)}",
        "cidrBlock": "10.0.128.0/18",
    }


def _session_context(args: dict[str, Any]) -> dict[str, Any]:
    """An assumed-role session ARN → the role's IAM ARN, as `aws.iam.get_session_context` does."""
    session_arn = args["arn"]
    if ":assumed-role/" not in session_arn:
        return {"arn": session_arn, "issuerArn": session_arn, "id": session_arn}
    role_name, session_name = session_arn.split(":assumed-role/", 1)[1].split("/", 1)
    return {
        "arn": session_arn,
        "issuerArn": f"arn:aws:iam::{ACCOUNT_ID}:role/{role_name}",
        "issuerName": role_name,
        "sessionName": session_name,
        "id": session_arn,
    }


def _addon_version(args: dict[str, Any]) -> dict[str, Any]:
    """EKS's default version of an add-on for a Kubernetes version (`aws eks
    describe-addon-versions`): a made-up build whose minor is the Kubernetes minor, so a
    change of `cluster.kubernetesVersion` shows as a change of add-on version."""
    minor = str(args.get("kubernetesVersion", "1.0")).split(".")[-1]
    version = f"v1.{minor}.0-eksbuild.1"
    return {**args, "version": version, "id": args.get("addonName", "addon")}


def _capacity_block(args: dict[str, Any]) -> dict[str, Any]:
    """An active 4 x p5 block in the first AZ that ends long after any plan: the offline plan
    checks a block's fit, not AWS's calendar (tests pass their own dates to `block_problems`)."""
    return {
        "id": args.get("id", "cr-unknown"),
        "instanceType": "p5.48xlarge",
        "availabilityZone": _region.az_names[0],
        "instanceCount": 4,
        "startDate": "2026-11-01T11:30:00Z",
        "endDate": "2099-01-01T11:30:00Z",
        "state": "active",
        "reservationType": "capacity-block",
    }


INVOKE_RESULTS["aws:ec2/getSubnet:getSubnet"] = _subnet
INVOKE_RESULTS["aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation"] = _capacity_block
INVOKE_RESULTS["aws:iam/getSessionContext:getSessionContext"] = _session_context
INVOKE_RESULTS["aws:eks/getAddonVersion:getAddonVersion"] = _addon_version
RESOURCE_OUTPUTS["pulumi:pulumi:StackReference"] = lambda name, inputs: {
    # What a create-mode stack of this project exports (see infra/program.py).
    "outputs": {
        "clusterName": f"{inputs.get('name', name).rsplit('/', 1)[-1]}-cluster",
        "gpuSubnetId": f"subnet-{short_hash(inputs.get('name', name) + 'gpu')}",
        "vpcId": f"vpc-{short_hash(inputs.get('name', name))}",
    },
    "secretOutputNames": [],
}


def _existing_cluster_v7(args: dict[str, Any]) -> dict[str, Any]:
    """pulumi-aws 7's getCluster returns one `vpcConfig` object, subnets and all."""
    result = _existing_cluster(args)
    return {**result, "vpcConfig": result["vpcConfigs"][0]}


INVOKE_RESULTS["aws:eks/getCluster:getCluster"] = _existing_cluster_v7
OFFLINE_NODE_GROUP = "offline-example-gpu"
"""Offline, an existing cluster's node groups are unknown: the fake cloud answers with one
managed group, named for what it is, that offers every GPU type and can scale to zero."""
INVOKE_RESULTS["aws:eks/getNodeGroups:getNodeGroups"] = lambda args: {
    "clusterName": args["clusterName"],
    "names": [OFFLINE_NODE_GROUP],
    "id": args["clusterName"],
}
INVOKE_RESULTS["aws:eks/getNodeGroup:getNodeGroup"] = lambda args: {
    "clusterName": args["clusterName"],
    "nodeGroupName": args["nodeGroupName"],
    "instanceTypes": sorted(INSTANCE_FACTS),
    "scalingConfigs": [{"minSize": 0, "desiredSize": 0, "maxSize": 64}],
    "status": "ACTIVE",
    "id": f"{args['clusterName']}:{args['nodeGroupName']}",
}


# --- Instance type offerings per AZ ----------------------------------------------------------

OFFERINGS_CHECKED_ON = "2026-11-23"
AZ_IDS_WITHOUT_GPU_TYPES = frozenset({"usw2-az4"})  # us-west-2 only
"""The one offerings fact this mock region carries, keyed by AZ ID (AZ names map to different
physical zones in every account; IDs do not). usw2-az4 lacks many instance types: the
terraform-provider-aws acceptance tests exclude it for that reason ("Many instance types are
not available in this availability zone"), and the SageMaker HyperPod workshop's
troubleshooting page (awsome-distributed-training) reports that it does not offer g5.12xlarge.
That none of the GPU types in infra/facts/instances.py is offered there, and all are in the other
three, is this mock's simplification, not a measurement: at deploy time the real
`DescribeInstanceTypeOfferings` answers (checked on OFFERINGS_CHECKED_ON)."""


def _offered_az_ids(instance_type: str) -> list[str]:
    if instance_type in INSTANCE_FACTS:
        return [az_id for az_id in _region.az_ids if az_id not in AZ_IDS_WITHOUT_GPU_TYPES]
    return list(_region.az_ids)  # CPU types (system nodes): everywhere


def _instance_type_offerings(args: dict[str, Any]) -> dict[str, Any]:
    """`aws.ec2.get_instance_type_offerings` for the mock region, by the location type asked."""
    wanted: list[str] = []
    for entry in args.get("filters", []):
        if entry["name"] == "instance-type":
            wanted += entry["values"]
    location_type = args.get("locationType", "region")
    names = dict(zip(_region.az_ids, _region.az_names, strict=True))
    rows: list[tuple[str, str]] = []
    for instance_type in wanted:
        az_ids = _offered_az_ids(instance_type)
        if location_type == "availability-zone-id":
            rows += [(instance_type, az_id) for az_id in az_ids]
        elif location_type == "availability-zone":
            rows += [(instance_type, names[az_id]) for az_id in az_ids]
        elif az_ids:
            rows.append((instance_type, _region.name))
    return {
        "instanceTypes": [row[0] for row in rows],
        "locations": [row[1] for row in rows],
        "locationTypes": [location_type] * len(rows),
        "locationType": location_type,
        "id": _region.name,
    }


INVOKE_RESULTS["aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"] = (
    _instance_type_offerings
)


# --- OBSERVABILITY: the metrics workspace and its managed scraper ---------------------------


def _amp_workspace(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    workspace_id = f"ws-{short_hash(name)}"
    return {
        "id": workspace_id,
        "arn": arn("aps", f"workspace/{workspace_id}"),
        "prometheusEndpoint": (
            f"https://aps-workspaces.{_region.name}.amazonaws.com/workspaces/{workspace_id}/"
        ),
    }


def _amp_scraper(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    scraper_id = f"s-{short_hash(name)}"
    return {
        "id": scraper_id,
        "arn": arn("aps", f"scraper/{scraper_id}"),
        # AMP's service-linked role for the scraper (AMP-collector-how-to, "roleArn").
        "roleArn": f"arn:aws:iam::{ACCOUNT_ID}:role/aws-service-role/scraper.aps.amazonaws.com/"
        f"AWSServiceRoleForAmazonPrometheusScraper_{short_hash(name)}",
    }


RESOURCE_OUTPUTS["aws:amp/workspace:Workspace"] = _amp_workspace
RESOURCE_OUTPUTS["aws:amp/scraper:Scraper"] = _amp_scraper
INVOKE_RESULTS["aws:ec2/getVpc:getVpc"] = lambda args: {
    "id": args.get("id", "vpc-unknown"),
    "cidrBlock": "10.0.0.0/16",
    "arn": arn("ec2", f"vpc/{args.get('id', 'vpc-unknown')}"),
}
INVOKE_RESULTS["aws:amp/getWorkspace:getWorkspace"] = lambda args: {
    "id": args["workspaceId"],
    "workspaceId": args["workspaceId"],
    "arn": arn("aps", f"workspace/{args['workspaceId']}"),
    "prometheusEndpoint": (
        f"https://aps-workspaces.{_region.name}.amazonaws.com/workspaces/{args['workspaceId']}/"
    ),
    "status": "ACTIVE",
}
