"""A job in a Kueue queue, against the loopback cluster with Kueue's job reconciler modelled
(`tests.infra.kube_fake.Kueue`): created suspended, started by admission, stopped and started
through its Workload's `spec.active` because Kueue owns `suspend`, and the start watch waiting
for admission instead of calling the job stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.job.kube_client import KubeClient
from infra.job.queue_hold import active_patch
from infra.job.queueing import QUEUE_LABEL, admission_state, owned_workloads
from infra.job.start_rule import JobStartError
from infra.job.start_wait import WatchedJob, wait_for_start
from infra.job.stop_start import NoWorkloadError, start_job, stop_job
from infra.job.suspension import FIELD_MANAGER, set_suspended
from tests.infra.kube_fake import ClusterApiServer, Kueue, kubeconfig, serving, stamp
from tests.infra.ssa_model import job_inputs


@pytest.fixture
def cluster() -> Iterator[ClusterApiServer]:
    with serving(ClusterApiServer()) as server:
        server.kueue = Kueue()
        yield server


@pytest.fixture
def api(cluster: ClusterApiServer) -> KubeClient:
    return KubeClient.from_kubeconfig(kubeconfig(cluster.url))


def deploy_queued(cluster: ClusterApiServer, *, admits: bool = True) -> None:
    assert cluster.kueue is not None
    cluster.kueue.admits = admits
    job = job_inputs()
    job["metadata"]["labels"][QUEUE_LABEL] = "fsdp-eks"
    with cluster.lock:
        cluster.put_job(job)
        cluster.reconcile()


class Ticks:
    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_admission_starts_the_job_kueue_created_suspended(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy_queued(cluster)
    assert cluster.job()["spec"]["runPolicy"]["suspend"] is False  # unsuspended by Kueue
    progress = wait_for_start(api, WatchedJob("training", "exp", workers=2), poll_s=0)
    assert progress.startswith("2/2 workers running")


def test_the_start_watch_waits_for_admission_and_leaves_the_job_queued(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    """Before this rule the watch read Kueue's `suspend: true` as `fsdp-eks stop` and failed
    `pulumi up` at once; a job not admitted holds no node, so it is not released either."""
    deploy_queued(cluster, admits=False)
    lines: list[str] = []
    with pytest.raises(JobStartError) as raised:
        wait_for_start(
            api,
            WatchedJob("training", "exp", workers=2, start_timeout_s=60),
            poll_s=0,
            clock=Ticks(30),
            sleep=lambda _s: None,
            on_progress=lines.append,
        )
    assert "waiting for Kueue's admission" in lines[0]
    assert "insufficient unused quota" in lines[0]
    assert "not admitted by Kueue" in str(raised.value)
    assert "stays queued" in str(raised.value)
    assert cluster.kueue is not None and cluster.kueue.workload is not None
    assert cluster.kueue.workload["spec"]["active"] is True


def test_a_job_admitted_late_gets_the_whole_start_budget_from_admission(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    """Queued for most of the budget, then admitted: its nodes get the whole start budget from
    admission. Before, the budget ran from the watch's start, and the watch deactivated the
    Workload a minute after admission, dropping the job from its queue (review finding)."""
    deploy_queued(cluster, admits=False)
    cluster.operator.pod_age_s = 0.0  # a trainer that just started: not yet stable
    limit_s = 300.0
    sleeps = 0

    def sleep(_s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        assert cluster.kueue is not None
        if sleeps == 8:  # 8 polls of 30 s: admitted with one minute of the budget left
            cluster.kueue.admits = True
        if sleeps == 12:  # two minutes after admission its workers are stable
            with cluster.lock:
                for pod in cluster.pods.values():
                    state = pod["status"]["containerStatuses"][0]["state"]
                    state["running"]["startedAt"] = stamp(120.0)

    progress = wait_for_start(
        api,
        WatchedJob("training", "exp", workers=2),
        poll_s=0,
        limit_s=limit_s,
        clock=Ticks(30),
        sleep=sleep,
    )
    assert progress.startswith("2/2 workers running")
    assert cluster.kueue is not None and cluster.kueue.workload is not None
    assert cluster.kueue.workload["spec"]["active"] is True


def test_a_watcher_that_may_not_read_workloads_still_waits_for_admission(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy_queued(cluster, admits=False)
    cluster.forbidden.add(("list", "workloads"))
    lines: list[str] = []
    with pytest.raises(JobStartError, match="not admitted by Kueue"):
        wait_for_start(
            api,
            WatchedJob("training", "exp", workers=2, start_timeout_s=60),
            poll_s=0,
            clock=Ticks(30),
            sleep=lambda _s: None,
            on_progress=lines.append,
        )
    assert lines[0].endswith("waiting for Kueue's admission: no Workload yet")


def test_an_admitted_job_that_cannot_start_is_released_through_its_workload(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    """A `suspend` would be undone by Kueue (the Workload is admitted): the release
    deactivates the Workload, and Kueue suspends the job."""
    cluster.operator.running = False  # admitted, but no pod ever comes
    deploy_queued(cluster)
    with pytest.raises(JobStartError) as raised:
        wait_for_start(
            api,
            WatchedJob("training", "exp", workers=2, start_timeout_s=60),
            poll_s=0,
            clock=Ticks(30),
            sleep=lambda _s: None,
        )
    assert "not every worker started" in str(raised.value)
    assert "its Kueue Workload was deactivated" in str(raised.value)
    assert cluster.kueue is not None and cluster.kueue.workload is not None
    assert cluster.kueue.workload["spec"]["active"] is False
    with cluster.lock:
        cluster.reconcile()
    assert cluster.job()["spec"]["runPolicy"]["suspend"] is True


def test_stop_and_start_go_through_the_workload(cluster: ClusterApiServer, api: KubeClient) -> None:
    deploy_queued(cluster)
    assert cluster.pods
    stopped = stop_job(api, "training", "exp", poll_s=0)
    assert not stopped.already_stopped
    assert cluster.kueue is not None and cluster.kueue.workload is not None
    assert cluster.kueue.workload["spec"]["active"] is False
    assert cluster.job()["spec"]["runPolicy"]["suspend"] is True  # Kueue suspended it
    assert not cluster.live_pods()
    again = stop_job(api, "training", "exp", poll_s=0)
    assert again.already_stopped
    started = start_job(api, "training", "exp", poll_s=0, watch_poll_s=0)
    assert not started.was_running
    assert started.progress.startswith("2/2 workers running")
    assert cluster.kueue.workload["spec"]["active"] is True


def test_a_suspend_on_a_queued_job_is_undone_by_kueue(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    """Why the rule exists: the stop of an unqueued job (a forced apply of `suspend: true`)
    is reverted on Kueue's next reconcile of an admitted Workload."""
    deploy_queued(cluster)
    set_suspended(api, "training", "exp", True)
    with cluster.lock:
        cluster.reconcile()
    assert cluster.job()["spec"]["runPolicy"]["suspend"] is False


def test_a_queued_job_without_a_workload_is_refused_with_the_reason(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    assert cluster.kueue is not None
    cluster.kueue.running = False  # labelled, but no Kueue makes its Workload
    deploy_queued(cluster)
    with pytest.raises(NoWorkloadError, match="no Kueue Workload"):
        stop_job(api, "training", "exp", poll_s=0)


def test_the_workload_apply_names_only_the_active_field() -> None:
    body = active_patch("training", "w", False)
    assert body == {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "training"},
        "spec": {"active": False},
    }
    assert FIELD_MANAGER == "fsdp-eks"


def test_admission_state_lines() -> None:
    owner = {"kind": "PyTorchJob", "name": "exp", "uid": "u1"}
    other = {"kind": "PyTorchJob", "name": "exp", "uid": "u0"}
    mine = {"metadata": {"name": "a", "ownerReferences": [owner]}}
    older = {"metadata": {"name": "b", "ownerReferences": [other]}}
    assert owned_workloads([older, mine], kind="PyTorchJob", name="exp", uid="u1") == [mine]
    pending = {"status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                          "message": "insufficient quota"}]}}  # fmt: skip
    assert admission_state(pending) == "pending: insufficient quota"
    checks = [{"name": "atomic-provisioning", "state": "Pending"}]
    reserved = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                           "admissionChecks": checks}}  # fmt: skip
    assert admission_state(reserved) == (
        "quota reserved, waiting for admission checks (checks: atomic-provisioning Pending)"
    )
    admitted = {"status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    assert admission_state(admitted) == "admitted"
    assert admission_state({"spec": {"active": False}}).startswith("deactivated")
    # Started again after a stop: Kueue still says Evicted (Deactivated) until it has quota.
    evicted = {"type": "Evicted", "status": "True", "reason": "Deactivated"}
    waiting = {"type": "QuotaReserved", "status": "False", "message": "insufficient quota"}
    restarted = {"spec": {"active": True}, "status": {"conditions": [evicted, waiting]}}
    assert admission_state(restarted) == "pending: insufficient quota"
    preempt = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by x"}
    preempted = {"status": {"conditions": [preempt]}}
    assert admission_state(preempted) == "evicted (Preempted): by x"
    assert admission_state({}) == "pending: not yet seen by Kueue"
