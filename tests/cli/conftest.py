"""The `fsdp-eks` command as a user types it: `run_cli` calls its real entry point
(`scripts.cli.main.main`, what the console script runs) with the output captured and the exit
status kept; `fake_cli` puts a stand-in `pulumi` (and `aws eks get-token`) on PATH that answers with
recorded-shape JSON and logs every call, and `cluster` serves the run's cluster on loopback
(`tests.infra.kube_fake`) under the user's kubeconfig contexts `lab` and `prod`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.infra.kube_fake import TOKEN, ClusterApiServer, serving, user_kubeconfig
from tests.s3_server import moto_server_endpoint

JOB_NAME = "llama31-8b-p5"
NAMESPACE = "training"
BUCKET = "fsdp-eks-llama31-8b-p5-data"
RUN_URI = f"s3://{BUCKET}/checkpoints/{JOB_NAME}-1a2b3c4d"
STACK = "llama31-8b-p5"


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def run_cli(*args: str, stdin: str = "") -> Ran:
    """`fsdp-eks args...` in this process: stdout, stderr and the exit status a shell sees."""
    from scripts.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.stdin = old_stdin
    return Ran(code, out.getvalue(), err.getvalue())


def _assert_one_line(result: Ran, code: int, fragments: tuple[str, ...]) -> None:
    assert result.code == code, result
    text = result.err.strip()
    assert "Traceback" not in result.out + result.err
    assert len(text.splitlines()) == 1, text
    for fragment in fragments:
        assert fragment in text, text


def assert_one_line_mistake(result: Ran, *fragments: str) -> None:
    """Exit status 2, one line on stderr that says what to do, no traceback."""
    _assert_one_line(result, 2, fragments)


def assert_one_line_failure(result: Ran, *fragments: str) -> None:
    """Exit status 1 (what the command ran or asked failed, not the user's mistake), one line
    on stderr that says what failed, no traceback."""
    _assert_one_line(result, 1, fragments)


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


LOG_LINES = [
    "[rank0] starting\n",
    "Batch 10 Loss: 9.87000, Speed: 12.5 samples/sec, lr: 1e-05\n",
    "debug line\n",
    "Batch 20 Loss: 8.12000, Speed: 12.9 samples/sec, lr: 2e-05\n",
]


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


STAND_IN = """#!{python}
import json, sys
tool = sys.argv[0].rsplit("/", 1)[-1]
args = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps([tool, *args]) + "\\n")
answers = json.load(open({answers!r}))
stack = args[args.index("--stack") + 1] if "--stack" in args else None
if tool == "pulumi" and stack and stack not in answers.get("deployed", [stack]):
    sys.exit("error: no stack named '" + stack + "' found")
if tool == "pulumi":
    if args[:2] == ["stack", "--show-name"]:
        if answers.get("selected"):
            print(answers["selected"])
        else:
            sys.exit("error: no stack selected")
    elif args[:2] == ["stack", "output"]:
        print(json.dumps(answers["outputs"]))
    elif args[:2] == ["stack", "ls"]:
        print(json.dumps(answers.get("stacks", [])))
    elif args[:2] == ["stack", "export"]:
        print(json.dumps(answers.get("state", {{}})))
    elif args[:1] == ["version"]:
        print("v3.200.0")
    elif args[:1] == ["destroy"]:
        print("Destroying (" + args[-1] + ")")
    else:
        sys.exit("unexpected pulumi " + " ".join(args))
elif tool == "aws" and args[:2] == ["eks", "get-token"]:  # the kubeconfig's exec plugin
    print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1beta1",
                      "kind": "ExecCredential", "status": {{"token": {token!r}}}}}))
else:
    sys.exit("unexpected " + tool + " " + " ".join(args))
"""


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`pulumi` (and `aws eks get-token`, the kubeconfig's credential plugin) on PATH; each
    call's argv is appended to calls.jsonl and the answers come from
    answers.json (a test may rewrite it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps(
            {
                "outputs": {
                    "jobName": JOB_NAME,
                    "namespace": NAMESPACE,
                    "checkpointS3Uri": RUN_URI,
                    "cost": {"usdPerHour": 220.16},
                },
            }
        )
    )
    program = STAND_IN.format(
        python=sys.executable, calls=str(calls), answers=str(answers), token=TOKEN
    )
    for name in ("pulumi", "aws"):
        path = bin_dir / name
        path.write_text(program)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterApiServer]:
    """The run's cluster on loopback, reached through the user's contexts `lab` and `prod`
    (KUBECONFIG): the PyTorchJob running with two pods and their logs, two GPU nodes (one
    being removed by the autoscaler); no operator acts unless a test starts one."""
    with serving(ClusterApiServer(namespace=NAMESPACE, name=JOB_NAME)) as server:
        server.operator.running = False
        server.put_job(pytorch_job())
        for pod in pod_list()["items"]:
            pod["metadata"].update(
                namespace=NAMESPACE, labels={"training.kubeflow.org/job-name": JOB_NAME}
            )
            server.pods[pod["metadata"]["name"]] = pod
            server.logs[pod["metadata"]["name"]] = list(LOG_LINES)
        server.nodes = [
            gpu_node("ip-10-0-1-1", ready=True),
            gpu_node("ip-10-0-1-2", ready=True, removing=True),
        ]
        config = user_kubeconfig(tmp_path / "kubeconfig", server.url, contexts=("lab", "prod"))
        monkeypatch.setenv("KUBECONFIG", str(config))
        yield server


def answers(fake: Path) -> dict[str, Any]:
    return dict(json.loads((fake / "answers.json").read_text()))


def set_answers(fake: Path, **changes: Any) -> None:
    data = answers(fake)
    data.update(changes)
    (fake / "answers.json").write_text(json.dumps(data))


def calls(fake: Path) -> list[list[str]]:
    path = fake / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def no_pulumi(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Pulumi CLI: no selected stack to fall back on (as on a fresh machine)."""
    monkeypatch.setattr("scripts.cli.support.tools.find_tool", lambda name: None)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """moto's S3 server with a run's files: three steps (one without its marker, as during an
    export), the exported model, a metrics file and TensorBoard events."""
    from scripts.cli.support.s3 import split_s3_uri

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
