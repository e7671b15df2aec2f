"""Storage for a training run: the S3 bucket, FSx for Lustre linked to it, and the job's claim.

The bucket is the durable home of data and checkpoints; FSx for Lustre, linked to it by a data
repository association, is the POSIX view every pod mounts through a static PV and claim (no
StorageClass, no surprise second file system). `storage.dataPolicy` `retain` (default) keeps
them on destroy (only the bucket when the stack owns the VPC); `delete` removes them. The job
mounts `pvc_name` at `mount_path` and depends on `ready`.
Why and construction: docs/design/platform.md#storage
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.storage import StorageConfig, claim_name_for
from infra.platform.bucket import guard_bucket
from infra.platform.iam import pod_identity_role

LUSTRE_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
"""TCP ports Lustre (LNet) uses between clients and the file system servers."""

FSX_CSI_ADDON = "aws-fsx-csi-driver"
FSX_CSI_DRIVER = "fsx.csi.aws.com"
FSX_CSI_NAMESPACE = "kube-system"
FSX_CSI_CONTROLLER_SA = "fsx-csi-controller-sa"
"""Service account of the driver's controller, the one Pod Identity maps to the role."""

LUSTRE_VERSION = "2.15"
"""Lustre server version; AL2023 nodes ship a 2.15 client, which cannot mount 2.10 servers."""

FILE_EVENTS = ["NEW", "CHANGED", "DELETED"]

NONCURRENT_RUN_DAYS = 7
"""Days S3 keeps an overwritten or deleted object of the run bucket (a noncurrent version).

Every checkpoint `keep_last` prunes becomes one (the bucket is versioned), at the full price of
a checkpoint (hundreds of GB for a large model): a week is time to notice and recover a
mistaken delete, and bounds what pruned checkpoints bill to a week of storage each."""
INCOMPLETE_UPLOAD_DAYS = 1
"""Days before S3 aborts a multipart upload nobody completed (a save cut short by a stop); its
parts bill like objects but are invisible to listings. A day is far beyond any real upload."""


@dataclass
class StorageArgs:
    """What the storage component needs from the config and from the cluster."""

    config: StorageConfig
    cluster_name: pulumi.Input[str]
    k8s_provider: k8s.Provider
    namespace: pulumi.Input[str]
    """Namespace of the job's claim; pass a Namespace resource's output so the claim waits."""
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    """The GPU nodes' subnet: FSx sits in the same AZ as its clients."""
    client_security_group_ids: Sequence[pulumi.Input[str]]
    """Security groups of the nodes that mount the file system (e.g. the cluster SG)."""
    cluster_ready: Sequence[pulumi.Resource] = ()
    """What the CSI add-on must wait for (the node groups, the pod identity agent add-on)."""
    owns_network: bool = True
    """Whether the stack created the VPC the file system sits in (see the data policy note)."""
    tags: Mapping[str, str] = field(default_factory=dict)


class Storage(pulumi.ComponentResource):
    """S3 bucket (+ hardening), FSx for Lustre with its S3 link, FSx CSI add-on, PV and claim."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    file_system_id: pulumi.Output[str] | None
    pvc_name: pulumi.Output[str] | None
    """Claim the job mounts, in the job's namespace; None when the run uses no Lustre volume."""
    mount_path: str | None
    """Where the job mounts the claim (`storage.fsx.mountPath`); None without a volume."""
    ready: list[pulumi.Resource]
    """What the job must wait for before its pods can mount the volume."""

    def __init__(
        self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:storage:Storage", name, None, opts)
        self._name = name
        self._args = args
        config = args.config
        retain = config.data_policy == "retain"

        self.bucket_name, self.bucket_arn = self._bucket(retain)
        self.file_system_id = None
        self.pvc_name = None
        self.mount_path = config.fsx.mount_path if config.fsx.enabled else None
        self.ready = []

        if config.fsx.existing_claim_name is not None:
            self.pvc_name = pulumi.Output.from_input(config.fsx.existing_claim_name)
        elif config.fsx.creates_file_system:
            # A retained file system would pin ENIs in a subnet the stack is about to delete.
            retain_fsx = retain and not args.owns_network
            file_system = self._file_system(retain_fsx)
            self.file_system_id = file_system.id
            if config.fsx.install_csi_driver:
                self.ready.append(self._csi_driver(file_system))
            claim = self._static_claim(file_system)
            self.pvc_name = claim.metadata.apply(lambda meta: str(meta.name))
            self.ready.append(claim)

        outputs: dict[str, Any] = {
            "bucketName": self.bucket_name,
            "bucketArn": self.bucket_arn,
            "mountPath": self.mount_path,
        }
        if self.file_system_id is not None:
            outputs["fileSystemId"] = self.file_system_id
        if self.pvc_name is not None:
            outputs["pvcName"] = self.pvc_name
        self.register_outputs(outputs)

    def _opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)

    # -- S3 -------------------------------------------------------------------------------

    def _bucket(self, retain: bool) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        """The bucket and, for a bucket the stack creates, its hardening resources.

        An existing bucket is only referenced: its policy, encryption and versioning belong to
        whoever created it.
        """
        bucket_config = self._args.config.bucket
        if not bucket_config.create:
            assert bucket_config.name is not None  # the config model guarantees it
            partition = aws.get_partition_output().partition
            name = pulumi.Output.from_input(bucket_config.name)
            return name, pulumi.Output.concat("arn:", partition, ":s3:::", name)

        keep = {"retain_on_delete": True} if retain else {}
        bucket = aws.s3.Bucket(
            f"{self._name}-bucket",
            bucket=bucket_config.name,
            # `delete` means delete: empty the bucket (all versions) so destroy succeeds.
            force_destroy=not retain,
            tags=dict(self._args.tags),
            opts=self._opts(**keep),
        )
        # The hardening is retained with the bucket: a kept bucket must stay private.
        guards = guard_bucket(f"{self._name}-bucket", bucket, self._opts(**keep), bucket_key=True)
        tls_only = pulumi.Output.json_dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "DenyInsecureTransport",
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "s3:*",
                        "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ],
            }
        )
        aws.s3.BucketPolicy(
            f"{self._name}-bucket-tls-only",
            bucket=bucket.id,
            policy=tls_only,
            # S3 rejects policy writes that race the public access block being applied.
            opts=self._opts(depends_on=[guards.public_access], **keep),
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{self._name}-bucket-lifecycle",
            bucket=bucket.id,
            rules=[run_bucket_lifecycle_rule()],
            # Noncurrent-version actions are for a bucket with versioning on (S3 API,
            # NoncurrentVersionExpiration), so after it, as pulumi-aws v7's example "for a bucket
            # with versioning" orders them; retained with the bucket, which then goes on pruning.
            opts=self._opts(depends_on=[guards.versioning], **keep),
        )
        return bucket.bucket, bucket.arn

    # -- FSx for Lustre ---------------------------------------------------------------------

    def _file_system(self, retain: bool) -> aws.fsx.LustreFileSystem:
        args = self._args
        fsx = args.config.fsx
        keep = {"retain_on_delete": True} if retain else {}
        security_group, rules = self._lustre_security_group(retain)
        file_system = aws.fsx.LustreFileSystem(
            f"{self._name}-fsx",
            deployment_type="PERSISTENT_2",
            file_system_type_version=LUSTRE_VERSION,
            storage_type="SSD",
            storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.per_unit_storage_throughput,
            data_compression_type=fsx.data_compression,
            subnet_ids=args.subnet_id,
            security_group_ids=[security_group.id],
            # The data lives in S3 (auto-export); a final backup would only add cost.
            skip_final_backup=True,
            tags={**args.tags, "Name": f"{pulumi.get_stack()}-fsx"},
            # CreateFileSystem fails if the groups' LNet rules are not in place yet, and
            # `security_group_ids` orders it only after the group (https://docs.aws.amazon.com/
            # fsx/latest/LustreGuide/cannot-create-fs.html; aws/aws-parallelcluster#6181).
            # Detail: docs/design/platform.md#fsx-after-its-security-group-rules
            opts=self._opts(depends_on=rules, **keep),
        )
        # A prefix is a directory, as `scripts/cli/run_target.py` reads it back: without the
        # slash, "runs" would also link the keys of "runs-old/" and "runs2/".
        prefix = fsx.data_repository_prefix
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        aws.fsx.DataRepositoryAssociation(
            f"{self._name}-fsx-s3-link",
            file_system_id=file_system.id,
            file_system_path=fsx.file_system_path,
            data_repository_path=pulumi.Output.concat("s3://", self.bucket_name, "/", prefix),
            # List the bucket once at creation, so existing datasets show up in Lustre.
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            s3={
                "auto_import_policy": {"events": FILE_EVENTS} if fsx.auto_import else None,
                "auto_export_policy": {"events": FILE_EVENTS} if fsx.auto_export else None,
            },
            tags=dict(args.tags),
            opts=self._opts(**keep),
        )
        return file_system

    def _lustre_security_group(
        self, retain: bool
    ) -> tuple[aws.ec2.SecurityGroup, list[pulumi.Resource]]:
        """The file system's SG and every rule for it: Lustre ports from its clients and itself.

        The clients' groups also get ingress from this one, because Lustre servers open
        connections back to clients. Rules that name another stack's or EKS's security group
        are never retained: a leftover reference would block deleting that group. All rules
        are returned so the file system can wait for them (see `_file_system`); the required
        set is in https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html
        (inbound 988 and 1018-1023 from the file system's own group and from its clients).
        """
        args = self._args
        keep = {"retain_on_delete": True} if retain else {}
        group = aws.ec2.SecurityGroup(
            f"{self._name}-fsx-sg",
            vpc_id=args.vpc_id,
            description="FSx for Lustre: LNet (TCP 988, 1018-1023) from cluster nodes and itself",
            tags={**args.tags, "Name": f"{pulumi.get_stack()}-fsx"},
            opts=self._opts(**keep),
        )
        sources: list[tuple[str, pulumi.Input[str], bool]] = [("self", group.id, retain)]
        sources += [
            (f"client{index}", sg, False) for index, sg in enumerate(args.client_security_group_ids)
        ]
        rules: list[pulumi.Resource] = []
        for label, source, keep_rule in sources:
            rule_opts = {"retain_on_delete": True} if keep_rule else {}
            for low, high in LUSTRE_PORTS:
                rules.append(
                    aws.vpc.SecurityGroupIngressRule(
                        f"{self._name}-fsx-in-{label}-{low}",
                        security_group_id=group.id,
                        referenced_security_group_id=source,
                        ip_protocol="tcp",
                        from_port=low,
                        to_port=high,
                        description=f"Lustre {low}-{high} from {label}",
                        opts=self._opts(**rule_opts),
                    )
                )
                if label != "self":
                    rules.append(
                        aws.vpc.SecurityGroupIngressRule(
                            f"{self._name}-{label}-in-fsx-{low}",
                            security_group_id=source,
                            referenced_security_group_id=group.id,
                            ip_protocol="tcp",
                            from_port=low,
                            to_port=high,
                            description=f"Lustre {low}-{high} from FSx",
                            opts=self._opts(),
                        )
                    )
            rules.append(
                aws.vpc.SecurityGroupEgressRule(
                    f"{self._name}-fsx-out-{label}",
                    security_group_id=group.id,
                    referenced_security_group_id=source,
                    ip_protocol="tcp",
                    from_port=LUSTRE_PORTS[0][0],
                    to_port=LUSTRE_PORTS[-1][1],
                    description=f"Lustre to {label}",
                    opts=self._opts(**rule_opts),
                )
            )
        return group, rules

    # -- CSI driver ---------------------------------------------------------------------------

    def _csi_driver(self, file_system: aws.fsx.LustreFileSystem) -> aws.eks.Addon:
        """The `aws-fsx-csi-driver` EKS add-on, its controller bound to a scoped role.

        A static volume needs no FSx API calls to mount; the controller's role may only
        describe and resize this file system. The association exists before the add-on, since
        Pod Identity injects credentials only into pods created after it.
        """
        args = self._args
        permissions = pulumi.Output.json_dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "ThisFileSystemOnly",
                        "Effect": "Allow",
                        "Action": ["fsx:DescribeFileSystems", "fsx:UpdateFileSystem"],
                        "Resource": file_system.arn,
                    }
                ],
            }
        )
        identity = pod_identity_role(
            f"{self._name}-fsx-csi",
            cluster_name=args.cluster_name,
            namespace=FSX_CSI_NAMESPACE,
            service_account=FSX_CSI_CONTROLLER_SA,
            policy=permissions,
            description="FSx CSI controller (Pod Identity): describe/resize this file system",
            parent=self,
            cluster_ready=args.cluster_ready,
            tags=args.tags,
            sid="EksPodIdentityForTheFsxCsiController",
        )
        return aws.eks.Addon(
            f"{self._name}-fsx-csi",
            cluster_name=args.cluster_name,
            addon_name=FSX_CSI_ADDON,
            addon_version=args.config.fsx.csi_driver_version,
            # The driver's node plugin tolerates every taint by default (`tolerateAllTaints`),
            # so it runs on the tainted GPU nodes; no configuration override is needed.
            # NONE: fail rather than take over a driver someone else installed with Helm.
            resolve_conflicts_on_create="NONE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=dict(args.tags),
            opts=self._opts(depends_on=[identity.association, *args.cluster_ready]),
        )

    # -- Kubernetes volume ----------------------------------------------------------------

    def _static_claim(
        self, file_system: aws.fsx.LustreFileSystem
    ) -> k8s.core.v1.PersistentVolumeClaim:
        """A PersistentVolume for exactly this file system and the job's claim bound to it."""
        args = self._args
        fsx = args.config.fsx
        capacity = f"{fsx.storage_capacity_gib}Gi"
        claim = claim_name_for(pulumi.get_stack())
        volume = k8s.core.v1.PersistentVolume(
            f"{self._name}-fsx-pv",
            # Volumes are cluster-wide: the project keeps two projects' `dev` stacks apart.
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=claim_name_for(f"{pulumi.get_project()}-{pulumi.get_stack()}")
            ),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": capacity},
                volume_mode="Filesystem",
                access_modes=["ReadWriteMany"],
                # Deleting the claim must never reach the file system; its lifecycle is AWS's.
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                # Reserved for the job's claim: no other claim in the cluster can bind it.
                claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=args.namespace, name=claim),
                mount_options=["flock"],
                csi=k8s.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=FSX_CSI_DRIVER,
                    volume_handle=file_system.id,
                    volume_attributes={
                        "dnsname": file_system.dns_name,
                        "mountname": file_system.mount_name,
                    },
                ),
            ),
            opts=self._opts(provider=args.k8s_provider),
        )
        return k8s.core.v1.PersistentVolumeClaim(
            f"{self._name}-fsx-pvc",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=claim, namespace=args.namespace),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=["ReadWriteMany"],
                # "" (not unset): no default StorageClass may provision a volume for this claim.
                storage_class_name="",
                volume_name=volume.metadata.apply(lambda meta: str(meta.name)),
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(
                    requests={"storage": capacity}
                ),
            ),
            opts=self._opts(provider=args.k8s_provider, delete_before_replace=True),
        )


def run_bucket_lifecycle_rule() -> aws.s3.BucketLifecycleConfigurationRuleArgsDict:
    """The run bucket's one lifecycle rule, over every key: current objects stay (checkpoints
    and exports are the run's results); noncurrent versions and abandoned multipart uploads go.

    `expired_object_delete_marker` removes a delete marker once no version is left behind it,
    so listings of a pruned prefix do not grow for ever (docs.aws.amazon.com/AmazonS3/latest/
    userguide/lifecycle-configuration-examples.html, "Removing expired object delete
    markers"; S3 accepts it only without `days`)."""
    return {
        "id": "prune-noncurrent-and-incomplete",
        "status": "Enabled",
        "filter": {},
        "expiration": {"expired_object_delete_marker": True},
        "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_RUN_DAYS},
        "abort_incomplete_multipart_upload": {"days_after_initiation": INCOMPLETE_UPLOAD_DAYS},
    }
