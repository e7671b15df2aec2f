"""The Kubeflow training operator (v1.9.4), rendered in code with only the PyTorchJob scheme on.

The PyTorchJob CRD is applied server-side from the release's own file at its commit; the rest
is rendered here from the standalone overlay with `--enable-scheme=pytorchjob`. The
Deployment's readiness waits for the webhook certificates.
Why, and the ordering: docs/design/platform.md#training_operator
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.addons import (
    TRAINING_OPERATOR_REPOSITORY,
    TrainingOperatorConfig,
    TrainingOperatorRelease,
)

NAME = "training-operator"
"""Name of the operator's Deployment, Service, ServiceAccount and ClusterRole (upstream's)."""
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
"""Hard-coded in the operator: its certificate rotator patches this configuration's CA."""
WEBHOOK_SECRET = "training-operator-webhook-cert"
"""Secret the operator's certificate rotator fills; it must exist (the operator only updates)."""
WEBHOOK_PORT = 9443
PROBE_PORT = 8081
"""The operator's health-probe port (`--health-probe-bind-address`, default :8081)."""
ENABLED_SCHEMES = ("pytorchjob",)

CRD_PATH = "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"


def crd_url(release: TrainingOperatorRelease) -> str:
    """The PyTorchJob CRD of one operator release, pinned by the commit its tag names.

    A tag can be moved to other content; a commit cannot, so the file the provider downloads
    at `up` is byte for byte the one whose digest `release.crd_sha256` records.
    """
    return (
        f"https://raw.githubusercontent.com/{TRAINING_OPERATOR_REPOSITORY}/{release.commit}/"
        f"{CRD_PATH}"
    )


@dataclass
class TrainingOperatorArgs:
    config: TrainingOperatorConfig
    k8s_provider: k8s.Provider
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where the operator may run (e.g. the system nodes); empty: anywhere untainted."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What must exist first (the cluster's node groups): passed to every child, because the
    Python SDK does not hand a component's own `depends_on` down to its children."""


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> k8s.rbac.v1.PolicyRuleArgs:
    return k8s.rbac.v1.PolicyRuleArgs(api_groups=groups, resources=resources, verbs=verbs)


ALL = ["create", "delete", "get", "list", "patch", "update", "watch"]
CLUSTER_RULES = [
    # What the PyTorchJob controller declares (v1.9.0 `pytorchjob_controller.go` rbac markers);
    # the MPIJob controller's extra grants are left out.
    # Why: docs/design/platform.md#operator-cluster-role
    _rule([""], ["events"], ALL),
    _rule([""], ["pods"], ALL),
    _rule([""], ["services"], ["create", "delete", "get", "list", "watch"]),
    # The cert rotator (cert-controller v0.16.0 `pkg/rotator`) updates only its own webhook
    # configuration, so `update` is bound to it by name.
    # Why: docs/design/platform.md#webhook-configuration-update
    _rule(
        ["admissionregistration.k8s.io"],
        ["validatingwebhookconfigurations"],
        ["get", "list", "watch"],
    ),
    k8s.rbac.v1.PolicyRuleArgs(
        api_groups=["admissionregistration.k8s.io"],
        resources=["validatingwebhookconfigurations"],
        resource_names=[WEBHOOK_CONFIGURATION],
        verbs=["update"],
    ),
    _rule(["autoscaling"], ["horizontalpodautoscalers"], ALL),
    _rule(["kubeflow.org"], ["pytorchjobs"], ALL),
    _rule(["kubeflow.org"], ["pytorchjobs/finalizers"], ["update"]),
    _rule(["kubeflow.org"], ["pytorchjobs/status"], ["get", "patch", "update"]),
    _rule(["scheduling.volcano.sh", "scheduling.x-k8s.io"], ["podgroups"], ALL),
]
"""Cluster-wide: the controller watches PyTorchJobs and their pods in every namespace."""

SECRET_RULES = [
    # Upstream grants Secrets cluster-wide; the rotator reads only its own namespace
    # (cert-controller v0.16.0 `addNamespacedCache`): a namespaced Role, `update` by name.
    # Why: docs/design/platform.md#operator-secrets-role
    _rule([""], ["secrets"], ["get", "list", "watch"]),
    k8s.rbac.v1.PolicyRuleArgs(
        api_groups=[""], resources=["secrets"], resource_names=[WEBHOOK_SECRET], verbs=["update"]
    ),
]
"""Namespaced (the operator's namespace): the webhook certificate Secret only."""

OPERATOR_USER_ID = 65532
"""uid:gid the operator runs as. Its v1.9.x image is `gcr.io/distroless/static:latest` with one
static binary (`build/images/training-operator/Dockerfile`), whose default user is root; 65532
is distroless's own `nonroot` user. The binary needs no file it does not get from a volume."""


class TrainingOperator(pulumi.ComponentResource):
    """PyTorchJob CRD + the operator's RBAC, webhook and Deployment."""

    crd: k8s.yaml.v2.ConfigFile
    deployment: k8s.apps.v1.Deployment
    ready: list[pulumi.Resource]
    """CRD, Deployment and webhook Service: a PyTorchJob must wait for all three."""

    def __init__(
        self, name: str, args: TrainingOperatorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:training_operator:TrainingOperator", name, None, opts)
        config = args.config
        namespace_name = config.namespace
        labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "pulumi"}
        selector = {"control-plane": "kubeflow-training-operator"}

        def child(
            depends_on: Sequence[pulumi.Resource] = (), **kwargs: Any
        ) -> pulumi.ResourceOptions:
            # `args.depends_on` on every child: a parent's `depends_on` orders nothing inside it
            # (pulumi `sdk/python/lib/pulumi/runtime/resource.py` `prepare_resource`).
            # Why: docs/design/platform.md#depends_on-on-every-child
            return pulumi.ResourceOptions(
                parent=self,
                provider=args.k8s_provider,
                depends_on=[*args.depends_on, *depends_on],
                **kwargs,
            )

        self.crd = k8s.yaml.v2.ConfigFile(
            f"{name}-pytorchjob-crd", file=crd_url(config.release), opts=child()
        )
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=namespace_name, labels=labels),
            opts=child(),
        )
        # Every namespaced child reads the name from the Namespace, so it waits for it.
        ns = namespace.metadata.apply(lambda meta: str(meta.name))

        account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, namespace=ns, labels=labels),
            opts=child(),
        )
        role = k8s.rbac.v1.ClusterRole(
            f"{name}-cluster-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, labels=labels),
            rules=CLUSTER_RULES,
            opts=child(),
        )
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-cluster-role-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=NAME
            ),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=NAME, namespace=ns)],
            opts=child(depends_on=[role, account]),
        )
        # The certificate Secret's rights, in the operator's namespace only (see SECRET_RULES).
        secret_role = k8s.rbac.v1.Role(
            f"{name}-webhook-cert-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, namespace=ns, labels=labels),
            rules=SECRET_RULES,
            opts=child(),
        )
        secret_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-webhook-cert-role-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, namespace=ns, labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="Role", name=NAME
            ),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=NAME, namespace=ns)],
            opts=child(depends_on=[secret_role, account]),
        )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, namespace=ns, labels=labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="ClusterIP",
                selector=selector,
                ports=[
                    k8s.core.v1.ServicePortArgs(
                        name="monitoring-port", port=8080, target_port=8080
                    ),
                    k8s.core.v1.ServicePortArgs(
                        name="webhook-server", port=443, protocol="TCP", target_port=WEBHOOK_PORT
                    ),
                ],
            ),
            # Pulumi waits for the Service to have endpoints, i.e. for the operator pod: nothing
            # the Deployment depends on may wait for it.
            opts=child(),
        )
        secret = k8s.core.v1.Secret(
            f"{name}-webhook-cert",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=WEBHOOK_SECRET, namespace=ns, labels=labels),
            # The operator writes the certificates; the stack owns only the empty shell.
            opts=child(ignore_changes=["data", "stringData"]),
        )
        webhook = k8s.admissionregistration.v1.ValidatingWebhookConfiguration(
            f"{name}-webhook",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=WEBHOOK_CONFIGURATION, labels=labels),
            webhooks=[
                k8s.admissionregistration.v1.ValidatingWebhookArgs(
                    name="validator.pytorchjob.training-operator.kubeflow.org",
                    admission_review_versions=["v1"],
                    # caBundle is injected by the operator's certificate rotator.
                    client_config=k8s.admissionregistration.v1.WebhookClientConfigArgs(
                        service=k8s.admissionregistration.v1.ServiceReferenceArgs(
                            name=NAME, namespace=ns, path="/validate-kubeflow-org-v1-pytorchjob"
                        )
                    ),
                    failure_policy="Fail",
                    side_effects="None",
                    rules=[
                        k8s.admissionregistration.v1.RuleWithOperationsArgs(
                            api_groups=["kubeflow.org"],
                            api_versions=["v1"],
                            operations=["CREATE", "UPDATE"],
                            resources=["pytorchjobs"],
                        )
                    ],
                )
            ],
            opts=child(),
        )
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=NAME, namespace=ns, labels={**labels, **selector}
            ),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels={**labels, **selector},
                        annotations={"sidecar.istio.io/inject": "false"},
                    ),
                    spec=self._pod_spec(config, args),
                ),
            ),
            # Pulumi waits for the rollout: the pod is ready only once certificates are in place.
            opts=child(
                depends_on=[self.crd, binding, secret_binding, secret, webhook],
                custom_timeouts=pulumi.CustomTimeouts(create="10m", update="10m"),
            ),
        )
        # The webhook is reached through the Service: the job waits for its endpoints too.
        # The operator's pods take connections only on the ports they serve to the cluster:
        # the webhook (from the API server, whose addresses no selector can name) and the
        # health probes (from kubelet). The metrics port is closed; open it for a scraper.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAME, namespace=ns, labels=labels),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                policy_types=["Ingress"],
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        ports=[
                            k8s.networking.v1.NetworkPolicyPortArgs(port=port, protocol="TCP")
                            for port in (WEBHOOK_PORT, PROBE_PORT)
                        ]
                    )
                ],
            ),
            opts=child(),
        )
        self.ready = [self.crd, self.deployment, service]
        self.register_outputs({"namespace": ns, "image": config.resolved_image})

    @staticmethod
    def _pod_spec(
        config: TrainingOperatorConfig, args: TrainingOperatorArgs
    ) -> k8s.core.v1.PodSpecArgs:
        probe_port = PROBE_PORT

        def probe(path: str, delay: int, period: int) -> k8s.core.v1.ProbeArgs:
            return k8s.core.v1.ProbeArgs(
                http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port=probe_port),
                initial_delay_seconds=delay,
                period_seconds=period,
                timeout_seconds=3,
            )

        def field_env(name: str, path: str) -> k8s.core.v1.EnvVarArgs:
            return k8s.core.v1.EnvVarArgs(
                name=name,
                value_from=k8s.core.v1.EnvVarSourceArgs(
                    field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path=path)
                ),
            )

        container = k8s.core.v1.ContainerArgs(
            name=NAME,
            image=config.resolved_image,
            # A tag can be re-pushed: with one, kubelet checks the registry's current digest
            # at every start; a digest pin names the bytes, so a cached copy is the right one.
            image_pull_policy="IfNotPresent" if config.pinned_by_digest else "Always",
            command=["/manager"],
            args=[f"--enable-scheme={scheme}" for scheme in ENABLED_SCHEMES],
            env=[
                # The certificate rotator derives the webhook's DNS name from this.
                field_env("MY_POD_NAMESPACE", "metadata.namespace"),
                field_env("MY_POD_NAME", "metadata.name"),
            ],
            ports=[
                k8s.core.v1.ContainerPortArgs(container_port=8080, name="metrics"),
                k8s.core.v1.ContainerPortArgs(
                    container_port=WEBHOOK_PORT, name="webhook-server", protocol="TCP"
                ),
            ],
            liveness_probe=probe("/healthz", 15, 20),
            readiness_probe=probe("/readyz", 10, 15),
            resources=k8s.core.v1.ResourceRequirementsArgs(
                # A controller, not a batch job: a CPU limit caps a runaway reconcile loop.
                requests={"cpu": "100m", "memory": "128Mi"},
                limits={"cpu": "1", "memory": "512Mi"},
            ),
            # Restricted Pod Security profile. The root filesystem can be read-only: the
            # operator writes only through the API (the rotator `Update`s the Secret; cert-
            # controller v0.16.0 `ensureCertsMounted` merely stats the files kubelet projects
            # into the cert volume below), and it logs to stderr.
            security_context=k8s.core.v1.SecurityContextArgs(
                allow_privilege_escalation=False,
                read_only_root_filesystem=True,
                run_as_non_root=True,
                run_as_user=OPERATOR_USER_ID,
                run_as_group=OPERATOR_USER_ID,
                capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
                seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
            ),
            volume_mounts=[
                k8s.core.v1.VolumeMountArgs(
                    name="cert", mount_path="/tmp/k8s-webhook-server/serving-certs", read_only=True
                )
            ],
        )
        return k8s.core.v1.PodSpecArgs(
            service_account_name=NAME,
            termination_grace_period_seconds=10,
            security_context=k8s.core.v1.PodSecurityContextArgs(
                run_as_non_root=True,
                fs_group=OPERATOR_USER_ID,
                seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
            ),
            node_selector=dict(args.node_selector) or None,
            containers=[container],
            volumes=[
                k8s.core.v1.VolumeArgs(
                    name="cert",
                    secret=k8s.core.v1.SecretVolumeSourceArgs(
                        # Owner and group read only: the files hold the webhook's private
                        # key; kubelet gives them the pod's fsGroup, the operator's gid.
                        secret_name=WEBHOOK_SECRET,
                        default_mode=0o440,
                    ),
                )
            ],
        )
