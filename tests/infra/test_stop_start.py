"""`stop_job` / `start_job` against a cluster on loopback (`tests.infra.kube_fake`): what they
read first, what they refuse, what they wait for and how long, what they say."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.job.job_api import PYTORCHJOB
from infra.job.kube_client import KubeClient, KubernetesApiError
from infra.job.start_rule import JobStartError
from infra.job.stop_start import (
    STOP_MARGIN_S,
    JobFinishedError,
    JobNotFoundError,
    PodsRemainError,
    SuspendUnsupportedError,
    start_job,
    stop_job,
    stop_timeout_seconds,
)
from infra.job.suspension import FIELD_MANAGER, job_urn, suspend_owners
from tests.infra.kube_fake import (
    APPLY_PATCH,
    OPERATOR_MANAGER,
    ClusterApiServer,
    config_with_user,
    kubeconfig,
    serving,
)
from tests.infra.ssa_model import APPLY, SUSPEND, Manager, Pulumi, job_inputs

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster() -> Iterator[ClusterApiServer]:
    with serving(ClusterApiServer()) as server:
        yield server


@pytest.fixture
def api(cluster: ClusterApiServer) -> KubeClient:
    return KubeClient.from_kubeconfig(kubeconfig(cluster.url))


def deploy(cluster: ClusterApiServer, grace_s: int | None = None) -> Pulumi:
    job = job_inputs()
    if grace_s is not None:
        template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
        template["spec"]["terminationGracePeriodSeconds"] = grace_s
    pulumi = Pulumi(cluster.store)
    pulumi.up(job)
    with cluster.lock:
        cluster.reconcile()
    return pulumi


class Ticks:
    """A clock that advances `step` seconds on every reading."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def finish(cluster: ClusterApiServer, kind: str) -> None:
    job = cluster.job()
    status = job.get("status") or {}
    condition = {"type": kind, "status": "True", "reason": f"PyTorchJob{kind}", "message": "m"}
    status["conditions"] = [*(status.get("conditions") or []), condition]
    cluster.store.update_status(cluster.name, status, OPERATOR_MANAGER)


# --- stop ------------------------------------------------------------------------------------


def test_stop_suspends_and_returns_once_the_operator_has_removed_every_pod(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    cluster.operator.grace_reads = 3  # pods terminate over three polls
    lines: list[str] = []
    result = stop_job(api, "training", "exp", stack="exp", poll_s=0, on_progress=lines.append)
    assert not result.already_stopped
    assert not cluster.pods
    job = cluster.job()
    conditions = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert conditions["Suspended"] == "True" and conditions["Running"] == "False"
    assert any("terminating (SIGTERM: the trainer saves a checkpoint)" in line for line in lines)
    assert "`fsdp-eks start exp` resumes it" in result.message
    assert "leaves it stopped" in result.message and "replaces the job" in result.message
    # The job's GET came first; exactly one write, the forced apply.
    assert cluster.requests[0].method == "GET"
    assert [(r.content_type, r.query) for r in cluster.patches] == [
        (APPLY_PATCH, {"fieldManager": FIELD_MANAGER, "force": "true"})
    ]


def test_stopping_a_stopped_job_says_so_and_holds_it(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    stop_job(api, "training", "exp", poll_s=0)
    again = stop_job(api, "training", "exp", poll_s=0)
    assert again.already_stopped
    assert again.message.startswith("PyTorchJob training/exp was already stopped")
    assert suspend_owners(cluster.job()) == [f"{FIELD_MANAGER} (Apply)"]


def test_stop_of_a_missing_job_names_the_command_that_recreates_it(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    with pytest.raises(JobNotFoundError) as error:
        stop_job(api, "training", "exp", stack="exp", poll_s=0)
    assert str(error.value) == (
        "PyTorchJob training/exp not found on the cluster (deleted outside Pulumi, or the stack "
        "is not deployed): `pulumi up --refresh -s exp` recreates it"
    )
    assert cluster.patches == []


@pytest.mark.parametrize("kind", ["Succeeded", "Failed"])
def test_a_finished_job_is_neither_stopped_nor_started(
    cluster: ClusterApiServer, api: KubeClient, kind: str
) -> None:
    deploy(cluster)
    finish(cluster, kind)
    for verb, action in (("stop", stop_job), ("start", start_job)):
        with pytest.raises(JobFinishedError) as error:
            action(api, "training", "exp", stack="exp", poll_s=0)
        assert f"has finished ({kind}): there is nothing to {verb}" in str(error.value)
        assert f"`pulumi up --replace '{job_urn('exp')}' -s exp`" in str(error.value)
    assert cluster.patches == []


def test_the_stop_waits_at_most_the_pods_grace_period_plus_a_margin(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster, grace_s=330)
    assert stop_timeout_seconds(cluster.job()) == 330 + STOP_MARGIN_S
    cluster.operator.pods_removable = False  # a kubelet that never finishes them
    clock = Ticks(step=10)
    with pytest.raises(PodsRemainError) as error:
        stop_job(api, "training", "exp", poll_s=0, clock=clock)
    assert "is suspended, but 450 s later: 2 pod(s) of the job left, 2 terminating" in str(
        error.value
    )
    assert 450 <= clock.now <= 480
    assert cluster.suspended()


def test_without_an_operator_the_stop_says_what_is_missing(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    cluster.operator.running = False
    with pytest.raises(PodsRemainError, match=r"the operator \(is it running\?\)"):
        stop_job(api, "training", "exp", timeout_s=30, poll_s=0, clock=Ticks(step=10))


def test_an_operator_without_suspend_is_refused_at_once_not_waited_for(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    """An old CRD prunes the field and the apply still answers 200: the stored job says so."""
    deploy(cluster)
    cluster.crd_without_suspend = True
    waits: list[float] = []
    with pytest.raises(SuspendUnsupportedError) as raised:
        stop_job(api, cluster.namespace, cluster.name, sleep=waits.append)
    assert "PyTorchJob CRD dropped spec.runPolicy.suspend=true" in str(raised.value)
    assert "training-operator v1.7.0" in str(raised.value)
    assert waits == [] and not cluster.suspended()
    assert len(cluster.live_pods()) > 0


def test_a_caller_without_patch_rights_is_told_which_right_it_needs(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    cluster.forbidden.add(("patch", "pytorchjobs"))
    with pytest.raises(KubernetesApiError) as error:
        stop_job(api, "training", "exp", poll_s=0)
    assert error.value.status == 403
    assert str(error.value) == (
        "patch pytorchjobs.kubeflow.org training/exp: HTTP 403 Forbidden: "
        'pytorchjobs.kubeflow.org "exp" is forbidden: User "arn:aws:sts::123456789012:'
        'assumed-role/ml-admins/ci" cannot patch resource "pytorchjobs" in API group '
        '"kubeflow.org" in the namespace "training"; the identity the kubeconfig signs as '
        "needs `patch` on pytorchjobs.kubeflow.org in namespace training (an RBAC Role bound "
        "to it, or an EKS access policy)"
    )


def test_a_caller_the_cluster_does_not_know_is_told_about_access_entries(
    cluster: ClusterApiServer,
) -> None:
    deploy(cluster)
    stranger = KubeClient.from_kubeconfig(
        config_with_user(cluster.url, {"token": "k8s-aws-v1.someone-else"})
    )
    with pytest.raises(KubernetesApiError) as error:
        stop_job(stranger, "training", "exp", poll_s=0)
    assert error.value.status == 401
    assert "needs an EKS access entry on the cluster and `get` on pytorchjobs.kubeflow.org" in (
        str(error.value)
    )


def test_an_api_server_that_does_not_answer_is_one_error_without_a_status() -> None:
    with serving(ClusterApiServer()) as server:
        url = server.url
    api = KubeClient.from_kubeconfig(config_with_user(url, {"token": "token"}))
    with pytest.raises(KubernetesApiError) as error:
        stop_job(api, "training", "exp", poll_s=0)
    assert error.value.status is None
    assert str(error.value).startswith(f"get pytorchjobs.kubeflow.org: no answer from the "
                                       f"Kubernetes API server {url}")  # fmt: skip


def test_the_fake_refuses_an_apply_without_a_field_manager_as_the_api_server_does(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    with pytest.raises(KubernetesApiError) as error:
        api.apply_job(PYTORCHJOB, "training", "exp", {"spec": {}}, field_manager="", force=True)
    assert error.value.status == 422
    assert "fieldManager: Required value: is required for apply patch" in str(error.value)


# --- start -----------------------------------------------------------------------------------


def test_start_resumes_and_waits_for_every_worker(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    first = {pod["metadata"]["uid"] for pod in cluster.pods.values()}
    stop_job(api, "training", "exp", poll_s=0)
    lines: list[str] = []
    result = start_job(
        api, "training", "exp", stack="exp", poll_s=0, watch_poll_s=0, on_progress=lines.append
    )
    assert not result.was_running
    assert result.progress.startswith("2/2 workers running")
    assert "counts afresh from this start" in result.message
    assert {pod["metadata"]["uid"] for pod in cluster.pods.values()}.isdisjoint(first)
    conditions = {c["type"]: c for c in cluster.job()["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "False"
    assert conditions["Suspended"]["reason"] == "PyTorchJobResumed"
    assert cluster.job()["spec"]["runPolicy"]["suspend"] is False
    assert lines[0] == "resumed PyTorchJob training/exp: waiting for its workers"


def test_start_waits_for_terminating_pods_before_resuming(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    cluster.operator.grace_reads = 3
    cluster.store.apply("exp", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                "metadata": {"name": "exp"},
                                "spec": {"runPolicy": {"suspend": True}}},
                        FIELD_MANAGER, force=True)  # fmt: skip
    start_job(api, "training", "exp", poll_s=0, watch_poll_s=0)
    resume = cluster.requests.index(cluster.patches[0])
    pod_lists = [r for r in cluster.requests[:resume] if r.path == cluster.pods_path]
    assert len(pod_lists) >= 3  # it polled while the old pods terminated
    assert not cluster.suspended()


def test_start_gives_up_on_pods_that_do_not_go(cluster: ClusterApiServer, api: KubeClient) -> None:
    deploy(cluster)
    cluster.operator.pods_removable = False
    stop = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "exp"},
            "spec": {"runPolicy": {"suspend": True}}}  # fmt: skip
    cluster.store.apply("exp", stop, FIELD_MANAGER, force=True)
    with pytest.raises(PodsRemainError, match=r"the resumed pods take the same names"):
        start_job(api, "training", "exp", terminating_timeout_s=60, poll_s=0, clock=Ticks(10))
    assert cluster.suspended() and cluster.patches == []


def test_starting_a_running_job_changes_nothing(cluster: ClusterApiServer, api: KubeClient) -> None:
    deploy(cluster)
    result = start_job(api, "training", "exp", poll_s=0, watch_poll_s=0)
    assert result.was_running and result.progress.startswith("2/2 workers running")
    assert cluster.patches == []


def test_a_start_whose_workers_do_not_come_releases_the_nodes_again(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    stop_job(api, "training", "exp", poll_s=0)
    cluster.operator.running = False  # the resumed job gets no pods
    with pytest.raises(JobStartError) as error:
        start_job(api, "training", "exp", stack="exp", poll_s=0, watch_poll_s=0, limit_s=30,
                  clock=Ticks(10))  # fmt: skip
    assert "not every worker started" in str(error.value)
    assert "the job was suspended so its pods and GPU nodes are released" in str(error.value)
    assert "`fsdp-eks start exp`" in str(error.value)
    assert cluster.suspended()
    assert [r.body["spec"]["runPolicy"]["suspend"] for r in cluster.patches] == [True, False, True]
    assert cluster.store.owners(SUSPEND) == {Manager(FIELD_MANAGER, APPLY)}


# --- the command-line tool imports this without pulumi -----------------------------------------


def test_stop_and_start_import_without_pulumi() -> None:
    code = (
        "import sys; import infra.job.stop_start, infra.job.kubeconfig; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('pulumi', 'pulumi_aws', 'pulumi_kubernetes', 'torch')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
