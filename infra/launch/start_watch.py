"""`pulumi up` waits for the job's workers to start, and fails fast with the reason when they don't.

A small Pulumi dynamic resource, created after the PyTorchJob, that runs
`infra.job.start_wait.wait_for_start` through `KubeClient` from the cluster's kubeconfig (the
rule: `infra.job.start_rule`). It waits again only when the job's `metadata.uid` changes.
Why, and what it needs: docs/design/program.md#start_watch
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from infra.job import start_wait
from infra.job.job_api import PYTORCHJOB, JobApi, job_api
from infra.job.kube_client import KubeClient, KubernetesCredentialError
from infra.job.start_rule import DEFAULT_START_TIMEOUT_S, JobStartError
from infra.job.start_wait import DEFAULT_POLL_SECONDS, WatchedJob, wait_for_start

TRIGGER_KEYS = ("namespace", "job_name", "job_uid", "workers")
"""Inputs whose change means a new job to wait for; the kubeconfig is only how to reach it."""


# --- Pulumi dynamic provider ---------------------------------------------------------------


def _send_progress_to_pulumi() -> None:
    """The dynamic provider has no engine connection; its stderr lines reach `pulumi up`."""
    logger = start_wait.logger
    if not any(getattr(h, "_fsdp_eks", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("job start: %(message)s"))
        handler._fsdp_eks = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class JobStartWatchProvider(ResourceProvider):
    """CRUD for `JobStartWatch`; holds no state of its own, so it pickles by reference."""

    def _wait(self, props: Mapping[str, Any]) -> dict[str, Any]:
        _send_progress_to_pulumi()
        job = WatchedJob(
            props["namespace"],
            props["job_name"],
            int(props["workers"]),
            int(props.get("backoff_limit", 3)),
            float(props.get("start_timeout_seconds") or DEFAULT_START_TIMEOUT_S),
            # Absent on a PyTorchJob's watch: its inputs stay as they were before TrainJobs.
            api=job_api(str(props.get("job_api") or PYTORCHJOB.name)),
        )
        try:
            client = KubeClient.from_kubeconfig(props["kubeconfig"])
        except KubernetesCredentialError as err:  # the plugin runs as the client is built
            raise JobStartError(str(err)) from None
        poll = props.get("poll_seconds")  # 0 is a setting (the tests'), not an absence
        progress = wait_for_start(
            client, job, poll_s=DEFAULT_POLL_SECONDS if poll is None else float(poll)
        )
        # The kubeconfig stays an input only: outputs need not carry credentials around.
        return {**{key: props.get(key) for key in TRIGGER_KEYS}, "started": progress}

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._wait(props)
        return CreateResult(id_=f"{props['namespace']}/{props['job_name']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in TRIGGER_KEYS if olds.get(key) != news.get(key)]
        return DiffResult(
            changes=bool(changed), replaces=[], stables=[], delete_before_replace=False
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._wait(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing to undo: the watch created nothing in the cluster."""


class JobStartWatch(pulumi.dynamic.Resource, module="job", name="JobStartWatch"):
    """Created once every worker of the job (a PyTorchJob, or a TrainJob: `api`) runs; its
    creation fails with the reason when the job fails or its workers cannot start."""

    started: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        kubeconfig: pulumi.Input[str],
        namespace: pulumi.Input[str],
        job_name: pulumi.Input[str],
        job_uid: pulumi.Input[str | None],
        workers: int,
        backoff_limit: int,
        start_timeout_seconds: int,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        api: JobApi = PYTORCHJOB,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "kubeconfig": pulumi.Output.secret(kubeconfig),
            "namespace": namespace,
            "job_name": job_name,
            "job_uid": job_uid,
            "workers": workers,
            "backoff_limit": backoff_limit,
            "start_timeout_seconds": start_timeout_seconds,
            "poll_seconds": poll_seconds,
            "started": None,
        }
        if api is not PYTORCHJOB:
            props["job_api"] = api.name
        super().__init__(JobStartWatchProvider(), resource_name, props, opts)
