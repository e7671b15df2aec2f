"""Kubernetes (and add-on) versions a created cluster may run, and until when EKS supports each
at no premium.

New clusters default to extended support (billed extra), so the cluster sets upgrade policy
`STANDARD` and config accepts only versions in standard support on `CHECKED_ON`. Source: Amazon
EKS user guide, "Amazon EKS Kubernetes release calendar"
(https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html).
Why and every source: docs/design/facts.md#eks_versions
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True)
class EksVersion:
    """Support dates of one Kubernetes minor version on EKS (UTC days)."""

    eks_release: date
    end_of_standard_support: date
    end_of_extended_support: date


CHECKED_ON = date(2026, 11, 23)
"""When the dates below were last read at the sources named in docs/design/facts.md#eks_versions."""

EKS_VERSIONS: dict[str, EksVersion] = {
    "1.30": EksVersion(date(2024, 5, 23), date(2025, 7, 23), date(2026, 7, 23)),
    "1.31": EksVersion(date(2024, 9, 26), date(2025, 11, 26), date(2026, 11, 26)),
    "1.32": EksVersion(date(2025, 1, 23), date(2026, 3, 23), date(2027, 3, 23)),
    "1.33": EksVersion(date(2025, 5, 29), date(2026, 7, 29), date(2027, 7, 29)),
    "1.34": EksVersion(date(2025, 10, 2), date(2026, 12, 2), date(2027, 12, 2)),
    "1.35": EksVersion(date(2026, 1, 27), date(2027, 3, 27), date(2028, 3, 27)),
}

DEFAULT_KUBERNETES_VERSION = "1.35"
"""The newest version in the table: in standard support until 2027-03-27, i.e. on the date of
the price table (infra/facts/prices.py, 2026-11-09) and for months after it (1.34 leaves standard
support on 2026-12-02)."""

UPGRADE_SUPPORT_TYPE = "STANDARD"
"""`upgradePolicy.supportType` of a created cluster: upgraded by EKS at the end of standard
support rather than billed for extended support."""


def in_standard_support(on: date = CHECKED_ON) -> list[str]:
    """Versions of the table still in standard support on `on`, oldest first."""
    return [v for v, dates in EKS_VERSIONS.items() if dates.end_of_standard_support > on]


def check_kubernetes_version(version: str) -> str:
    """`version` if a cluster may be created with it under a STANDARD upgrade policy.

    Raises ValueError naming the key, the value and the versions allowed.
    """
    allowed = in_standard_support()
    if version in allowed:
        return version
    known = EKS_VERSIONS.get(version)
    reason = (
        f"left EKS standard support on {known.end_of_standard_support.isoformat()} (extended "
        "support costs extra per cluster-hour, and a cluster on it cannot be given the "
        "STANDARD upgrade policy)"
        if known is not None
        else f"is not in the project's table of EKS versions (checked {CHECKED_ON.isoformat()})"
    )
    raise ValueError(
        f"cluster.kubernetesVersion {version!r} {reason}; allowed: {', '.join(allowed)} "
        "(infra/facts/eks_versions.py lists them with their support dates)"
    )


FSX_CSI_DRIVER_RELEASES = ("v1.0.0", "v1.1.0", "v1.2.0", "v1.3.0", "v1.4.0", "v1.5.0", "v1.6.0",
                           "v1.7.0", "v1.8.0", "v1.9.0")  # fmt: skip
"""Releases of the FSx for Lustre CSI driver that an `aws-fsx-csi-driver` EKS add-on version
can carry, from the driver's own compatibility matrix (kubernetes-sigs/aws-fsx-csi-driver
`docs/README.md` at 5b22712, 2026-04-21; read on `CHECKED_ON`): every one of them supports
Kubernetes 1.20 and later, so each runs on every version `EKS_VERSIONS` allows. An add-on
version is the driver release plus EKS's build, `v1.9.0-eksbuild.1`; the build numbers are
EKS's and not published outside its API: `aws eks describe-addon-versions --addon-name
aws-fsx-csi-driver --kubernetes-version <version>` lists them, and EKS itself refuses an unknown
build when it creates the add-on."""

_ADDON_VERSION = re.compile(r"^(v\d+\.\d+\.\d+)-eksbuild\.\d+$")


def check_fsx_csi_addon_version(version: str) -> str:
    """`version` if it names an EKS build of a released FSx CSI driver; ValueError otherwise,
    naming the key, the value and what is allowed."""
    match = _ADDON_VERSION.match(version)
    if match is not None and match.group(1) in FSX_CSI_DRIVER_RELEASES:
        return version
    why = (
        f"carries driver {match.group(1)}, which is not a release of the FSx CSI driver"
        if match is not None
        else "is not an EKS add-on version (v<driver release>-eksbuild.<build>)"
    )
    raise ValueError(
        f"storage.fsx.csiDriverVersion {version!r} {why}; allowed: "
        f"{FSX_CSI_DRIVER_RELEASES[0]}..{FSX_CSI_DRIVER_RELEASES[-1]} with an EKS build, e.g. "
        f"'{FSX_CSI_DRIVER_RELEASES[-1]}-eksbuild.1' (`aws eks describe-addon-versions "
        "--addon-name aws-fsx-csi-driver` lists them), or unset for EKS's default"
    )
