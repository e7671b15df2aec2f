"""`fsdp-eks dashboard`: the stack's dashboard written to a file, with how to import it, and
`--open` showing it in the stack's Grafana (a port-forward to the in-cluster one, or a managed
workspace's URL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
import yaml

from infra.config import load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.dashboard import dashboard_uid, stack_dashboard
from infra.job.grafana import metrics_namespace
from scripts.cli.main import main
from tests.cli.conftest import set_answers
from tests.s3_server import s3_environment


def test_writes_the_plans_dashboard_and_says_how_to_import_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "dev", "-o", str(out)])
    assert done.value.code == 0
    assert json.loads(out.read_text()) == json.loads(
        stack_dashboard(plan_run(load_stack_file("dev")))
    )
    printed = capsys.readouterr().out
    assert f"dashboard -> {out}" in printed and "Import" in printed


def test_an_unknown_stack_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "no-such-stack", "-o", str(tmp_path / "x.json")])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fsdp-eks dashboard: no stack 'no-such-stack'")
    assert not (tmp_path / "x.json").exists()


# --- --open: the stack's Grafana, as a user types it ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
FAKE_KUBECTL = """#!{python}
# kubectl as `fsdp-eks dashboard --open` runs it: logs argv, and for `port-forward ... L:R`
# listens on 127.0.0.1:L answering every HTTP request with the path, until SIGTERM.
import http.server, json, signal, sys
log = open({log!r}, "a")
log.write(json.dumps(sys.argv[1:]) + "\\n"); log.flush()
if "--kubeconfig" in sys.argv:
    kubeconfig = open(sys.argv[sys.argv.index("--kubeconfig") + 1]).read()
    log.write(json.dumps({{"kubeconfig": kubeconfig}}) + "\\n"); log.flush()
if {fail!r}:
    print('error: services "grafana" not found', file=sys.stderr)
    sys.exit(1)
local = int(sys.argv[-1].split(":")[0])
class Grafana(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("grafana " + self.path).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
def stop(*_):
    log.write("terminated\\n"); log.flush(); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
server = http.server.HTTPServer(("127.0.0.1", local), Grafana)
print(f"Forwarding from 127.0.0.1:{{local}} -> 3000", flush=True)
server.serve_forever()
"""
RECORDING_BROWSER = """#!/bin/sh
printf '%s\\n' "$1" >> {record}
"""


def _tools(tmp_path: Path, *, fail: bool = False) -> dict[str, str]:
    """kubectl on PATH and $BROWSER, both fakes that record what they were given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)  # fake_cli's `pulumi` and `aws` may be there already
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(
        FAKE_KUBECTL.format(python=sys.executable, log=str(tmp_path / "kubectl.log"), fail=fail)
    )
    browser = bin_dir / "browser"
    browser.write_text(RECORDING_BROWSER.format(record=tmp_path / "opened"))
    for program in (kubectl, browser):
        program.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "BROWSER": str(browser),
        "PYTHONPATH": str(ROOT),
    }


def _ctrl_c_as_at_a_terminal() -> None:
    """A shell ignores SIGINT in what it starts in the background (POSIX, asynchronous lists),
    and Python keeps an ignored SIGINT so; the command should see Ctrl-C as a user's does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _fsdp_eks(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scripts.cli.main", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )


def _opened(tmp_path: Path, command: subprocess.Popen[str]) -> str:
    """The URL the browser was given (waits for the command to get that far)."""
    record = tmp_path / "opened"
    for _ in range(600):  # a guard against a hang, not a timing assertion
        if record.exists() and record.read_text().endswith("\n"):
            return record.read_text().strip()
        if command.poll() is not None:
            raise AssertionError(command.communicate())
        time.sleep(0.1)
    raise AssertionError("the browser was never opened")


def test_open_port_forwards_to_the_stacks_grafana_until_ctrl_c(tmp_path: Path) -> None:
    env = _tools(tmp_path)
    out = tmp_path / "run.json"
    command = _fsdp_eks(
        env, "dashboard", "llama31-8b-p5", "--open", "--context", "lab", "-o", str(out)
    )
    url = _opened(tmp_path, command)
    plan = plan_run(load_stack_file("llama31-8b-p5"))
    namespace = metrics_namespace(str(plan.config.job.name))
    path = f"/d/{dashboard_uid(str(plan.config.job.name))}"
    # The forward answers: the browser's URL reaches the (fake) Grafana through kubectl.
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read().decode() == f"grafana {path}"
    command.send_signal(signal.SIGINT)  # Ctrl-C
    stdout, stderr = command.communicate(timeout=60)
    assert command.returncode == 0, stderr
    assert stderr == ""
    port = int(url.split(":")[2].split("/")[0])
    assert url == f"http://127.0.0.1:{port}{path}"
    assert stdout.splitlines() == [
        f"dashboard -> {out}",
        f"grafana: 127.0.0.1:{port} -> {namespace}/grafana:80 (kubectl port-forward; Ctrl-C "
        "stops it)",
        f"open: {url}",
        f"sign in as admin; the password: kubectl --context lab -n {namespace} get secret "
        "grafana -o jsonpath='{.data.admin-password}' | base64 -d",
        "port-forward stopped",
    ]
    argv, *rest = (tmp_path / "kubectl.log").read_text().splitlines()
    assert json.loads(argv) == [
        "--context", "lab", "port-forward", "--namespace", namespace,
        "service/grafana", f"{port}:80",
    ]  # fmt: skip
    assert rest == ["terminated"]  # the forward does not outlive the command
    assert json.loads(out.read_text()) == json.loads(stack_dashboard(plan))


def test_a_port_forward_that_fails_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = _tools(tmp_path, fail=True)
    command = _fsdp_eks(
        env,
        "dashboard",
        "llama31-8b-p5",
        "--open",
        "--context",
        "lab",
        "-o",
        str(tmp_path / "x.json"),
    )
    stdout, stderr = command.communicate(timeout=120)
    assert command.returncode == 1 and stdout == f"dashboard -> {tmp_path / 'x.json'}\n"
    assert stderr.splitlines() == [
        "fsdp-eks dashboard: kubectl port-forward to llama31-8b-p5-metrics/grafana exited (1): "
        'error: services "grafana" not found'
    ]
    assert not (tmp_path / "opened").exists()


def test_open_with_a_managed_workspace_opens_its_dashboard_url(tmp_path: Path) -> None:
    stack_file = tmp_path / "Pulumi.llama31-amg.yaml"
    text = (ROOT / "stacks" / "Pulumi.llama31-8b-p5.yaml").read_text()
    document = yaml.safe_load(text)
    url = "https://g-abc123def4.grafana-workspace.us-west-2.amazonaws.com"
    document["config"]["fsdp-eks:observability"] = {"grafanaWorkspaceUrl": url}
    stack_file.write_text(yaml.safe_dump(document))
    env = _tools(tmp_path)
    out = tmp_path / "run.json"
    command = _fsdp_eks(env, "dashboard", str(stack_file), "--open", "-o", str(out))
    stdout, stderr = command.communicate(timeout=120)
    assert command.returncode == 0, stderr
    uid = dashboard_uid(str(load_stack_file(str(stack_file)).job.name))
    assert stdout.splitlines() == [
        f"dashboard -> {out} (import it into the workspace once)",
        f"open: {url}/d/{uid}",
    ]
    assert (tmp_path / "opened").read_text() == f"{url}/d/{uid}\n"
    assert not (tmp_path / "kubectl.log").exists()


def test_open_without_a_deployed_grafana_says_to_deploy_first(
    fake_cli: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "llama31-8b-p5", "--open", "-o", str(tmp_path / "x.json")])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "fsdp-eks dashboard: stack 'llama31-8b-p5' has no in-cluster Grafana deployed: run "
        "`pulumi up -s llama31-8b-p5` first (or pass --context CONTEXT for a cluster of yours)"
    )


def test_open_reaches_the_stacks_own_cluster_as_pulumi_up_does(
    tmp_path: Path, fake_cli: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --context: the stack's outputs name the cluster, EKS (moto's server) describes
    it, and kubectl gets that kubeconfig in a private file that is gone afterwards."""
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    eks = boto3.session.Session(region_name="us-west-2").client("eks")
    created = eks.create_cluster(
        name="gpu-p5",
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]},
    )["cluster"]
    update = "aws eks update-kubeconfig --name gpu-p5 --region us-west-2"
    set_answers(
        fake_cli,
        outputs={
            "clusterName": "gpu-p5",
            "grafana": {"mode": "in-cluster"},
            "kubectl": {"updateKubeconfig": update},
        },
    )
    env = _tools(tmp_path)
    out = tmp_path / "run.json"
    command = _fsdp_eks(env, "dashboard", "llama31-8b-p5", "--open", "-o", str(out))
    url = _opened(tmp_path, command)
    command.send_signal(signal.SIGINT)
    stdout, stderr = command.communicate(timeout=60)
    assert command.returncode == 0, stderr
    namespace = metrics_namespace("llama31-8b-p5")
    assert stdout.splitlines()[3:] == [
        f"sign in as admin; the password: kubectl -n {namespace} get secret grafana -o "
        "jsonpath='{.data.admin-password}' | base64 -d",
        f"  (kubectl on this cluster: {update})",
        "port-forward stopped",
    ]
    argv, kubeconfig, stopped = (tmp_path / "kubectl.log").read_text().splitlines()
    flags = json.loads(argv)
    assert flags[0] == "--kubeconfig" and flags[2:4] == ["port-forward", "--namespace"]
    assert not Path(flags[1]).exists()  # removed when the command ended
    document = yaml.safe_load(json.loads(kubeconfig)["kubeconfig"])
    [entry] = document["clusters"]
    assert entry["cluster"]["server"] == created["endpoint"]
    assert stopped == "terminated"
    assert url.startswith("http://127.0.0.1:")
