"""The commands for a run after `pulumi up`: status, logs, checkpoints, plot, tensorboard,
typed as a user types them (`fsdp-eks ...`).

pulumi is a stand-in executable on PATH that answers with recorded-shape JSON and logs what it
was asked; the cluster is the loopback API fake (`tests.infra.kube_fake`) that the real
Kubernetes client reaches through the user's kubeconfig; S3 is moto's server on loopback (a
real S3 API, not a mock object); the metrics file is written by the trainer's own JSONL sink.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from scripts.cli import checkpoints, logs, plot, status
from scripts.cli.support.errors import CliError
from scripts.cli.support.s3 import split_s3_uri
from scripts.cli.support.target import RunTarget, export_uri, resolve_target
from tests.cli.conftest import (
    JOB_NAME,
    LOG_LINES,
    NAMESPACE,
    RUN_URI,
    STACK,
    assert_one_line_mistake,
    calls,
    gpu_node,
    pod_list,
    pytorch_job,
    run_cli,
    set_answers,
    write_metrics,
)
from tests.infra.kube_fake import TOKEN, ClusterApiServer, Kueue
from tests.s3_server import s3_environment

# --- status ---------------------------------------------------------------------------------


def test_status_summarizes_a_running_job() -> None:
    now = datetime(2026, 11, 21, 21, 30, tzinfo=UTC)
    summary = status.summarize(pytorch_job(), pod_list(), now=now, usd_per_hour=220.16)
    assert summary.state == "Running"
    assert summary.elapsed_s == 90 * 60
    assert summary.spent_usd == pytest.approx(330.24)
    assert [p.name for p in summary.pods] == [f"{JOB_NAME}-worker-0", f"{JOB_NAME}-worker-1"]
    text = status.format_status(summary)
    assert f"job {JOB_NAME} ({NAMESPACE}): Running" in text
    assert "1:30:00 elapsed, deadline in 4:30:00" in text
    assert "workers: 4 active" in text and "~$330.24 (at $220.16/h" in text
    assert f"{JOB_NAME}-worker-1  Running    1" in text


def test_status_tells_where_the_gpu_lease_stands() -> None:
    nodes = status.node_rows(
        {"items": [gpu_node("b", ready=False), gpu_node("a", ready=True, removing=True)]}
    )
    assert nodes == [status.NodeRow("a", "removing"), status.NodeRow("b", "not ready")]
    assert status.gpu_node_summary(nodes) == "1 not ready, 1 removing"
    assert status.gpu_node_summary([]).startswith("none (scaled to zero")


def test_status_reads_the_restart_history_the_trainer_wrote() -> None:
    records = [
        {"kind": "run", "step": 0, "start": {"attempt": 1, "after": "fresh"}},
        {"kind": "run", "step": 0, "start": {"attempt": 2, "after": "hang", "resumed_step": 10,
                                             "steps_lost": 3, "total_wall_lost_s": 120,
                                             "goodput": 0.9}},
        {"kind": "run", "step": 0, "start": {"attempt": 3, "after": "stop:SIGTERM",
                                             "resumed_step": 20, "steps_lost": 1,
                                             "total_wall_lost_s": 300, "goodput": 0.85}},
    ]  # fmt: skip
    assert status.restart_summary(records) == (
        "restarts: 2 (the last after stop:SIGTERM, resumed at step 20); 4 step(s) and 5 min "
        "lost, goodput 85.0%"
    )
    assert status.restart_summary(records[:1]) == "restarts: none (first start)"
    assert status.restart_summary([]) is None


def test_status_of_a_finished_job_stops_the_clock() -> None:
    now = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    summary = status.summarize(pytorch_job("Failed"), {"items": []}, now=now, usd_per_hour=None)
    assert summary.state == "Failed" and summary.elapsed_s == 90 * 60
    assert "is failed" in summary.message and summary.spent_usd is None
    assert "no pods" in status.format_status(summary)


def test_status_command_reads_the_stack_outputs(fake_cli: Path, cluster: ClusterApiServer) -> None:
    result = run_cli("status", STACK, "--context", "lab")
    assert result.code == 0, result
    assert f"job {JOB_NAME} ({NAMESPACE}): Running" in result.out and "$220.16/h" in result.out
    assert "GPU nodes: 1 ready, 1 removing" in result.out
    assert f"{JOB_NAME}-worker-0  Running    0         ip-10-0-64-10" in result.out
    # No metrics source named (no observability output, no FSDP_EKS_PROMETHEUS_URL): one line.
    assert "\n  live: no metrics source (set FSDP_EKS_PROMETHEUS_URL" in result.out
    made = calls(fake_cli)
    assert made == [["pulumi", "stack", "output", "--json", "--stack", STACK]]
    asked = [(r.method, r.path, r.query.get("labelSelector")) for r in cluster.requests]
    assert asked == [
        ("GET", f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs/{JOB_NAME}", None),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
         f"training.kubeflow.org/job-name={JOB_NAME}"),
        ("GET", "/api/v1/nodes", "fsdp-eks/node-pool=gpu"),
    ]  # fmt: skip


def test_status_shows_a_queued_jobs_admission(fake_cli: Path, cluster: ClusterApiServer) -> None:
    """The job's own Kueue Workload (its ownerReference), not another job's."""
    job = pytorch_job()
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-ml-localqueue"}
    with cluster.lock:
        cluster.store.delete(JOB_NAME)
        cluster.kueue = Kueue(admits=False)
        cluster.put_job(job)
    result = run_cli("status", STACK, "--context", "lab")
    assert result.code == 0, result
    assert (
        "  queue team-ml-localqueue: pending: couldn't assign flavors to pod set worker: "
        "insufficient unused quota" in result.out
    )
    assert f"(workload pytorchjob-{JOB_NAME}-3f9a1)" in result.out


def test_status_of_an_unqueued_job_asks_for_no_workload(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    result = run_cli("status", STACK, "--context", "lab")
    assert "queue " not in result.out
    assert not [r for r in cluster.requests if "workloads" in r.path]


def test_status_without_the_right_to_list_nodes_leaves_the_lease_out(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    """Listing nodes is cluster-wide: a user bound to the namespace gets the rest."""
    cluster.forbidden.add(("list", "nodes"))
    result = run_cli("status", STACK, "--context", "lab")
    assert result.code == 0, result
    assert "Running" in result.out and "GPU nodes:" not in result.out


def test_status_command_fails_for_a_failed_job_and_without_a_target(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    cluster.store.update_status(JOB_NAME, pytorch_job("Failed")["status"], "manager")
    failed = run_cli("status", "--job", JOB_NAME, "-n", NAMESPACE, "--context", "lab", "--json")
    assert failed.code == 1 and json.loads(failed.out)["state"] == "Failed"
    # No stack named, none selected (the stand-in pulumi has no selection): one line.
    assert_one_line_mistake(run_cli("status", "--context", "lab"), "name a deployed stack", "--job")


# --- logs -----------------------------------------------------------------------------------


def test_rank0_is_worker_0_unless_there_is_a_master() -> None:
    assert logs.rank0_pod(pytorch_job()) == f"{JOB_NAME}-worker-0"
    assert logs.rank0_pod(pytorch_job(master=True)) == f"{JOB_NAME}-master-0"


def test_logs_command_line() -> None:
    """The `kubectl logs` a person would type for the same lines (the printed hint)."""
    target = RunTarget(None, JOB_NAME, NAMESPACE, None, None, context="prod")
    assert logs.logs_command(target, "p-worker-0", tail=100, previous=True) == [
        "kubectl",
        "--context",
        "prod",
        "-n",
        NAMESPACE,
        "logs",
        "p-worker-0",
        "-c",
        "pytorch",
        "--follow",
        "--tail=100",
        "--previous",
    ]
    no_follow = logs.logs_command(target, "p", follow=False)
    assert "--follow" not in no_follow


def _log_requests(cluster: ClusterApiServer) -> list[tuple[str, dict[str, str]]]:
    return [(r.path.split("/")[-2], r.query) for r in cluster.requests if r.path.endswith("/log")]


def test_logs_follow_rank0_and_filter_loss_lines(fake_cli: Path, cluster: ClusterApiServer) -> None:
    result = run_cli("logs", STACK, "--context", "lab", "--loss")
    assert result.code == 0, result
    assert result.lines == [
        "Batch 10 Loss: 9.87000, Speed: 12.5 samples/sec, lr: 1e-05",
        "Batch 20 Loss: 8.12000, Speed: 12.9 samples/sec, lr: 2e-05",
    ]
    assert result.err.splitlines()[0] == (
        f"# kubectl --context lab -n {NAMESPACE} logs {JOB_NAME}-worker-0 -c pytorch --follow"
    )
    assert _log_requests(cluster) == [
        (f"{JOB_NAME}-worker-0", {"container": "pytorch", "follow": "true"})
    ]
    plain = run_cli("logs", "--job", JOB_NAME, "-n", NAMESPACE, "--context", "lab", "--no-follow")
    assert plain.code == 0 and plain.lines == [line.rstrip("\n") for line in LOG_LINES]
    assert _log_requests(cluster)[-1][1] == {"container": "pytorch"}
    tail = run_cli("logs", STACK, "--context", "lab", "--no-follow", "--tail", "1", "--previous")
    assert tail.lines == [LOG_LINES[-1].rstrip("\n")]
    assert _log_requests(cluster)[-1][1] == {
        "container": "pytorch", "tailLines": "1", "previous": "true"
    }  # fmt: skip


def test_logs_of_every_node_prefixed_and_only_errors(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    """`--node all` follows every pod of the job at once, each line prefixed with its pod as
    `kubectl logs --prefix` does; `--errors` keeps what a failure leaves (tracebacks, NCCL
    warnings)."""
    result = run_cli("logs", STACK, "--context", "lab", "--node", "all", "--errors")
    assert result.code == 0 and result.out == ""  # the fake pods' lines hold no error
    assert result.err.split()[6:] == [
        "logs", f"--selector=training.kubeflow.org/job-name={JOB_NAME}",
        "-c", "pytorch", "--prefix", "--max-log-requests=64", "--follow",
    ]  # fmt: skip
    assert sorted(pod for pod, _ in _log_requests(cluster)) == [
        f"{JOB_NAME}-worker-0", f"{JOB_NAME}-worker-1"
    ]  # fmt: skip
    every = run_cli("logs", STACK, "--context", "lab", "--node", "all", "--loss")
    assert sorted(every.lines) == sorted(
        f"[pod/{JOB_NAME}-worker-{i}/pytorch] {line.rstrip()}"
        for i in (0, 1) for line in LOG_LINES if "Loss:" in line
    )  # fmt: skip
    assert run_cli("logs", STACK, "--context", "lab", "--node", "1", "--no-follow").code == 0
    assert _log_requests(cluster)[-1][0] == f"{JOB_NAME}-worker-1"
    lines = ["[pod/w-1/pytorch] ok\n", "[pod/w-1/pytorch] Traceback (most recent call last):\n"]
    kept = io.StringIO()
    assert logs.copy_lines(lines, kept, only_loss=False, only_errors=True) == 1
    assert "Traceback" in kept.getvalue()


def test_a_node_the_job_does_not_have_is_one_line(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    assert_one_line_mistake(
        run_cli("logs", STACK, "--context", "lab", "--node", "9"), "--node 9: PyTorchJob"
    )
    assert_one_line_mistake(
        run_cli("logs", STACK, "--context", "lab", "--node", "last"), "--node", "'last'"
    )


# --- checkpoints (moto's S3 server) ---------------------------------------------------------


def test_list_checkpoints_groups_steps_and_checks_markers(s3: Any) -> None:
    found = checkpoints.list_checkpoints(s3, RUN_URI)
    assert [(c.name, c.complete, c.files) for c in found] == [
        ("step-100", True, 3),
        ("step-200", True, 3),
        ("step-300", False, 1),
        ("export", True, 2),
    ]
    assert found[1].bytes == len(b'{"step": 200}') + 2000 + 1
    assert checkpoints.pick(found, "latest").name == "step-200"
    assert checkpoints.pick(found, "100").name == "step-100"
    with pytest.raises(CliError, match="no checkpoint 'step-7'; there are: step-100"):
        checkpoints.pick(found, "step-7")


def test_download_copies_a_checkpoint_and_refuses_an_incomplete_one(
    s3: Any, tmp_path: Path
) -> None:
    found = {c.name: c for c in checkpoints.list_checkpoints(s3, RUN_URI)}
    files = checkpoints.download(s3, RUN_URI, found["step-200"], tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == [
        "step-200/COMPLETE",
        "step-200/__0_0.distcp",
        "step-200/train_state/rank-0.pt",
    ]
    assert (tmp_path / "step-200/__0_0.distcp").read_bytes() == b"y" * 2000
    with pytest.raises(CliError, match="step-300 has no COMPLETE marker"):
        checkpoints.download(s3, RUN_URI, found["step-300"], tmp_path)
    partial = checkpoints.download(s3, RUN_URI, found["step-300"], tmp_path, allow_incomplete=True)
    assert [p.name for p in partial] == ["__0_0.distcp"]


def test_checkpoints_command_list_and_download(s3: Any, tmp_path: Path) -> None:
    listed = run_cli("checkpoints", "--s3-uri", RUN_URI)
    assert listed.code == 0, listed
    assert "step-200       yes" in listed.out and "step-300       NO" in listed.out
    assert RUN_URI in listed.out
    as_json = run_cli("checkpoints", "--s3-uri", RUN_URI, "--json")
    assert [c["name"] for c in json.loads(as_json.out)][-1] == "export"
    fetched = run_cli("checkpoints", "--s3-uri", RUN_URI, "--download", "export", "--to",
                      str(tmp_path))  # fmt: skip
    assert fetched.code == 0, fetched
    assert (tmp_path / "export/model.safetensors").stat().st_size == 50
    assert_one_line_mistake(
        run_cli("checkpoints", "--s3-uri", RUN_URI, "--download", "step-300", "--to",
                str(tmp_path)),
        "no COMPLETE marker",
    )  # fmt: skip


def test_checkpoints_without_a_location_say_what_to_pass(no_pulumi: None) -> None:
    assert_one_line_mistake(run_cli("checkpoints"), "--s3-uri s3://BUCKET/PREFIX")


# --- the loss plot --------------------------------------------------------------------------


def test_read_curves_from_the_trainers_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path)
    curves = plot.read_curves(path.read_text().splitlines())
    assert len(curves.train) == 40 and curves.train[1] == 10.0 and curves.train[40] == 0.2
    assert sorted(curves.validation) == [10, 20, 30, 40]
    assert curves.skipped_lines == 1
    assert curves.summary() == (
        "40 logged steps (1..40), loss 10.0000 -> 0.2000, best val_loss 0.3000 at step 40"
    )


def test_restarts_are_read_from_the_runs_start_records(tmp_path: Path) -> None:
    from trainer.metrics import JsonlSink

    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.write({"kind": "run", "step": 0, "start": {"attempt": 1, "after": "fresh"}})
    sink.write({"kind": "train", "step": 1, "loss": 2.0})
    sink.write({"kind": "hang", "step": 1, "reason": "no step"})
    sink.write({"kind": "run", "step": 0, "start": {"attempt": 2, "after": "hang"}})
    sink.write({"kind": "train", "step": 1, "loss": 1.5})
    sink.close()
    curves = plot.read_curves(path.read_text().splitlines())
    assert curves.restarts == [(0, "hang")]
    assert curves.summary().endswith(", 1 restart(s)")
    assert plot.plot_curves(curves, tmp_path / "loss.png", title="t").stat().st_size > 10_000


def test_ema_smoothing() -> None:
    assert plot.ema([1.0, 1.0, 1.0], 0.5) == [1.0, 1.0, 1.0]
    assert plot.ema([0.0, 4.0], 0.5) == [0.0, 2.0]
    assert plot.ema([3.0, 5.0], 0.0) == [3.0, 5.0]
    with pytest.raises(ValueError, match=r"--smooth must be in \[0, 1\)"):
        plot.ema([1.0], 1.0)


def test_plot_command_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    write_metrics(path)
    result = run_cli("plot", str(path), "--smooth", "0.6")
    assert result.code == 0, result
    png = path.with_name("metrics.png")  # not local's loss.png
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"wrote {png}" in result.out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_one_line_mistake(run_cli("plot", str(empty)), "no loss records")


def test_status_command_reads_the_restarts_from_the_runs_metrics_file_in_s3(
    s3: Any, fake_cli: Path, cluster: ClusterApiServer
) -> None:
    bucket, prefix = split_s3_uri(RUN_URI)
    start = {
        "attempt": 2,
        "after": "crash",
        "resumed_step": 100,
        "steps_lost": 7,
        "total_wall_lost_s": 600,
        "goodput": 0.95,
    }
    history = {"kind": "run", "step": 0, "start": start}
    s3.put_object(Bucket=bucket, Key=f"{prefix}/metrics.jsonl", Body=json.dumps(history) + "\n")
    result = run_cli(
        "status", "--job", JOB_NAME, "-n", NAMESPACE, "--s3-uri", RUN_URI, "--context", "lab"
    )
    assert result.code == 0, result
    assert "restarts: 1 (the last after crash, resumed at step 100); 7 step(s)" in result.out


def test_plot_command_reads_the_metrics_file_from_s3(s3: Any, tmp_path: Path) -> None:
    out = tmp_path / "remote.png"
    result = run_cli("plot", f"{RUN_URI}/metrics.jsonl", "--out", str(out))
    assert result.code == 0, result
    assert out.exists() and "1 logged steps" in result.out


# --- where checkpoints land in S3 -----------------------------------------------------------


def test_export_uri_follows_the_data_repository_association() -> None:
    path = "/fsx/checkpoints/run-1"
    assert export_uri(path, "b", mount_path="/fsx") == "s3://b/checkpoints/run-1"
    assert (
        export_uri(path, "b", mount_path="/fsx", file_system_path="/checkpoints", prefix="exp/")
        == "s3://b/exp/run-1"
    )
    with pytest.raises(CliError, match="not under the FSx directory linked to S3"):
        export_uri(path, "b", mount_path="/fsx", file_system_path="/data")


def test_checkpoint_uri_is_derived_from_the_stack_outputs_and_fsx_settings(fake_cli: Path) -> None:
    """llama2-7b-p4d keeps checkpoints on FSx (exported); dev (no FSx) in S3 itself."""
    set_answers(
        fake_cli,
        outputs={
            "jobName": JOB_NAME,
            "checkpointPath": "/fsx/checkpoints/llama2-1a2b",
            "bucketName": "exp-data",
        },
    )
    target = resolve_target("llama2-7b-p4d")
    assert target.require_checkpoint_uri() == "s3://exp-data/checkpoints/llama2-1a2b"
    # dev has no FSx: the trainer writes the run into the bucket, and the output says where.
    set_answers(
        fake_cli,
        outputs={"jobName": JOB_NAME, "checkpointPath": "s3://exp-data/checkpoints/dev-1a2b"},
    )
    no_fsx = resolve_target("dev")
    assert no_fsx.require_job() == JOB_NAME
    assert no_fsx.require_checkpoint_uri() == "s3://exp-data/checkpoints/dev-1a2b"


# --- the stack's own cluster ----------------------------------------------------------------


def test_ops_commands_reach_the_stacks_cluster_not_the_current_context(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, fake_cli: Path, cluster: ClusterApiServer
) -> None:
    """With a `clusterName` output, the client gets a kubeconfig of that cluster (endpoint and
    CA from EKS DescribeCluster, moto's server here; the token from `aws eks get-token`, run by
    the client as the exec plugin) in the stack file's region, kept in memory; an explicit
    --context still wins."""
    # moto's server answers EKS too; the region comes from the stack file, not the environment.
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    eks = boto3.session.Session(region_name="us-west-2").client("eks")
    created = eks.create_cluster(
        name="team-gpu",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]},
    )["cluster"]
    set_answers(
        fake_cli, outputs={"clusterName": "team-gpu", "jobName": JOB_NAME, "namespace": NAMESPACE}
    )
    client = resolve_target("llama31-8b-p5").client()
    assert client.server == created["endpoint"].rstrip("/")  # the client drops the slash
    assert client.api_client.configuration.api_key["BearerToken"] == f"Bearer {TOKEN}"
    assert calls(fake_cli)[-1] == [
        "aws", "eks", "get-token", "--cluster-name", "team-gpu", "--region", "us-west-2",
        "--output", "json",
    ]  # fmt: skip
    assert resolve_target("llama31-8b-p5", context="prod").client().server == cluster.url


def test_a_cluster_still_being_created_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_cli: Path
) -> None:
    """DescribeCluster has no endpoint or certificate while the cluster is CREATING."""

    class Creating:
        meta = SimpleNamespace(region_name="us-west-2")

        def describe_cluster(self, name: str) -> dict[str, Any]:
            return {"cluster": {"name": name, "status": "CREATING"}}

    monkeypatch.setattr(
        boto3.session, "Session", lambda **kwargs: SimpleNamespace(client=lambda _: Creating())
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    set_answers(fake_cli, outputs={"clusterName": "new", "jobName": "j"})
    assert_one_line_mistake(
        run_cli("status", "dev"), "cluster 'new' has no endpoint yet (status CREATING)"
    )
