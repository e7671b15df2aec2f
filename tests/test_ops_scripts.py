"""The ops helpers for a run after `pulumi up`: status, rank-0 logs, checkpoints, loss plot.

kubectl and pulumi are stand-in executables on PATH that answer with recorded-shape JSON and
log what they were asked; S3 is moto's server on loopback (a real S3 API, not a mock object);
the metrics file is written by the trainer's own JSONL sink.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from scripts.cli import checkpoints, logs, run_target, status
from scripts.cli import plot as plot_loss
from scripts.cli.run_target import RunTarget, TargetError, export_uri, resolve, split_s3_uri
from tests.s3_server import moto_s3_endpoint, s3_environment

JOB_NAME = "llama3-8b-p5"
NAMESPACE = "training"
BUCKET = "fsdp-eks-llama3-8b-p5-data"
RUN_URI = f"s3://{BUCKET}/checkpoints/{JOB_NAME}-1a2b3c4d"


def pytorch_job(state: str = "Running", *, master: bool = False) -> dict[str, Any]:
    """`kubectl get pytorchjob -o json` of a training-operator v1 job."""
    conditions = [
        {"type": "Created", "status": "True", "lastTransitionTime": "2026-11-21T20:00:00Z"},
        {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-21T20:03:00Z"},
    ]
    if state in ("Succeeded", "Failed"):
        conditions[1]["status"] = "False"
        conditions.append(
            {
                "type": state,
                "status": "True",
                "lastTransitionTime": "2026-11-21T21:30:00Z",
                "message": f"PyTorchJob {JOB_NAME} is {state.lower()}.",
            }
        )
    replicas: dict[str, Any] = {"Worker": {"replicas": 4}}
    if master:
        replicas["Master"] = {"replicas": 1}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": JOB_NAME, "namespace": NAMESPACE},
        "spec": {"runPolicy": {"activeDeadlineSeconds": 6 * 3600}, "pytorchReplicaSpecs": replicas},
        "status": {
            "conditions": conditions,
            "startTime": "2026-11-21T20:00:00Z",
            "replicaStatuses": {"Worker": {"active": 4}},
        },
    }


def pod_list() -> dict[str, Any]:
    return {
        "items": [
            {
                "metadata": {"name": f"{JOB_NAME}-worker-{i}"},
                "spec": {"nodeName": f"ip-10-0-64-{10 + i}.us-west-2.compute.internal"},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{"name": "pytorch", "restartCount": i % 2}],
                },
            }
            for i in (1, 0)
        ]
    }


def gpu_node(name: str, *, ready: bool, removing: bool = False) -> dict[str, Any]:
    """A node as `kubectl get nodes -o json` shows it; Cluster Autoscaler taints a node it
    removes with ToBeDeletedByClusterAutoscaler."""
    taints = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    if removing:
        taints.append({"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"})
    return {
        "metadata": {"name": name, "labels": {"fsdp-eks/node-pool": "gpu"}},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`kubectl` and `pulumi` on PATH; each call's argv is appended to calls.jsonl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps(
            {
                "pytorchjob": pytorch_job(),
                "pods": pod_list(),
                "nodes": {
                    "items": [
                        gpu_node("ip-10-0-1-1", ready=True),
                        gpu_node("ip-10-0-1-2", ready=True, removing=True),
                    ]
                },
                "outputs": {
                    "jobName": JOB_NAME,
                    "namespace": NAMESPACE,
                    "checkpointS3Uri": RUN_URI,
                    "cost": {"usdPerHour": 220.16},
                },
                "logs": [
                    "[rank0] starting\n",
                    "Batch 10 Loss: 9.87000, Speed: 12.5 samples/sec, lr: 1e-05\n",
                    "debug line\n",
                    "Batch 20 Loss: 8.12000, Speed: 12.9 samples/sec, lr: 2e-05\n",
                ],
            }
        )
    )
    program = f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
with open({str(calls)!r}, "a") as f:
    f.write(json.dumps([sys.argv[0].rsplit("/", 1)[-1], *args]) + "\\n")
answers = json.load(open({str(answers)!r}))
if sys.argv[0].endswith("pulumi"):
    print(json.dumps(answers["outputs"]))
elif "logs" in args:
    sys.stdout.writelines(answers["logs"])
elif "pytorchjob" in args:
    print(json.dumps(answers["pytorchjob"]))
elif "pods" in args:
    print(json.dumps(answers["pods"]))
elif "nodes" in args:
    print(json.dumps(answers["nodes"]))
else:
    sys.exit("unexpected " + " ".join(args))
"""
    for name in ("kubectl", "pulumi"):
        path = bin_dir / name
        path.write_text(program)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def calls(fake: Path) -> list[list[str]]:
    return [json.loads(line) for line in (fake / "calls.jsonl").read_text().splitlines()]


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


def test_status_command_reads_the_stack_outputs(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main(["--stack", "llama3-8b-p5"]) == 0
    out = capsys.readouterr().out
    assert f"job {JOB_NAME} ({NAMESPACE}): Running" in out and "$220.16/h" in out
    assert "GPU nodes: 1 ready, 1 removing" in out
    assert calls(fake_cli)[-1] == [
        "kubectl", "-n", NAMESPACE, "get", "nodes", "-l", "fsdp-eks/node-pool=gpu", "-o", "json"
    ]  # fmt: skip
    assert calls(fake_cli)[:-1] == [
        ["pulumi", "stack", "output", "--json", "--stack", "llama3-8b-p5"],
        ["kubectl", "-n", NAMESPACE, "get", "pytorchjob", JOB_NAME, "-o", "json"],
        [
            "kubectl",
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            f"training.kubeflow.org/job-name={JOB_NAME}",
            "-o",
            "json",
        ],
    ]


def test_status_command_fails_for_a_failed_job_and_without_a_target(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = fake_cli / "answers.json"
    data = json.loads(answers.read_text())
    data["pytorchjob"] = pytorch_job("Failed")
    answers.write_text(json.dumps(data))
    assert status.main(["--job", JOB_NAME, "-n", NAMESPACE, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["state"] == "Failed"
    assert status.main([]) == 2
    assert "pass --job NAME or --stack STACK" in capsys.readouterr().err


# --- logs -----------------------------------------------------------------------------------


def test_rank0_is_worker_0_unless_there_is_a_master() -> None:
    assert logs.rank0_pod(pytorch_job()) == f"{JOB_NAME}-worker-0"
    assert logs.rank0_pod(pytorch_job(master=True)) == f"{JOB_NAME}-master-0"


def test_logs_command_line() -> None:
    target = RunTarget(JOB_NAME, NAMESPACE, None, None, kube_context="prod")
    assert logs.logs_command(target, "p-worker-0", tail=100, previous=True) == [
        "kubectl",
        "-n",
        NAMESPACE,
        "--context",
        "prod",
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


def test_logs_follow_rank0_and_filter_loss_lines(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert logs.main(["--stack", "exp", "--loss"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "Batch 10 Loss: 9.87000, Speed: 12.5 samples/sec, lr: 1e-05",
        "Batch 20 Loss: 8.12000, Speed: 12.9 samples/sec, lr: 2e-05",
    ]
    assert calls(fake_cli)[-1] == [
        "kubectl",
        "-n",
        NAMESPACE,
        "logs",
        f"{JOB_NAME}-worker-0",
        "-c",
        "pytorch",
        "--follow",
    ]
    assert logs.main(["--job", JOB_NAME, "--namespace", NAMESPACE, "--no-follow"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_logs_of_every_node_prefixed_and_only_errors(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--node all` is one kubectl follow of every pod of the job, each line prefixed with
    its pod; `--errors` keeps what a failure leaves (tracebacks, NCCL warnings)."""
    assert logs.main(["--stack", "exp", "--node", "all", "--errors"]) == 0
    assert capsys.readouterr().out == ""  # the fake pods' lines hold no error
    assert calls(fake_cli)[-1] == [
        "kubectl", "-n", NAMESPACE, "logs",
        f"--selector=training.kubeflow.org/job-name={JOB_NAME}",
        "-c", "pytorch", "--prefix", "--max-log-requests=64", "--follow",
    ]  # fmt: skip
    assert logs.main(["--stack", "exp", "--node", "1", "--no-follow"]) == 0
    assert calls(fake_cli)[-1][4] == f"{JOB_NAME}-worker-1"
    lines = ["[pod/w-1/pytorch] ok\n", "[pod/w-1/pytorch] Traceback (most recent call last):\n"]
    kept = io.StringIO()
    assert logs.copy_lines(lines, kept, only_loss=False, only_errors=True) == 1
    assert "Traceback" in kept.getvalue()


def test_a_node_the_job_does_not_have_is_one_line(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert logs.main(["--stack", "exp", "--node", "9"]) == 2
    assert "--node 9: PyTorchJob" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        logs.main(["--stack", "exp", "--node", "last"])


# --- checkpoints (moto's S3 server) ---------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3")
    bucket, prefix = split_s3_uri(RUN_URI)
    existing = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if bucket in existing:
        for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
    else:
        client.create_bucket(Bucket=bucket)
    objects = {
        "step-100/COMPLETE": b'{"step": 100}',
        "step-100/__0_0.distcp": b"x" * 1000,
        "step-100/.metadata": b"m",
        "step-200/COMPLETE": b'{"step": 200}',
        "step-200/__0_0.distcp": b"y" * 2000,
        "step-200/train_state/rank-0.pt": b"r",
        "step-300/__0_0.distcp": b"z" * 10,  # no marker: still being exported
        "export/config.json": b"{}",
        "export/model.safetensors": b"w" * 50,
        "metrics.jsonl": b'{"kind": "train", "step": 1, "loss": 5.0}\n',
        "tensorboard/events.out": b"e",
    }
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
    client.put_object(Bucket=bucket, Key="checkpoints/other-run/step-999/COMPLETE", Body=b"{}")
    return client


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
    with pytest.raises(TargetError, match="no checkpoint 'step-7'; there are: step-100"):
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
    with pytest.raises(TargetError, match="step-300 has no COMPLETE marker"):
        checkpoints.download(s3, RUN_URI, found["step-300"], tmp_path)
    partial = checkpoints.download(s3, RUN_URI, found["step-300"], tmp_path, allow_incomplete=True)
    assert [p.name for p in partial] == ["__0_0.distcp"]


def test_checkpoints_command_list_and_download(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checkpoints.main(["--s3-uri", RUN_URI, "list"]) == 0
    table = capsys.readouterr().out
    assert "step-200       yes" in table and "step-300       NO" in table and RUN_URI in table
    assert checkpoints.main(["--s3-uri", RUN_URI, "list", "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)][-1] == "export"
    assert checkpoints.main(["--s3-uri", RUN_URI, "download", "export", str(tmp_path)]) == 0
    assert (tmp_path / "export/model.safetensors").stat().st_size == 50
    assert checkpoints.main(["--s3-uri", RUN_URI, "download", "step-300", str(tmp_path)]) == 2
    assert "no COMPLETE marker" in capsys.readouterr().err


def test_checkpoints_without_a_location_say_what_to_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert checkpoints.main(["list"]) == 2
    assert "--s3-uri s3://BUCKET/PREFIX" in capsys.readouterr().err


# --- the loss plot --------------------------------------------------------------------------


def write_metrics(path: Path) -> None:
    """The trainer's own sink writes the file, so the format is the trainer's."""
    from trainer.metrics import JsonlSink

    sink = JsonlSink(path)
    for step in range(1, 41):
        sink.write({"kind": "train", "step": step, "loss": 10.0 / step, "lr": 1e-4})
        if step % 10 == 0:
            sink.write({"kind": "validation", "step": step, "val_loss": 12.0 / step})
    sink.write({"kind": "train", "step": 40, "loss": 0.2, "lr": 1e-4})  # resumed: later wins
    sink.close()
    with path.open("a") as f:
        f.write("not json\n")


def test_read_curves_from_the_trainers_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path)
    curves = plot_loss.read_curves(path.read_text().splitlines())
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
    curves = plot_loss.read_curves(path.read_text().splitlines())
    assert curves.restarts == [(0, "hang")]
    assert curves.summary().endswith(", 1 restart(s)")
    assert plot_loss.plot(curves, tmp_path / "loss.png", title="t").stat().st_size > 10_000


def test_ema_smoothing() -> None:
    assert plot_loss.ema([1.0, 1.0, 1.0], 0.5) == [1.0, 1.0, 1.0]
    assert plot_loss.ema([0.0, 4.0], 0.5) == [0.0, 2.0]
    assert plot_loss.ema([3.0, 5.0], 0.0) == [3.0, 5.0]
    with pytest.raises(ValueError, match=r"--smooth must be in \[0, 1\)"):
        plot_loss.ema([1.0], 1.0)


def test_plot_command_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    write_metrics(path)
    assert plot_loss.main([str(path), "--smooth", "0.6"]) == 0
    png = path.with_name("loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"wrote {png}" in capsys.readouterr().out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert plot_loss.main([str(empty)]) == 2
    assert "no loss records" in capsys.readouterr().err


def test_status_command_reads_the_restarts_from_the_runs_metrics_file_in_s3(
    s3: Any, fake_cli: Path, capsys: pytest.CaptureFixture[str]
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
    assert status.main(["--job", JOB_NAME, "-n", NAMESPACE, "--s3-uri", RUN_URI]) == 0
    out = capsys.readouterr().out
    assert "restarts: 1 (the last after crash, resumed at step 100); 7 step(s)" in out


def test_plot_command_reads_the_metrics_file_from_s3(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "remote.png"
    assert plot_loss.main(["--s3-uri", RUN_URI, "--out", str(out)]) == 0
    assert out.exists() and "1 logged steps" in capsys.readouterr().out


# --- where checkpoints land in S3 -----------------------------------------------------------


def test_export_uri_follows_the_data_repository_association() -> None:
    path = "/fsx/checkpoints/run-1"
    assert export_uri(path, "b", mount_path="/fsx") == "s3://b/checkpoints/run-1"
    assert (
        export_uri(path, "b", mount_path="/fsx", file_system_path="/checkpoints", prefix="exp/")
        == "s3://b/exp/run-1"
    )
    with pytest.raises(TargetError, match="not under the FSx directory linked to S3"):
        export_uri(path, "b", mount_path="/fsx", file_system_path="/data")


def test_checkpoint_uri_is_derived_from_the_stack_outputs_and_fsx_settings(
    fake_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama2-7b-p4d keeps checkpoints on FSx (exported); dev (no FSx) in S3 itself."""
    answers = fake_cli / "answers.json"
    data = json.loads(answers.read_text())
    del data["outputs"]["checkpointS3Uri"]
    data["outputs"].update(
        {"checkpointPath": "/fsx/checkpoints/llama2-1a2b", "bucketName": "exp-data"}
    )
    answers.write_text(json.dumps(data))
    target = resolve(
        argparse.Namespace(
            stack="llama2-7b-p4d", job=None, namespace=None, s3_uri=None, context=None
        )
    )
    assert target.require_checkpoint_uri() == "s3://exp-data/checkpoints/llama2-1a2b"
    # dev has no FSx: the trainer writes the run into the bucket, and the output says where.
    data["outputs"]["checkpointPath"] = "s3://exp-data/checkpoints/dev-1a2b"
    answers.write_text(json.dumps(data))
    no_fsx = resolve(
        argparse.Namespace(stack="dev", job=None, namespace=None, s3_uri=None, context=None)
    )
    assert no_fsx.require_job() == JOB_NAME
    assert no_fsx.require_checkpoint_uri() == "s3://exp-data/checkpoints/dev-1a2b"


# --- the stack's own cluster ----------------------------------------------------------------


def test_ops_commands_reach_the_stacks_cluster_not_the_current_context(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a `clusterName` output, kubectl gets a kubeconfig of that cluster (endpoint and CA
    from EKS DescribeCluster, moto's server here; the token from `aws eks get-token`) in the
    stack file's region; an explicit --context still wins."""
    # moto's server answers EKS too; the region comes from the stack file, not the environment.
    for key, value in {**s3_environment(s3_endpoint), "XDG_CACHE_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    eks = boto3.session.Session(region_name="us-west-2").client("eks")
    created = eks.create_cluster(
        name="team-gpu",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]},
    )["cluster"]
    outputs = {"clusterName": "team-gpu", "jobName": JOB_NAME, "namespace": NAMESPACE}
    monkeypatch.setattr(run_target, "read_stack_outputs", lambda stack: outputs)
    options = argparse.Namespace(
        stack="llama31-8b-p5", job=None, namespace=None, s3_uri=None, context=None
    )
    target = run_target.resolve(options)
    command = target.kubectl("get", "pods")
    assert command[:5] == ["kubectl", "-n", NAMESPACE, "--kubeconfig", target.kubeconfig]
    config_path = Path(str(target.kubeconfig))
    assert config_path.parent == tmp_path / "fsdp-eks"
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_path.parent.stat().st_mode) == 0o700
    config = yaml.safe_load(config_path.read_text())
    (cluster,) = config["clusters"]
    assert cluster["cluster"]["server"] == created["endpoint"]
    (user,) = config["users"]
    assert user["user"]["exec"]["args"] == [
        "eks", "get-token", "--cluster-name", "team-gpu", "--output", "json",
        "--region", "us-west-2",
    ]  # fmt: skip
    explicit = run_target.resolve(argparse.Namespace(**{**vars(options), "context": "prod"}))
    assert explicit.kubeconfig is None and "--context" in explicit.kubectl("get", "pods")


def test_a_cluster_still_being_created_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """DescribeCluster has no endpoint or certificate while the cluster is CREATING."""

    class Creating:
        meta = argparse.Namespace(region_name="us-west-2")

        def describe_cluster(self, name: str) -> dict[str, Any]:
            return {"cluster": {"name": name, "status": "CREATING"}}

    monkeypatch.setattr(
        boto3.session, "Session", lambda **kwargs: argparse.Namespace(client=lambda _: Creating())
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(
        run_target, "read_stack_outputs", lambda stack: {"clusterName": "new", "jobName": "j"}
    )
    options = argparse.Namespace(stack="dev", job=None, namespace=None, s3_uri=None, context=None)
    with pytest.raises(TargetError, match=r"cluster 'new' has no endpoint yet \(status CREATING\)"):
        run_target.resolve(options)
