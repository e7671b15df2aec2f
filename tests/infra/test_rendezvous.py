"""The job's c10d rendezvous tolerates a late worker 0, on paper and under a real torchrun, and
what its `read_timeout` does not bound: a worker 0 that hangs mid-run.

The rule (torch `elastic/rendezvous/c10d_rendezvous_backend.py` `_create_tcp_store`): an
agent that does not host the store connects to it as a `TCPStore` client whose timeout is the
rendezvous `read_timeout` (default 60 s), before any `join_timeout` applies. On the cluster the
agents of workers 1..N-1 are those clients: the operator points PET_RDZV_ENDPOINT at
`<job>-worker-0` (training-operator v1.9 `pkg/controller.v1/pytorch/elastic.go`
`generateEnvRDZVEndpoint`), which only worker 0's pod hostname matches (torch
`elastic/rendezvous/utils.py` `_matches_machine_hostname`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.config import parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.job.manifest import render_job
from scripts.cli.support.local_topology import operator_env
from tests.trainer.torchrun_util import REPO_ROOT, free_port

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:" + "a" * 64

HOST_DELAY_S = 6.0
"""How long after the early agent the store-hosting agent starts when the early one should
wait for it: a twentieth of the long read timeout, so the outcome never depends on load."""
SHORT_READ_TIMEOUT_S = 2
LONG_READ_TIMEOUT_S = 120

WORKER = "import os; print('joined rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"

AGENT = """
import pathlib, sys, time
from torch.distributed.run import main

ready, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.05)
main(sys.argv[3:])
"""
"""torchrun's own entry point, started only once torch is imported and the test says go to
this agent: the order of the agents' rendezvous is then the order the test gives, whatever
an import of torch costs on a loaded machine."""


@pytest.mark.parametrize("start_minutes", [None, 25, 180])
def test_the_job_renders_rendezvous_timeouts_equal_to_its_start_budget(
    start_minutes: int | None,
) -> None:
    """Long enough that a worker whose node comes up last still joins; no longer, so that the
    workers that did start give up (in the cluster, without `up` watching) once the budget is
    spent instead of holding their GPUs."""
    job: dict[str, object] = {"maxRunHours": 1}
    if start_minutes is not None:
        job["startTimeoutMinutes"] = start_minutes
    config = parse_stack_config(
        {
            "gpuNodes": {"instanceType": "g5.8xlarge", "count": 2},
            "job": job,
            "training": {"maxSteps": 50},
            "model": {"preset": "llama3.2-1b", "numLayers": 2},  # fits an A10G's 24 GiB
        },
        stack_name="exp",
    )
    budget = (start_minutes or 60) * 60
    assert config.job.start_timeout_seconds == budget
    policy = render_job(plan_run(config), image=IMAGE, pvc_name=None).spec["elasticPolicy"]
    conf = {item["key"]: int(item["value"]) for item in policy["rdzvConf"]}
    # Both timeouts: read (connecting to worker 0's store) and join (waiting for the rest).
    assert conf == {"read_timeout": budget, "join_timeout": budget}
    # elastic.go `generateEnvRDZVConf` joins the list as `key=value` pairs with commas; the
    # local rehearsal sets PET_RDZV_CONF from the same policy.
    env = operator_env(policy, endpoint="localhost:29500")
    assert env["PET_RDZV_CONF"] == f"join_timeout={budget},read_timeout={budget}"


def _agent(
    tmp_path: Path, role: str, port: int, *, read_timeout: int, is_host: bool
) -> subprocess.Popen[str]:
    """One torchrun agent of a two-node job with one trivial worker process; it starts its
    rendezvous when `_go(tmp_path, role)` is called.

    The endpoint is loopback, which `_matches_machine_hostname` takes as "this machine" for
    both agents: the first one started would host the store itself. `is_host` therefore says
    explicitly which agent hosts, as the pod hostnames do on the cluster; a `False` agent
    takes the same client path as worker 1 there (`_create_tcp_store`, cfg_is_host set).
    """
    conf = f"read_timeout={read_timeout},join_timeout=60,is_host={str(is_host).lower()}"
    command = [
        sys.executable,
        str(tmp_path / "agent.py"),
        str(tmp_path / f"{role}.ready"),
        str(tmp_path / f"{role}.go"),
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=late-worker-0",
        f"--rdzv-conf={conf}",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        str(tmp_path / "worker.py"),
    ]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PET_")},
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=(tmp_path / f"{role}.log").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its worker goes with it (`_stop`)
    )


def _wait_until_imported(tmp_path: Path, agents: dict[str, subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"{role}.ready").exists() for role in agents):
        assert all(a.poll() is None for a in agents.values()), "an agent died importing torch"
        assert time.monotonic() < deadline, "torch took over 120 s to import"
        time.sleep(0.05)


def _go(tmp_path: Path, role: str) -> None:
    (tmp_path / f"{role}.go").touch()


def _wait_until_listening(port: int, host: subprocess.Popen[str]) -> None:
    """Until the host agent's TCPStore accepts connections on `port`."""
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert host.poll() is None, "the host agent exited before hosting its store"
            assert time.monotonic() < deadline, "the host agent never hosted its store"
            time.sleep(0.05)


def _stop(process: subprocess.Popen[str]) -> None:
    """Kill an agent this test started, and its worker (the agent's own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _early_agent(
    tmp_path: Path, read_timeout: int, *, worker_0_after_s: float | None
) -> tuple[int, str, str]:
    """The client agent starts its rendezvous; worker 0's (the host) `worker_0_after_s` later,
    or never (`None`: the client's giving up then never depends on how long its connect
    retries, which `TCPStore.cpp` does with a jittered backoff). The client's exit code and
    both logs."""
    port = free_port()
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "worker.py").write_text(WORKER + "\n")
    agents = {"early": _agent(tmp_path, "early", port, read_timeout=read_timeout, is_host=False)}
    if worker_0_after_s is not None:
        agents["host"] = _agent(tmp_path, "host", port, read_timeout=read_timeout, is_host=True)
    try:
        _wait_until_imported(tmp_path, agents)
        _go(tmp_path, "early")
        if worker_0_after_s is not None:
            time.sleep(worker_0_after_s)
            _go(tmp_path, "host")
        early_rc = agents["early"].wait(timeout=300)
        if early_rc == 0:
            assert agents["host"].wait(timeout=60) == 0, (tmp_path / "host.log").read_text()
    finally:
        for process in agents.values():
            _stop(process)
    host_log = tmp_path / "host.log"
    host_out = host_log.read_text() if host_log.exists() else ""
    return early_rc, (tmp_path / "early.log").read_text(), host_out


@pytest.mark.slow
def test_a_short_read_timeout_loses_an_early_worker_to_a_late_worker_0(tmp_path: Path) -> None:
    early_rc, early_out, host_out = _early_agent(
        tmp_path, SHORT_READ_TIMEOUT_S, worker_0_after_s=None
    )
    assert early_rc != 0, early_out
    # It gave up connecting to worker 0's store, before any join timeout applied, and it
    # was the short read timeout that bounded the connect (torch `socket.cpp` logs it).
    assert "RendezvousConnectionError" in early_out, early_out
    assert f"timed out after {SHORT_READ_TIMEOUT_S * 1000}ms" in early_out, early_out
    assert "joined rank" not in early_out + host_out


@pytest.mark.slow
def test_a_long_read_timeout_waits_for_a_late_worker_0(tmp_path: Path) -> None:
    early_rc, early_out, host_out = _early_agent(
        tmp_path, LONG_READ_TIMEOUT_S, worker_0_after_s=HOST_DELAY_S
    )
    assert early_rc == 0, early_out + host_out
    ranks = {line.split()[2] for line in (early_out + host_out).splitlines() if "joined" in line}
    assert ranks == {"0", "1"}


HUNG_READ_TIMEOUT_S = 2
HELD_AT_LEAST_S = 20.0
"""Ten times the read timeout: long past any bound the read timeout could set."""
TRAINING_WORKER = WORKER + "\nimport time; time.sleep(600)  # training\n"


@pytest.mark.slow
def test_a_hung_worker_0_holds_the_others_past_any_read_timeout(tmp_path: Path) -> None:
    """Why the job's `read_timeout` stays at the start budget (infra/job/manifest.py
    `rendezvous_conf`, docs/operations.md): once training runs, each agent polls worker 0's
    store (torch `elastic/agent/server/api.py` `_invoke_run` -> `num_nodes_waiting` ->
    `C10dRendezvousBackend.get_state`, a `TCPStore.get`). When worker 0's agent is stopped, not
    dead, its kernel still holds the connection: the get's timed wait ends at `read_timeout`,
    then TCPStore's client sends CANCEL_WAIT and waits for the answer without a timeout
    (`torch/csrc/distributed/c10d/TCPStore.cpp` `TCPStore::doWait`). So a shorter read timeout
    would not release the others; it would only stop them tolerating a late worker 0 (the
    test above)."""
    port = free_port()
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "worker.py").write_text(TRAINING_WORKER)
    host = _agent(tmp_path, "host", port, read_timeout=HUNG_READ_TIMEOUT_S, is_host=True)
    other = _agent(tmp_path, "other", port, read_timeout=HUNG_READ_TIMEOUT_S, is_host=False)
    try:
        _wait_until_imported(tmp_path, {"host": host, "other": other})
        _go(tmp_path, "host")
        _wait_until_listening(port, host)  # the other's short read timeout never races it
        _go(tmp_path, "other")
        deadline = time.monotonic() + 120
        while "joined" not in (tmp_path / "other.log").read_text():
            assert other.poll() is None, (tmp_path / "other.log").read_text()
            assert time.monotonic() < deadline, "the agents never started their workers"
            time.sleep(0.1)
        os.kill(host.pid, signal.SIGSTOP)  # a frozen node: the kernel keeps its sockets
        time.sleep(HELD_AT_LEAST_S)
        still_held = other.poll() is None
    finally:
        if host.poll() is None:
            os.kill(host.pid, signal.SIGCONT)
        for process in (host, other):
            _stop(process)
    assert still_held, (tmp_path / "other.log").read_text()
