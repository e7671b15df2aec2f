"""Stopping and starting a queued job through its Kueue Workload, not its `suspend` field.

Kueue owns a queued job's `suspend` (kubernetes-sigs/kueue v0.19.2
`pkg/controller/jobframework/reconciler.go`), so a job with Kueue's queue label is held by
`spec.active: false` on its Workload, applied as `FIELD_MANAGER`, forced; others by `suspend`.
Why and sources: docs/design/job.md#queue_hold
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.job.job_api import PYTORCHJOB, JobApi
from infra.job.kube_client import KubeClient
from infra.job.queueing import KUEUE_GROUP, WORKLOAD_VERSION, is_deactivated, owned_workloads
from infra.job.suspension import FIELD_MANAGER

__all__ = ["active_patch", "is_deactivated", "set_active", "workload_of"]


def workload_of(
    client: KubeClient, job: Mapping[str, Any], api: JobApi = PYTORCHJOB
) -> dict[str, Any] | None:
    """The Workload Kueue made for `job` (owned by it), or None when none exists yet."""
    meta = job.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    found = owned_workloads(
        client.list_workloads(namespace), kind=api.kind, name=name, uid=meta.get("uid")
    )
    return dict(found[0]) if found else None


def active_patch(namespace: str, name: str, active: bool) -> dict[str, Any]:
    """The apply configuration: the Workload's identity and `spec.active` only."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{WORKLOAD_VERSION}",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"active": active},
    }


def set_active(client: KubeClient, workload: Mapping[str, Any], active: bool) -> dict[str, Any]:
    """Queue (True) or hold (False) the Workload; the Workload as stored."""
    meta = workload.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    return client.apply_workload(
        namespace, name, active_patch(namespace, name, active), field_manager=FIELD_MANAGER
    )
