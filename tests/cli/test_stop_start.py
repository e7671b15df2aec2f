"""`fsdp-eks stop` / `start` as typed, against a cluster on loopback that keeps the PyTorchJob
in the field-management model (`tests.infra.kube_fake`, `tests.infra.ssa_model`) and plays the
training operator; then the modelled `pulumi up` of the same job, to hold what the commands
say the next `up` does. The waits poll at their real intervals on a clock that only advances
when they sleep (`scripts.cli.job.PACING`), so no test sleeps."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from infra.job.stop_start import STOP_POLL_S, Pacing
from tests.cli.conftest import (
    assert_one_line_failure,
    assert_one_line_mistake,
    run_cli,
    set_answers,
)
from tests.infra import kube_fake
from tests.infra.kube_fake import ClusterApiServer, FakeClock, kubeconfig, serving
from tests.infra.ssa_model import Pulumi, job_inputs
from tests.s3_server import moto_server_endpoint, s3_environment

STACKS = Path(__file__).resolve().parents[2] / "stacks"


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("scripts.cli.job.PACING", Pacing(clock=fake, sleep=fake.sleep))
    return fake


@pytest.fixture
def cluster(fake_cli: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterApiServer]:
    """The dev stack deployed: its outputs name the job, and its cluster is the loopback one
    (the DescribeCluster path to it is tested below, on moto)."""
    with serving(ClusterApiServer(namespace="training", name="exp")) as server:
        set_answers(
            fake_cli, outputs={"jobName": "exp", "namespace": "training", "clusterName": "lab"}
        )
        monkeypatch.setattr(
            "scripts.cli.support.kube.stack_cluster_access",
            lambda stack, name: (kubeconfig(server.url), None),
        )
        yield server


def deploy(cluster: ClusterApiServer) -> Pulumi:
    pulumi = Pulumi(cluster.store)
    pulumi.up(job_inputs())
    with cluster.lock:
        cluster.reconcile()
    return pulumi


def test_stop_then_an_unchanged_pulumi_up_leaves_the_run_stopped(
    cluster: ClusterApiServer, clock: FakeClock
) -> None:
    pulumi = deploy(cluster)
    stopped = run_cli("stop", "dev")
    assert stopped.code == 0, stopped
    assert clock.slept == [STOP_POLL_S] * 2  # polls while the pods went, at the real interval
    assert cluster.suspended() and not cluster.live_pods()
    assert "Stopped PyTorchJob training/exp" in stopped.out
    assert "`fsdp-eks start dev` resumes it" in stopped.out
    assert "A `pulumi up` that leaves the job unchanged" in stopped.out
    # What the message promises, on the modelled engine: unchanged inputs, with and without
    # a refresh, leave it stopped.
    assert pulumi.up(job_inputs()) == "same" and cluster.suspended()
    pulumi.refresh()
    assert pulumi.up(job_inputs()) == "same" and cluster.suspended()


def test_start_resumes_a_stopped_run(cluster: ClusterApiServer) -> None:
    deploy(cluster)
    assert run_cli("stop", "dev").code == 0
    started = run_cli("start", "dev", "--no-wait")
    assert started.code == 0, started
    assert not cluster.suspended()
    with cluster.lock:
        cluster.reconcile()
    assert cluster.live_pods()


def test_start_of_a_stack_whose_file_was_edited_since_waits_the_default_budget(
    cluster: ClusterApiServer, tmp_path: Path
) -> None:
    """The job on the cluster is what starts: a stack file that no longer plans only costs
    its start budget, which falls back to job.startTimeoutMinutes' default (said so)."""
    deploy(cluster)
    assert run_cli("stop", "dev").code == 0
    edited = tmp_path / "Pulumi.dev.yaml"
    edited.write_text((STACKS / "Pulumi.dev.yaml").read_text() + "  fsdp-eks:nonsense: 1\n")
    started = run_cli("start", str(edited), "--no-wait")
    assert started.code == 0, started
    assert "does not plan now" in started.err and "default start budget, 60 min" in started.err
    assert not cluster.suspended()


def test_a_finished_job_is_one_line_naming_the_relaunch(cluster: ClusterApiServer) -> None:
    deploy(cluster)
    job = cluster.job()
    status: dict[str, Any] = dict(job.get("status") or {})
    condition = {"type": "Succeeded", "status": "True", "reason": "Done", "message": "m"}
    status["conditions"] = [*(status.get("conditions") or []), condition]
    cluster.store.update_status(cluster.name, status, "training-operator")
    assert_one_line_mistake(run_cli("stop", "dev"), "pulumi up --replace")
    assert_one_line_mistake(run_cli("start", "dev", "--no-wait"), "pulumi up --replace")


def test_a_missing_job_is_one_line(cluster: ClusterApiServer) -> None:
    assert_one_line_mistake(run_cli("stop", "dev"), "pulumi up --refresh")


def test_the_commands_sign_as_pulumi_up_does(
    fake_cli: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kubeconfig stop/start (and every command that reaches the cluster) use is the
    program's: DescribeCluster in the stack file's region (moto's EKS here), `aws eks
    get-token` with the stack's admin role when the caller is not that role already."""

    from scripts.cli.support.kube import stack_cluster_access

    shipped = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.dev.yaml").read_text()
    )
    shipped["config"]["aws:region"] = "eu-west-1"
    cluster_section = shipped["config"].setdefault("fsdp-eks:cluster", {})
    cluster_section["adminRoleArn"] = "arn:aws:iam::123456789012:role/ml-admins"
    stack = tmp_path / "Pulumi.shared.yaml"
    stack.write_text(yaml.safe_dump(shipped))
    with moto_server_endpoint() as endpoint:
        for key, value in s3_environment(endpoint).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        eks = boto3.session.Session(region_name="eu-west-1").client("eks")
        created = eks.create_cluster(
            name="lab",
            roleArn="arn:aws:iam::123456789012:role/eks",
            resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]},
        )["cluster"]
        document, _ = stack_cluster_access(str(stack), "lab")
    (cluster,) = document["clusters"]
    assert cluster["cluster"]["server"] == created["endpoint"]
    (user,) = document["users"]
    args = user["user"]["exec"]["args"]
    assert args[:4] == ["eks", "get-token", "--cluster-name", "lab"]
    assert args[args.index("--region") + 1] == "eu-west-1"  # the stack file's aws:region
    # moto's caller is not the admin role: get-token assumes it, as the program's provider does.
    assert args[args.index("--role-arn") + 1] == "arn:aws:iam::123456789012:role/ml-admins"


def _user_kubeconfig(path: Path, server: str, *, context: str) -> Path:
    """A kubeconfig file of the user's own whose one context is named `context`."""
    return kube_fake.user_kubeconfig(path, server, contexts=(context,))


@pytest.fixture
def user_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ClusterApiServer, Path]]:
    """The cluster reached only through a context of the user's kubeconfig ("lab", in the
    first of two KUBECONFIG files; the second names "lab" too, for another server, and loses
    as it does for kubectl); the stack's own kubeconfig is out of reach."""
    with serving(ClusterApiServer(namespace="training", name="exp")) as server:
        first = _user_kubeconfig(tmp_path / "first.yaml", server.url, context="lab")
        second = _user_kubeconfig(tmp_path / "second.yaml", "http://127.0.0.1:9", context="lab")
        monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")

        def unreachable(stack: str, name: str) -> Any:
            raise AssertionError("the stack's kubeconfig was used despite --context")

        monkeypatch.setattr("scripts.cli.support.kube.stack_cluster_access", unreachable)
        yield server, first


def test_stop_and_start_honour_context_and_job_without_a_stack(
    user_kubeconfig: tuple[ClusterApiServer, Path], no_pulumi: None
) -> None:
    """`--job/--namespace/--context` name a run without a stack (no Pulumi state at hand)."""
    cluster, _ = user_kubeconfig
    deploy(cluster)
    run = ["--job", "exp", "-n", "training", "--context", "lab"]
    stopped = run_cli("stop", *run)
    assert stopped.code == 0, stopped
    assert cluster.suspended() and not cluster.live_pods()
    started = run_cli("start", *run, "--no-wait")
    assert started.code == 0, started
    assert not cluster.suspended()


def test_stop_of_a_stack_reaches_it_through_context(
    user_kubeconfig: tuple[ClusterApiServer, Path], fake_cli: Path
) -> None:
    cluster, _ = user_kubeconfig
    set_answers(fake_cli, outputs={"jobName": "exp", "namespace": "training", "clusterName": "x"})
    deploy(cluster)
    stopped = run_cli("stop", "dev", "--context", "lab")
    assert stopped.code == 0, stopped
    assert cluster.suspended()


def test_an_unknown_context_is_one_line_naming_the_contexts(
    user_kubeconfig: tuple[ClusterApiServer, Path], no_pulumi: None
) -> None:
    assert_one_line_mistake(
        run_cli("stop", "--job", "exp", "--context", "prod"),
        "--context prod: no such context in",
        "(contexts: lab)",
    )


def test_a_context_with_relative_ca_and_token_files_reads_them_beside_its_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go resolves a kubeconfig's file paths against the folder of the file that
    names them (`tools/clientcmd/loader.go` `ResolveLocalPaths`)."""
    from infra.job.kube_client import KubeClient

    folder = tmp_path / "kube"
    folder.mkdir()
    (folder / "ca.crt").write_bytes(b"PEM")
    (folder / "token").write_text("secret-token\n")
    (folder / "config").write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {"server": "https://k", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [{"name": "me", "user": {"tokenFile": "token"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "k", "user": "me"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(folder / "config"))
    configuration = KubeClient.from_user_context("lab").api_client.configuration
    assert configuration.host == "https://k"
    assert Path(configuration.ssl_ca_cert).read_bytes() == b"PEM"
    assert configuration.api_key["BearerToken"] == "Bearer secret-token"


def test_a_cluster_that_does_not_answer_is_a_failure_and_no_credentials_a_mistake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    """Exit 1 when the API server does not answer (a KubernetesApiError), exit 2 when the
    kubeconfig's credential command fails (a KubernetesCredentialError: the user's to fix)."""
    closed = _user_kubeconfig(tmp_path / "closed.yaml", "http://127.0.0.1:9", context="lab")
    monkeypatch.setenv("KUBECONFIG", str(closed))
    assert_one_line_failure(
        run_cli("stop", "--job", "exp", "-n", "training", "--context", "lab"),
        "no answer from the Kubernetes API server http://127.0.0.1:9",
    )
    document = json.loads(kubeconfig("http://127.0.0.1:9", exit_code=1))
    document["contexts"][0]["name"] = document["current-context"] = "lab"
    (tmp_path / "refused.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "refused.yaml"))
    assert_one_line_mistake(
        run_cli("stop", "--job", "exp", "-n", "training", "--context", "lab"),
        "credential command",
    )
