"""stop / start / status / logs on a TrainJob, as tests/cli/test_stop_start.py and
tests/cli/test_ops.py hold them on a PyTorchJob: typed as a user types them, against the
loopback API server (`tests.infra.kube_fake`, `api=TRAINJOB`) playing Kubeflow Trainer v2.3.0
and JobSet. The job and its TrainingRuntime are the shipped stack's own rendering, so the
grace period and worker count the verbs read come from the real manifests."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.job.job_api import TRAINJOB
from infra.job.stack_checks import plan_stack_file
from infra.job.stop_start import STOP_MARGIN_S, STOP_POLL_S, Pacing
from infra.job.trainjob_manifest import TrainJobManifests, render_trainjob
from tests.cli.conftest import (
    LOG_LINES,
    assert_one_line_mistake,
    run_cli,
    set_answers,
)
from tests.infra.kube_fake import (
    QUEUE_LABEL,
    ClusterApiServer,
    FakeClock,
    Kueue,
    kubeconfig,
    serving,
)
from tests.infra.ssa_model import Pulumi

STACK = "llama32-1b-g5-trainjob"
NAMESPACE = "training"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("scripts.cli.job.PACING", Pacing(clock=fake, sleep=fake.sleep))
    return fake


@pytest.fixture(scope="module")
def queued() -> TrainJobManifests:
    """The shipped stack's rendering: queued by Kueue (`scheduling.kueue: true`)."""
    return render_trainjob(plan_stack_file(STACK), image=IMAGE, pvc_name="fsx-claim")


@pytest.fixture(scope="module")
def rendered(queued: TrainJobManifests) -> TrainJobManifests:
    """The same TrainJob not queued: `suspend` is the verbs' to set (a queued one's is
    Kueue's: test_a_queued_trainjob_is_stopped_and_started_through_its_workload)."""
    trainjob = copy.deepcopy(queued.trainjob)
    labels = trainjob["metadata"]["labels"]
    assert labels.pop(QUEUE_LABEL) == "fsdp-eks"
    return replace(queued, trainjob=trainjob)


@pytest.fixture
def cluster(
    fake_cli: Path, monkeypatch: pytest.MonkeyPatch, rendered: TrainJobManifests
) -> Iterator[ClusterApiServer]:
    """The TrainJob stack deployed: its outputs say `jobApi: trainjob`; the TrainJob runs with
    its four pods, each with a log."""
    yield from _deployed(fake_cli, monkeypatch, rendered, kueue=None)


@pytest.fixture
def queued_cluster(
    fake_cli: Path, monkeypatch: pytest.MonkeyPatch, queued: TrainJobManifests
) -> Iterator[ClusterApiServer]:
    """The same, queued: Kueue's webhook made it suspended, its admitted Workload resumed it."""
    yield from _deployed(fake_cli, monkeypatch, queued, kueue=Kueue())


def _deployed(
    fake_cli: Path,
    monkeypatch: pytest.MonkeyPatch,
    rendered: TrainJobManifests,
    kueue: Kueue | None,
) -> Iterator[ClusterApiServer]:
    with serving(ClusterApiServer(namespace=NAMESPACE, name=STACK, api=TRAINJOB)) as server:
        server.kueue = kueue
        set_answers(
            fake_cli,
            outputs={"jobName": STACK, "namespace": NAMESPACE, "clusterName": "lab",
                     "jobApi": "trainjob"},
        )  # fmt: skip
        monkeypatch.setattr(
            "scripts.cli.support.kube.stack_cluster_access",
            lambda stack, name: (kubeconfig(server.url), None),
        )
        server.put_runtime(rendered.runtime)
        server.put_job(rendered.trainjob)
        with server.lock:
            server.reconcile()
        for name in server.pods:
            server.logs[name] = list(LOG_LINES)
        yield server


def grace_s(rendered: TrainJobManifests) -> int:
    return int(rendered.pod_template["spec"]["terminationGracePeriodSeconds"])


def test_stop_suspends_the_trainjob_by_server_side_apply(
    cluster: ClusterApiServer, clock: FakeClock
) -> None:
    assert len(cluster.live_pods()) == 4
    stopped = run_cli("stop", STACK)
    assert stopped.code == 0, stopped
    assert f"Stopped TrainJob {NAMESPACE}/{STACK}" in stopped.out
    assert cluster.suspended() and not cluster.live_pods()
    assert clock.slept == [STOP_POLL_S] * 2
    [patch] = cluster.patches
    assert (
        patch.path
        == f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{STACK}"
    )
    assert patch.query == {"fieldManager": "fsdp-eks", "force": "true"}
    assert patch.content_type == "application/apply-patch+yaml"
    assert patch.body == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": STACK, "namespace": NAMESPACE},
        "spec": {"suspend": True},
    }


def test_stop_waits_the_runtimes_grace_period(
    cluster: ClusterApiServer, rendered: TrainJobManifests
) -> None:
    """The bound is the grace period of the pods the TrainingRuntime makes, read through it."""
    cluster.operator.pods_removable = False
    failed = run_cli("stop", STACK)
    limit = grace_s(rendered) + STOP_MARGIN_S
    assert grace_s(rendered) > 30  # not the Kubernetes default: read from the runtime
    assert failed.code == 1 and "Traceback" not in failed.err
    assert f"TrainJob {NAMESPACE}/{STACK} is suspended, but {limit:.0f} s later" in failed.err


def test_start_resumes_and_waits_for_every_node(cluster: ClusterApiServer) -> None:
    assert run_cli("stop", STACK).code == 0
    started = run_cli("start", STACK)
    assert started.code == 0, started
    assert f"Started TrainJob {NAMESPACE}/{STACK}" in started.out
    assert "4/4 workers running" in started.out
    assert not cluster.suspended() and len(cluster.live_pods()) == 4
    conditions = {c["type"]: c for c in cluster.job()["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "False"
    assert conditions["Suspended"]["reason"] == "Resumed"
    last = cluster.patches[-1]
    assert last.body["spec"] == {"suspend": False}


def test_a_finished_trainjob_is_one_line_naming_its_urn(cluster: ClusterApiServer) -> None:
    status = json.loads(json.dumps(cluster.job()["status"]))
    complete = {"type": "Complete", "status": "True", "reason": "Completed", "message": "done"}
    status["conditions"] = [{**complete, "lastTransitionTime": "2026-11-27T21:00:00Z"}]
    cluster.store.update_status(cluster.name, status, "trainer")
    assert_one_line_mistake(
        run_cli("stop", STACK),
        "has finished (Complete)",
        "trainer.kubeflow.org/v1alpha1:TrainJob::job-trainjob",
    )


def test_status_shows_the_running_trainjob_and_its_pods(cluster: ClusterApiServer) -> None:
    result = run_cli("status", STACK)
    assert result.code == 0, result
    assert f"job {STACK} ({NAMESPACE}): Running" in result.out
    assert "deadline in" in result.out  # spec.activeDeadlineSeconds (job.maxRunHours)
    for name in cluster.pods:
        assert name in result.out
    selectors = {r.query.get("labelSelector") for r in cluster.requests if r.path.endswith("/pods")}
    assert f"jobset.sigs.k8s.io/jobset-name={STACK}" in selectors
    assert run_cli("stop", STACK).code == 0
    assert f"({NAMESPACE}): Suspended" in run_cli("status", STACK).out


def test_logs_follow_node_0_in_the_node_container(cluster: ClusterApiServer) -> None:
    result = run_cli("logs", STACK, "--loss", "--no-follow")
    assert result.code == 0, result
    assert result.lines == [line.rstrip("\n") for line in LOG_LINES if "Loss:" in line]
    index = "batch.kubernetes.io/job-completion-index"
    [node0] = [n for n, p in cluster.pods.items() if p["metadata"]["labels"][index] == "0"]
    asked = [(r.path.split("/")[-2], r.query) for r in cluster.requests if r.path.endswith("/log")]
    assert asked == [(node0, {"container": "node"})]
    assert f"logs {node0} -c node" in result.err
    every = run_cli("logs", STACK, "--node", "all", "--no-follow", "--loss")
    assert every.code == 0 and len(every.lines) == 4 * 2
    assert f"--selector=jobset.sigs.k8s.io/jobset-name={STACK}" in every.err
    assert_one_line_mistake(
        run_cli("logs", STACK, "--node", "9"), "--node 9: TrainJob", "4 node(s)"
    )


def test_an_unchanged_pulumi_up_leaves_a_stopped_trainjob_stopped(
    cluster: ClusterApiServer, rendered: TrainJobManifests
) -> None:
    """What `stop` promises, on the modelled engine (tests/infra/ssa_model.py): the program
    never renders `spec.suspend`, so an unchanged `up` (refreshed or not) is no change."""
    cluster.store.delete()
    pulumi = Pulumi(cluster.store)
    inputs = {k: rendered.trainjob[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    pulumi.up(json.loads(json.dumps(inputs)))
    assert run_cli("stop", STACK).code == 0 and cluster.suspended()
    assert pulumi.up(json.loads(json.dumps(inputs))) == "same" and cluster.suspended()
    pulumi.refresh()
    assert pulumi.up(json.loads(json.dumps(inputs))) == "same" and cluster.suspended()


def test_a_queued_trainjob_is_stopped_and_started_through_its_workload(
    queued_cluster: ClusterApiServer,
) -> None:
    """The shipped stack is queued: Kueue owns the TrainJob's `suspend`, so `stop` deactivates
    the Workload the TrainJob owns and `start` activates it again (infra.job.queue_hold)."""
    cluster = queued_cluster
    assert cluster.kueue is not None and cluster.kueue.workload is not None
    assert not cluster.suspended() and len(cluster.live_pods()) == 4
    assert cluster.kueue.workload["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    stopped = run_cli("stop", STACK)
    assert stopped.code == 0, stopped
    assert cluster.kueue.workload["spec"]["active"] is False
    assert cluster.suspended() and not cluster.live_pods()
    started = run_cli("start", STACK)
    assert started.code == 0, started
    assert cluster.kueue.workload["spec"]["active"] is True
    assert not cluster.suspended()
