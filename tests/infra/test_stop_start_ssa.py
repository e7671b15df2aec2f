"""`fsdp-eks stop` / `start` against the field-manager rules, and what `pulumi up` does after.

The job lives in the field-management model (`tests.infra.ssa_model`, held to
structured-merge-diff's own test tables by `test_ssa_model.py`), served over HTTP by
`tests.infra.kube_fake.ClusterApiServer`; `stop_job` / `start_job` are the real functions,
talking to it through the one cluster client (`KubeClient`); `pulumi up` is the model of
pulumi-kubernetes over the same object. Each scenario fails if the design were wrong in the way
it names: a stop that does not force, a manager name pulumi-kubernetes takes over, a
merge-patch stop, a program that renders `suspend`, a start that relinquishes the field
instead of applying false.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from infra.config import load_stack_file
from infra.config.names import stack_names
from infra.estimates.run_plan import plan_run
from infra.job.kube_client import KubeClient
from infra.job.manifest import render_job
from infra.job.start_wait import WatchedJob, wait_for_start
from infra.job.stop_start import JobNotFoundError, start_job, stop_job
from infra.job.suspension import FIELD_MANAGER, suspend_patch
from tests.infra import ssa_model
from tests.infra.kube_fake import APPLY_PATCH, MERGE_PATCH, ClusterApiServer, kubeconfig, serving
from tests.infra.ssa_model import (
    APPLY,
    SUSPEND,
    TAKEOVER,
    UPDATE,
    ApiServer,
    ConflictError,
    Manager,
    Pulumi,
    job_inputs,
    suspended,
)

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:" + "a" * 64


def dev_job(image: str = IMAGE, label: str | None = None) -> dict[str, Any]:
    """The dev stack's PyTorchJob exactly as the program registers it (`render_job`)."""
    manifest = render_job(plan_run(load_stack_file("dev")), image=image, pvc_name=None)
    job = json.loads(json.dumps(manifest.as_dict()))
    if label is not None:  # a metadata-only change: the one in-place update the job gets
        job["metadata"]["labels"]["fsdp-eks/release"] = label
    return job


@pytest.fixture
def cluster() -> Iterator[ClusterApiServer]:
    job = dev_job()
    with serving(ClusterApiServer(job["metadata"]["namespace"], job["metadata"]["name"])) as s:
        yield s


@pytest.fixture
def api(cluster: ClusterApiServer) -> KubeClient:
    return KubeClient.from_kubeconfig(kubeconfig(cluster.url))


def deploy(cluster: ClusterApiServer, job: dict[str, Any] | None = None) -> Pulumi:
    """`pulumi up` of a new stack: the job created, the operator starting its pods."""
    pulumi = Pulumi(cluster.store)
    assert pulumi.up(job or dev_job()) == "create"
    with cluster.lock:
        cluster.reconcile()
    assert cluster.pods
    return pulumi


def stop(cluster: ClusterApiServer, api: KubeClient) -> None:
    stop_job(api, cluster.namespace, cluster.name, stack="dev", poll_s=0)
    assert cluster.suspended() and not cluster.pods


def start(cluster: ClusterApiServer, api: KubeClient) -> None:
    start_job(api, cluster.namespace, cluster.name, stack="dev", poll_s=0, watch_poll_s=0)
    assert not cluster.suspended() and cluster.pods


# --- 1. stop, then an unchanged `pulumi up` ---------------------------------------------------


@pytest.mark.parametrize("refresh", [False, True])
def test_an_unchanged_up_leaves_a_stopped_run_stopped(
    cluster: ClusterApiServer, api: KubeClient, refresh: bool
) -> None:
    pulumi = deploy(cluster)
    stop(cluster, api)
    # Diff: the inputs against the live object pruned to the inputs' shape, where `suspend`
    # is not: no difference, so no provider call at all (even with the live object re-read).
    assert pulumi.up(dev_job(), refresh=refresh) == "same"
    assert pulumi.up(dev_job(), refresh=refresh) == "same"
    assert cluster.suspended()
    with cluster.lock:
        cluster.reconcile()
    assert not cluster.pods


# --- 2. the stop the tool sends is a forced apply, and must be ------------------------------


def test_the_stop_is_a_forced_apply_of_suspend_alone_which_unforced_would_conflict(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    inputs = dev_job()
    deploy(cluster, inputs)
    stop(cluster, api)
    [sent] = cluster.patches
    assert sent.content_type == APPLY_PATCH
    assert sent.query == {"fieldManager": FIELD_MANAGER, "force": "true"}
    assert sent.body == suspend_patch(cluster.namespace, cluster.name, True)
    assert cluster.store.owners(SUSPEND) == {Manager(FIELD_MANAGER, APPLY)}
    # The same request without force, on a freshly created job: the creator (a plain POST by
    # pulumi-kubernetes) owns the CRD-defaulted `false`, so the apply conflicts.
    fresh = ApiServer()
    Pulumi(fresh).up(inputs)
    with pytest.raises(ConflictError) as refused:
        fresh.apply(cluster.name, sent.body, sent.query["fieldManager"], force=False)
    assert refused.value.conflicts == {Manager("pulumi-kubernetes", UPDATE): {SUSPEND}}
    assert refused.value.status()["code"] == 409


# --- 3. stop, then an in-place `pulumi up` (a metadata-only change) --------------------------


def test_an_in_place_up_after_a_stop_keeps_it_stopped(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    pulumi = deploy(cluster)
    stop(cluster, api)
    # pulumi-kubernetes takes over kubectl's and its own create's fields, then applies its
    # manifest (no `suspend`): a field `fsdp-eks` applied is neither taken nor pruned.
    assert pulumi.up(dev_job(label="b")) == "update"
    assert cluster.suspended()
    assert Manager(FIELD_MANAGER, APPLY) in cluster.store.owners(SUSPEND)


def test_the_field_manager_is_not_one_pulumi_kubernetes_takes_over() -> None:
    """The prefixes of pulumi-kubernetes v4.32.0 `await.go` `fixCSAFieldManagers` (copied
    into `ssa_model.TAKEOVER`), under either operation."""
    prefixes = {prefix for prefix, _ in TAKEOVER}
    assert prefixes == {
        "kubectl",
        "before-first-apply",
        "pulumi-kubernetes",
        "pulumi-kubernetes.exe",
        "pulumi-resource-kubernetes",
    }
    assert not any(FIELD_MANAGER.startswith(prefix) for prefix in prefixes)


@pytest.mark.parametrize(
    ("manager", "stays_stopped"),
    [(FIELD_MANAGER, True), ("kubectl", False), ("kubectl-fsdp-eks", False)],
)
def test_why_the_name_matters_a_kubectl_named_stop_is_undone_by_an_in_place_up(
    manager: str, stays_stopped: bool
) -> None:
    server = ApiServer()
    pulumi = Pulumi(server)
    pulumi.up(job_inputs())
    server.apply("exp", suspend_patch("training", "exp", True), manager, force=True)
    assert pulumi.up(job_inputs(label="b")) == "update"
    # Taken over, then pruned from Pulumi's apply, then defaulted back to false: running.
    assert suspended(server) is stays_stopped


# --- 4. a job someone else suspended ------------------------------------------------------


def test_stopping_a_job_suspended_by_kubectl_patch_holds_it_through_an_in_place_up(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    pulumi = deploy(cluster)
    # `kubectl patch pytorchjob exp --type merge -p ...`: manager kubectl-patch, an Update.
    cluster.store.merge_patch(
        cluster.name, {"spec": {"runPolicy": {"suspend": True}}}, "kubectl-patch"
    )
    result = stop_job(api, cluster.namespace, cluster.name, stack="dev", poll_s=0)
    assert result.already_stopped and "kubectl-patch (Update)" in result.message
    # An apply owns what it sends even when nothing changes; a merge patch would own nothing
    # here, and pulumi-kubernetes would take kubectl-patch's `true` over and prune it.
    assert Manager(FIELD_MANAGER, APPLY) in cluster.store.owners(SUSPEND)
    assert pulumi.up(dev_job(label="b")) == "update"
    assert cluster.suspended()


def test_why_an_apply_a_merge_patch_stop_over_kubectl_patch_is_undone() -> None:
    server = ApiServer()
    pulumi = Pulumi(server)
    pulumi.up(job_inputs())
    server.merge_patch("exp", {"spec": {"runPolicy": {"suspend": True}}}, "kubectl-patch")
    server.merge_patch("exp", {"spec": {"runPolicy": {"suspend": True}}}, FIELD_MANAGER)
    assert Manager(FIELD_MANAGER, UPDATE) not in server.owners(SUSPEND)
    pulumi.up(job_inputs(label="b"))
    assert not suspended(server)


# --- 5. stop, then a `pulumi up` that changes the job ---------------------------------------


def test_a_changed_up_replaces_a_stopped_job_which_starts_at_once(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    pulumi = deploy(cluster)
    first_uid = cluster.store.uid
    stop(cluster, api)
    new_image = IMAGE.replace("a" * 64, "b" * 64)
    assert pulumi.up(dev_job(image=new_image)) == "replace"  # replace_on_changes=["spec"]
    assert cluster.store.uid != first_uid and not cluster.suspended()
    # The same run id (unchanged trainer flags): the new job resumes the run's checkpoints.
    labels = cluster.job()["metadata"]["labels"]
    assert labels["fsdp-eks/run-id"] == dev_job()["metadata"]["labels"]["fsdp-eks/run-id"]
    spec = cluster.job()["spec"]["pytorchReplicaSpecs"]["Worker"]
    job = WatchedJob(cluster.namespace, cluster.name, workers=int(spec["replicas"]))
    assert wait_for_start(api, job, poll_s=0).startswith(f"{spec['replicas']}/")


# --- 6. the program never renders `suspend` -------------------------------------------------


@pytest.mark.parametrize("name", stack_names())
def test_no_shipped_stack_renders_suspend(name: str) -> None:
    manifest = render_job(plan_run(load_stack_file(name)), image=IMAGE, pvc_name=None)
    assert "suspend" not in manifest.spec["runPolicy"]


def test_why_rendering_suspend_false_would_restart_a_stopped_run_on_refresh() -> None:
    server = ApiServer()
    pulumi = Pulumi(server)
    pulumi.up(job_inputs(suspend=False))
    server.apply("exp", suspend_patch("training", "exp", True), FIELD_MANAGER, force=True)
    assert pulumi.up(job_inputs(suspend=False)) == "same"  # no refresh: nothing seen
    # Refreshed, the state holds the live `true` where the program says false: a spec diff,
    # so a replacement, and the new job runs.
    assert pulumi.up(job_inputs(suspend=False), refresh=True) == "replace"
    assert not suspended(server)


def test_why_rendering_suspend_false_would_make_an_in_place_up_fail() -> None:
    server = ApiServer()
    pulumi = Pulumi(server)
    pulumi.up(job_inputs(suspend=False))
    server.apply("exp", suspend_patch("training", "exp", True), FIELD_MANAGER, force=True)
    with pytest.raises(ConflictError) as refused:
        pulumi.up(job_inputs(suspend=False, label="b"))
    assert refused.value.conflicts == {Manager(FIELD_MANAGER, APPLY): {SUSPEND}}


# --- 7. start applies false, whoever holds true ----------------------------------------------


def legacy_release(cluster: ClusterApiServer) -> None:
    """What `release_gpus` sent before it used the one helper: a JSON merge patch through
    urllib, no fieldManager, so the API server names the manager from the User-Agent."""
    request = urllib.request.Request(
        cluster.url + cluster.job_path,
        data=json.dumps({"spec": {"runPolicy": {"suspend": True}}}).encode(),
        method="PATCH",
        headers={"Authorization": "Bearer k8s-aws-v1.test-token", "Content-Type": MERGE_PATCH},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def test_start_resumes_a_job_whose_stop_has_two_owners(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    deploy(cluster)
    legacy_release(cluster)
    assert cluster.store.owners(SUSPEND) == {Manager("Python-urllib", UPDATE)}
    stop(cluster, api)  # the same value: shared ownership, no conflict
    assert cluster.store.owners(SUSPEND) == {
        Manager("Python-urllib", UPDATE),
        Manager(FIELD_MANAGER, APPLY),
    }
    start(cluster, api)
    assert cluster.store.owners(SUSPEND) == {Manager(FIELD_MANAGER, APPLY)}


def test_why_apply_false_a_relinquishing_start_leaves_the_other_owners_true() -> None:
    server = ApiServer()
    Pulumi(server).up(job_inputs())
    server.merge_patch("exp", {"spec": {"runPolicy": {"suspend": True}}}, "Python-urllib")
    server.apply("exp", suspend_patch("training", "exp", True), FIELD_MANAGER, force=True)
    identity = {k: v for k, v in suspend_patch("training", "exp", False).items() if k != "spec"}
    server.apply("exp", identity, FIELD_MANAGER, force=True)
    assert suspended(server)


def test_after_a_start_pulumi_leaves_the_running_job_alone(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    pulumi = deploy(cluster)
    stop(cluster, api)
    start(cluster, api)
    assert pulumi.up(dev_job(), refresh=True) == "same"
    assert pulumi.up(dev_job(label="b")) == "update"
    assert not cluster.suspended()


# --- 8. a job deleted outside Pulumi ---------------------------------------------------------


def test_a_deleted_job_is_recreated_only_by_a_refreshing_up(
    cluster: ClusterApiServer, api: KubeClient
) -> None:
    pulumi = deploy(cluster)
    cluster.store.delete(cluster.name)  # kubectl delete pytorchjob
    assert pulumi.up(dev_job()) == "same" and cluster.store.obj is None
    with pytest.raises(JobNotFoundError, match=r"`pulumi up --refresh -s dev` recreates it"):
        stop_job(api, cluster.namespace, cluster.name, stack="dev", poll_s=0)
    assert pulumi.up(dev_job(), refresh=True) == "create" and cluster.store.obj is not None
    assert ssa_model.get_path(cluster.store.obj, SUSPEND) is False
