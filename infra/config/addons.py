"""The `addons` section: the cluster software a GPU training job needs beyond EKS itself.

The NVIDIA AMI carries the driver and the EFA host stack but not the device plugins, so without
them nodes advertise no `nvidia.com/gpu` or `vpc.amazonaws.com/efa` and NCCL quietly falls back
to TCP. Every version is an exact pin: an unpinned chart or manifest URL turns the next
`pulumi up` into an unreviewed upgrade. Each add-on has an `install` switch so a stack on an
existing cluster installs only what that cluster lacks and never touches what it already runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import Field, field_validator

from infra.config.base import ConfigSection

_EXACT_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

NVIDIA_DEVICE_PLUGIN_CHART_VERSION = "0.18.2"
"""nvidia-device-plugin chart (https://nvidia.github.io/k8s-device-plugin), app v0.18.2."""

EFA_DEVICE_PLUGIN_CHART_VERSION = "v0.5.30"
"""aws-efa-k8s-device-plugin chart (https://aws.github.io/eks-charts), app v0.5.20."""

EFA_DEVICE_PLUGIN_MIN_CHART_VERSION = (0, 5, 18)
"""First chart that ships plugin v0.5.10, the oldest that handles P6 (B200) instances."""

TRAINING_OPERATOR_REPOSITORY = "kubeflow/trainer"
"""Where the operator's manifests live: kubeflow/training-operator was renamed kubeflow/trainer
(GitHub redirects the old name, but a redirect is one more thing that can change)."""


@dataclass(frozen=True)
class TrainingOperatorRelease:
    """One checked training-operator release: what the stack installs for it."""

    image: str
    """The image the release's standalone overlay pins (`manifests/overlays/standalone`)."""
    commit: str
    """The kubeflow/trainer commit the release tag points at: the PyTorchJob CRD is applied
    from this commit, which (unlike a tag) can never be moved to other content."""
    crd_sha256: str
    """sha256 of `manifests/base/crds/kubeflow.org_pytorchjobs.yaml` at `commit`."""


TRAINING_OPERATOR_RELEASES: dict[str, TrainingOperatorRelease] = {
    # `git rev-parse v1.9.0^{commit}` in kubeflow/trainer; the CRD's digest is the same for
    # v1.9.0 to v1.9.3, and equals the published v1.9.0 schema the job tests validate against.
    "v1.9.0": TrainingOperatorRelease(
        image="kubeflow/training-operator:v1-5170a36",
        commit="6f74c7f6b2ed6c27aabd82d0a316b23f0646059c",
        crd_sha256="eb80e57a984cdc7ceefaaf3fc561e21b673c30cbb58589f2389528d2b2760d22",
    ),
    # v1.9.4 (kubeflow/trainer release-1.9): respects cleanPodPolicy past backoffLimit (#3420),
    # image on GHCR, CRD with the Kubernetes 1.36 pod fields (#3924), same RBAC.
    # What changed, with sources: docs/design/config.md#training-operator-v194
    "v1.9.4": TrainingOperatorRelease(
        image="ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489",
        commit="4445c12aa62e4345b0c2c6ac9b215a70eca46ed7",
        crd_sha256="8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed",
    ),
}
"""Kubeflow training operator releases this project has checked. Adding a v1.9.x release
means adding its image, its tag's commit and its CRD's digest here."""

TRAINING_OPERATOR_VERSION = "v1.9.4"

# The operator image is pinned by tag (no published digest of `v1-93c5489` was found); set
# `addons.trainingOperator.image` to `<repository>@sha256:<digest>` to pin the bytes.
# Why, and how: docs/design/config.md#operator-image-pinned-by-tag
_IMAGE_REFERENCE = re.compile(
    r"^(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def _version_tuple(key: str, version: str) -> tuple[int, int, int]:
    match = _EXACT_VERSION.match(version)
    if match is None:
        raise ValueError(
            f"{key} {version!r} is not an exact version: pin one release such as "
            "'1.2.3' or 'v1.2.3' (no ranges, wildcards or 'latest')"
        )
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


class NvidiaDevicePluginConfig(ConfigSection):
    """NVIDIA's device plugin DaemonSet: advertises `nvidia.com/gpu` on the GPU nodes."""

    install: bool = Field(
        default=True,
        description="Install the Helm release (false: the cluster already runs the plugin).",
    )
    version: str = Field(
        default=NVIDIA_DEVICE_PLUGIN_CHART_VERSION,
        description="Exact nvidia-device-plugin Helm chart version.",
    )

    @field_validator("version")
    @classmethod
    def _exact(cls, version: str) -> str:
        _version_tuple("addons.nvidiaDevicePlugin.version", version)
        return version


class EfaDevicePluginConfig(ConfigSection):
    """AWS's EFA device plugin DaemonSet: advertises `vpc.amazonaws.com/efa` on EFA nodes.

    Installed only when the GPU instance type has EFA interfaces; a pod that does not request
    `vpc.amazonaws.com/efa` gets no EFA device and NCCL uses sockets.
    """

    install: bool = Field(
        default=True,
        description=(
            "Install the Helm release on EFA-capable GPU nodes (false: the cluster already "
            "runs the plugin). Ignored for instance types without EFA."
        ),
    )
    version: str = Field(
        default=EFA_DEVICE_PLUGIN_CHART_VERSION,
        description="Exact aws-efa-k8s-device-plugin Helm chart version (v0.5.18 or later).",
    )

    @field_validator("version")
    @classmethod
    def _exact_and_recent(cls, version: str) -> str:
        key = "addons.efaDevicePlugin.version"
        if _version_tuple(key, version) < EFA_DEVICE_PLUGIN_MIN_CHART_VERSION:
            floor = "v" + ".".join(str(p) for p in EFA_DEVICE_PLUGIN_MIN_CHART_VERSION)
            raise ValueError(
                f"{key} {version!r} is too old: use chart {floor} or later (plugin v0.5.10+, "
                "needed for P6 instances)"
            )
        return version


class TrainingOperatorConfig(ConfigSection):
    """The Kubeflow training operator (v1), which runs PyTorchJobs.

    Only the PyTorchJob scheme is enabled and only its CRD is applied, so a cluster that runs
    the MPI operator keeps its own MPIJob CRD.
    """

    install: bool = Field(
        default=True,
        description=(
            "Install the operator and the PyTorchJob CRD (false: the cluster already runs a "
            "v1.9 training operator)."
        ),
    )
    version: str = Field(
        default=TRAINING_OPERATOR_VERSION,
        description=f"Operator release, one of: {', '.join(sorted(TRAINING_OPERATOR_RELEASES))}.",
    )
    image: str | None = Field(
        default=None,
        description=(
            "Operator image override: `<repository>@sha256:<digest>` pins the exact bytes "
            "(recommended; e.g. a mirror in ECR for clusters without internet access), "
            "`<repository>:<tag>` a tag other than `latest`. Unset: the image the release's "
            "manifests pin, by tag (upstream publishes no digest for it)."
        ),
    )
    namespace: str = Field(
        default="kubeflow",
        description="Namespace the operator runs in (created by the stack).",
    )

    @field_validator("version")
    @classmethod
    def _known_release(cls, version: str) -> str:
        if version not in TRAINING_OPERATOR_RELEASES:
            allowed = ", ".join(sorted(TRAINING_OPERATOR_RELEASES))
            raise ValueError(
                f"addons.trainingOperator.version {version!r} is not a release this project "
                f"has checked; allowed: {allowed}"
            )
        return version

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, image: str | None) -> str | None:
        if image is None:
            return None
        match = _IMAGE_REFERENCE.match(image)
        if match is None or (match["tag"] in (None, "latest") and match["digest"] is None):
            raise ValueError(
                f"addons.trainingOperator.image {image!r} is not a pinned image reference: "
                "use <repository>@sha256:<64 hex digits> (or <repository>:<tag>, not 'latest')"
            )
        return image

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, namespace: str) -> str:
        if not _DNS1123_LABEL.match(namespace):
            raise ValueError(
                f"addons.trainingOperator.namespace {namespace!r} is not a valid namespace "
                "name (lowercase letters, digits and '-', at most 63 characters)"
            )
        return namespace

    @property
    def resolved_image(self) -> str:
        """The image to run: the override, or the one the release pins."""
        return self.image or self.release.image

    @property
    def release(self) -> TrainingOperatorRelease:
        """The checked release `version` names (image, manifest commit, CRD digest)."""
        return TRAINING_OPERATOR_RELEASES[self.version]

    @property
    def pinned_by_digest(self) -> bool:
        """Whether the operator image names its content (`@sha256:`), not a movable tag."""
        return "@sha256:" in self.resolved_image


class ClusterAutoscalerConfig(ConfigSection):
    """The Kubernetes Cluster Autoscaler that leases the GPU nodes to the run
    (infra.platform.autoscaler)."""

    install: bool = Field(
        default=True,
        description=(
            "Install it on a cluster the stack creates, so the GPU nodes start at zero, come up "
            "for the job's pods and go once the job has ended. Never installed on an existing "
            "cluster (the stack does not touch an autoscaler it does not own)."
        ),
    )
    scale_down_unneeded_minutes: int = Field(
        default=10,
        ge=1,
        le=1440,
        description="Minutes a GPU node stays without a training pod before it is removed.",
    )


class AddonsConfig(ConfigSection):
    """Device plugins and the training operator."""

    nvidia_device_plugin: NvidiaDevicePluginConfig = Field(
        default_factory=NvidiaDevicePluginConfig,
        description="NVIDIA device plugin (Helm).",
    )
    efa_device_plugin: EfaDevicePluginConfig = Field(
        default_factory=EfaDevicePluginConfig,
        description="EFA device plugin (Helm).",
    )
    training_operator: TrainingOperatorConfig = Field(
        default_factory=TrainingOperatorConfig,
        description="Kubeflow training operator with the PyTorchJob CRD.",
    )
    cluster_autoscaler: ClusterAutoscalerConfig = Field(
        default_factory=ClusterAutoscalerConfig,
        description="Cluster Autoscaler: GPU nodes from zero for the job, back to zero after.",
    )
