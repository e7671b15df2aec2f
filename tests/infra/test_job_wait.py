"""The start rule `pulumi up` waits on, over PyTorchJob and Pod documents as the API serves them.

Job documents follow the v1.9.0 CRD (each status is validated against its schema) and what the
operator writes into them: conditions `Created`/`Running`/`Failed` with reasons
`PyTorchJob<Type>` (v1.9.0 `pkg/util/status.go` `NewReason`), the backoff message of
`pkg/controller.v1/common/job.go`, `replicaStatuses.Worker.active` counting Running pods
(`pkg/core/status.go`). Pods carry the operator's labels and core/v1 status fields.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infra.job.start_rule import (
    DEFAULT_START_TIMEOUT_S,
    OPERATOR_PICKUP_S,
    STABLE_RUNNING_S,
    STUCK_CONTAINER_S,
    StartHistory,
    Verdict,
    assess,
)
from tests.crd_schemas import validate as validate_against_schema

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
WORKERS = 2


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, message: str, seconds_ago: float = 30) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": f"PyTorchJob{kind}",
        "message": message,
        "lastUpdateTime": stamp(seconds_ago),
        "lastTransitionTime": stamp(seconds_ago),
    }


def job(*conditions: dict[str, Any], active: int = 0, age: float = 900) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if conditions:
        status = {
            "conditions": list(conditions),
            "replicaStatuses": {"Worker": {"active": active, "selector": "x"}},
            "startTime": stamp(age),
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "exp", "namespace": "training", "creationTimestamp": stamp(age)},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": WORKERS, "template": {}}}},
        "status": status,
    }


CREATED = condition("Created", "PyTorchJob exp is created.", 900)
RUNNING = condition("Running", "PyTorchJob training/exp is running.", 300)


def pod(
    index: int,
    *,
    phase: str = "Running",
    trainer_state: dict[str, Any] | None = None,
    restarts: int = 0,
    last_state: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    init_state: dict[str, Any] | None = None,
    init_restarts: int = 0,
    init_last_state: dict[str, Any] | None = None,
    age: float = 900,
) -> dict[str, Any]:
    state = trainer_state if trainer_state is not None else {"running": {"startedAt": stamp(600)}}
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if phase != "Pending" or init_state is not None or trainer_state is not None:
        status["startTime"] = stamp(age)
        status["containerStatuses"] = [
            {
                "name": "pytorch",
                "image": "img",
                "imageID": "",
                "ready": "running" in state,
                "restartCount": restarts,
                "started": "running" in state,
                "state": state,
                "lastState": last_state or {},
            }
        ]
    if init_state is not None:
        status["initContainerStatuses"] = [
            {
                "name": "prepare-run-dirs",
                "image": "img",
                "imageID": "",
                "ready": False,
                "restartCount": init_restarts,
                "state": init_state,
                "lastState": init_last_state or {},
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"exp-worker-{index}",
            "uid": f"uid-{index}",
            "namespace": "training",
            "creationTimestamp": stamp(age),
            "labels": {
                "training.kubeflow.org/job-name": "exp",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(index),
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
            },
        },
        "status": status,
    }


def unschedulable(seconds_ago: float) -> list[dict[str, Any]]:
    return [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": stamp(seconds_ago),
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: "
            "0/3 nodes are available: 3 No preemption victims found for incoming pod.",
        }
    ]


def judge(
    job_doc: dict[str, Any],
    pods: list[dict[str, Any]],
    crd_schema: Any,
    *,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> Verdict:
    """`assess`, after checking the job's status against the CRD's status schema (the part
    this rule reads; the whole ~600 KB schema takes seconds per validation)."""
    validate_against_schema(job_doc["status"], crd_schema["properties"]["status"])
    return assess(job_doc, pods, workers=WORKERS, now=NOW, start_timeout_s=start_timeout_s)


def test_all_workers_running_is_done(crd_schema: Any) -> None:
    verdict = judge(job(CREATED, RUNNING, active=2), [pod(0), pod(1)], crd_schema)
    assert verdict == Verdict(True, None, verdict.progress)
    assert verdict.progress.startswith("2/2 workers running")


def test_one_worker_still_pulling_is_not_done(crd_schema: Any) -> None:
    """The operator's Running condition is already true with one worker running."""
    pulling = pod(1, trainer_state={"waiting": {"reason": "ContainerCreating"}}, phase="Pending")
    verdict = judge(job(CREATED, RUNNING, active=1), [pod(0), pulling], crd_schema)
    assert not verdict.done and verdict.failure is None
    assert "exp-worker-1 ContainerCreating" in verdict.progress


def test_crash_looping_workers_are_not_done(crd_schema: Any) -> None:
    """Running (and counted active by the operator) between crashes, but never for long."""
    crashed = {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError",
            "startedAt": stamp(80),
            "finishedAt": stamp(50),
        }
    }
    between_crashes = pod(
        0, trainer_state={"running": {"startedAt": stamp(15)}}, restarts=2, last_state=crashed
    )
    backing_off = pod(
        1,
        trainer_state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        restarts=2,
        last_state=crashed,
    )
    verdict = judge(job(CREATED, RUNNING, active=2), [between_crashes, backing_off], crd_schema)
    assert not verdict.done and verdict.failure is None
    assert "CrashLoopBackOff (2 restarts)" in verdict.progress


def test_a_worker_that_restarted_once_and_then_kept_running_is_done(crd_schema: Any) -> None:
    recovered = pod(1, trainer_state={"running": {"startedAt": stamp(STABLE_RUNNING_S + 5)}})
    recovered["status"]["containerStatuses"][0]["restartCount"] = 1
    verdict = judge(job(CREATED, RUNNING, active=2), [pod(0), recovered], crd_schema)
    assert verdict.done


def test_a_failed_job_fails_at_once_with_the_operators_reason_and_the_last_exit(
    crd_schema: Any,
) -> None:
    message = "Job exp has failed because it has reached the specified backoff limit"
    failed = job(CREATED, RUNNING, condition("Failed", message, 5), active=0)
    last = {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": "RendezvousConnectionError: The connection to the C10d store has failed.",
            "finishedAt": stamp(10),
        }
    }
    crashed = pod(1, trainer_state={"waiting": {"reason": "CrashLoopBackOff"}}, last_state=last)
    verdict = judge(failed, [crashed], crd_schema)
    assert not verdict.done
    assert verdict.failure is not None
    assert verdict.failure.startswith(f"PyTorchJob exp failed (PyTorchJobFailed): {message}")
    assert "exp-worker-1 exited with code 1 (Error): RendezvousConnectionError" in verdict.failure


def test_a_failed_job_without_pods_left_still_fails(crd_schema: Any) -> None:
    """cleanPodPolicy may have removed the pods by the time the failure is seen."""
    message = "PyTorchJob exp is failed because 1 Worker replica(s) failed."
    verdict = judge(job(CREATED, condition("Failed", message)), [], crd_schema)
    assert verdict.failure == f"PyTorchJob exp failed (PyTorchJobFailed): {message}"


def test_a_job_that_succeeded_before_it_was_seen_running_is_done(crd_schema: Any) -> None:
    done = job(CREATED, condition("Succeeded", "PyTorchJob training/exp successfully completed."))
    assert judge(done, [], crd_schema).done


def suspended_job(*, spec_suspend: bool) -> dict[str, Any]:
    """What training-operator v1.9.0 writes for a suspended job (`common/job.go`
    `ReconcileJobs`: Running=False and Suspended=True with reason PyTorchJobSuspended, no
    active replicas), with `spec.runPolicy.suspend` as given."""
    stopped = job(
        CREATED,
        {**condition("Running", "PyTorchJob exp is suspended."), "status": "False",
         "reason": "PyTorchJobSuspended"},
        condition("Suspended", "PyTorchJob exp is suspended."),
    )  # fmt: skip
    stopped["spec"]["runPolicy"] = {"suspend": spec_suspend}
    return stopped


def test_a_suspended_job_is_reported_at_once_with_the_command_that_resumes_it(
    crd_schema: Any,
) -> None:
    """An unchanged `pulumi up` after a failed start recreates the watch over the job the
    release suspended: it can never start, so waiting the whole start budget helps nobody."""
    verdict = judge(suspended_job(spec_suspend=True), [], crd_schema)
    assert verdict.failure == (
        "PyTorchJob exp is stopped (suspended): `fsdp-eks start <stack>` resumes it from its "
        "latest checkpoint"
    )
    assert verdict.progress == "stopped" and not verdict.done
    named = assess(suspended_job(spec_suspend=True), [], workers=WORKERS, now=NOW, stack="dev")
    assert "`fsdp-eks start dev`" in str(named.failure)


def test_a_job_being_resumed_is_not_stopped(crd_schema: Any) -> None:
    """`fsdp-eks start` set the spec to false; the operator has not yet marked it resumed."""
    verdict = judge(suspended_job(spec_suspend=False), [], crd_schema)
    assert verdict.failure is None and verdict.progress == "0/2 workers running"


@pytest.mark.parametrize(
    ("budget", "waited", "fails"),
    [
        (3600, 3600 - 60, False),
        (3600, 3600 + 60, True),
        (1200, 1200 - 60, False),
        (1200, 1200 + 60, True),
    ],
)
def test_unschedulable_workers_fail_after_the_start_budget(
    crd_schema: Any, budget: int, waited: float, fails: bool
) -> None:
    """Pending while the autoscaler brings GPU nodes up is normal, for the start budget."""
    pending = pod(1, phase="Pending", conditions=unschedulable(waited), age=waited)
    verdict = judge(
        job(CREATED, RUNNING, active=1, age=waited),
        [pod(0), pending],
        crd_schema,
        start_timeout_s=budget,
    )
    assert not verdict.done
    if fails:
        assert verdict.failure is not None
        assert verdict.failure.startswith("PyTorchJob exp: worker exp-worker-1 could not be")
        assert "3 Insufficient nvidia.com/gpu" in verdict.failure
    else:
        assert verdict.failure is None


@pytest.mark.parametrize(
    ("reason", "message", "init"),
    [
        (
            "ImagePullBackOff",
            'Back-off pulling image "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:'
            'aaaa"',
            False,
        ),
        ("ErrImagePull", "failed to pull and unpack image: not found", True),
        ("CreateContainerConfigError", 'secret "exp-hf-token" not found', False),
    ],
)
def test_containers_that_cannot_start_fail_after_a_bounded_time(
    crd_schema: Any, reason: str, message: str, init: bool
) -> None:
    waiting = {"waiting": {"reason": reason, "message": message}}

    def stuck_pod(age: float) -> dict[str, Any]:
        if init:
            return pod(
                0,
                phase="Pending",
                init_state=waiting,
                trainer_state={"waiting": {"reason": "PodInitializing"}},
                age=age,
            )
        return pod(0, phase="Pending", trainer_state=waiting, age=age)

    early = judge(job(CREATED), [stuck_pod(STUCK_CONTAINER_S - 60), pod(1)], crd_schema)
    assert early.failure is None and not early.done
    late = judge(job(CREATED), [stuck_pod(STUCK_CONTAINER_S + 60), pod(1)], crd_schema)
    assert late.failure is not None
    assert f"exp-worker-0 container {'prepare-run-dirs' if init else 'pytorch'}: " in late.failure
    assert f"{reason}: {message}" in late.failure


def test_a_job_no_operator_picks_up_fails_after_a_few_minutes(crd_schema: Any) -> None:
    early = judge(job(age=OPERATOR_PICKUP_S - 30), [], crd_schema)
    assert early.failure is None and "waiting for the training operator" in early.progress
    late = judge(job(age=OPERATOR_PICKUP_S + 30), [], crd_schema)
    assert late.failure is not None and "no training operator" in late.failure


def test_pods_of_other_replica_types_do_not_count() -> None:
    launcher = pod(0)
    launcher["metadata"]["labels"]["training.kubeflow.org/replica-type"] = "master"
    verdict = assess(job(CREATED, RUNNING, active=2), [launcher, pod(1)], workers=2, now=NOW)
    assert not verdict.done


def test_an_init_container_crash_looping_in_a_pending_pod_fails_at_the_backoff_limit(
    crd_schema: Any,
) -> None:
    """The operator's backoff count skips pods that are not Running (v1.9.0 `pkg/core/job.go`
    `PastBackoffLimit`), so this pod would hold `up` for the whole pod-start budget."""

    def crash_looping(restarts: int) -> dict[str, Any]:
        return pod(
            0,
            phase="Pending",
            init_state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            init_restarts=restarts,
            init_last_state={
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": "mkdir: cannot create directory '/fsx/runs/exp': Permission denied",
                }
            },
            trainer_state={"waiting": {"reason": "PodInitializing"}},
        )

    early = judge(job(CREATED), [crash_looping(2), pod(1)], crd_schema)
    assert early.failure is None
    late = judge(job(CREATED), [crash_looping(3), pod(1)], crd_schema)
    assert late.failure is not None
    assert "init container prepare-run-dirs failed 3 times" in late.failure
    assert "exit code 1 (Error): mkdir: cannot create directory" in late.failure


def test_an_image_error_is_timed_from_when_the_watch_first_saw_it(crd_schema: Any) -> None:
    """A 20 GB pull can take 15 minutes and then fail: the error, not the pod, is new."""
    pulling_failed = pod(
        0,
        phase="Pending",
        trainer_state={"waiting": {"reason": "ImagePullBackOff", "message": "Back-off"}},
        age=STUCK_CONTAINER_S + 900,
    )
    history = StartHistory()
    first = NOW - timedelta(seconds=30)
    history.observe([pulling_failed, pod(1)], first)
    history.observe([pulling_failed, pod(1)], NOW)
    fresh = assess(job(CREATED), [pulling_failed, pod(1)], workers=2, now=NOW, history=history)
    assert fresh.failure is None
    later = NOW + timedelta(seconds=STUCK_CONTAINER_S)
    history.observe([pulling_failed, pod(1)], later)
    stale = assess(job(CREATED), [pulling_failed, pod(1)], workers=2, now=later, history=history)
    assert stale.failure is not None and "ImagePullBackOff" in stale.failure


def test_a_mount_failure_event_fails_once_it_has_lasted_the_bound(crd_schema: Any) -> None:
    creating = pod(0, phase="Pending", trainer_state={"waiting": {"reason": "ContainerCreating"}})

    def failed_mount(first_ago: float, uid: str = "uid-0") -> dict[str, Any]:
        return {
            "type": "Warning",
            "reason": "FailedMount",
            "message": 'MountVolume.SetUp failed for volume "fsx" : timed out',
            "involvedObject": {"kind": "Pod", "name": "exp-worker-0", "uid": uid},
            "firstTimestamp": stamp(first_ago),
            "lastTimestamp": stamp(10),
        }

    def verdict(*events: dict[str, Any]) -> Verdict:
        return assess(job(CREATED), [creating, pod(1)], workers=2, now=NOW, events=events)

    assert verdict(failed_mount(STUCK_CONTAINER_S - 60)).failure is None
    # An earlier pod of the same name (another uid) left its events behind.
    assert verdict(failed_mount(STUCK_CONTAINER_S + 60, uid="old")).failure is None
    late = verdict(failed_mount(STUCK_CONTAINER_S + 60)).failure
    assert late is not None and 'FailedMount: MountVolume.SetUp failed for volume "fsx"' in late
