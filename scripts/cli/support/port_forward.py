"""`kubectl port-forward` to a Service, held while a person looks, stopped on Ctrl-C.

The one place the tool runs kubectl instead of the cluster client: a port-forward is a
streaming connection through the API server and the kubelet (SPDY/WebSocket), which kubectl
already does well. kubectl listens on 127.0.0.1 only (its `--address` default).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from scripts.cli.support.errors import CommandFailedError
from scripts.cli.support.tools import require_tool

READY_SECONDS = 60.0
"""How long kubectl may take to find a pod behind the Service and open the local port."""


def free_port() -> int:
    """A local port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def kubeconfig_file(document: dict[str, Any]) -> Iterator[Path]:
    """The stack's kubeconfig as a private temporary file, for kubectl; removed afterwards."""
    handle, name = tempfile.mkstemp(prefix="fsdp-eks-kubeconfig-", suffix=".yaml")
    try:
        with os.fdopen(handle, "w") as out:  # mkstemp's file is 0600
            yaml.safe_dump(document, out)
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def port_forward(
    access: Sequence[str], *, namespace: str, service: str, local_port: int, remote_port: int
) -> Iterator[subprocess.Popen[str]]:
    """kubectl forwarding 127.0.0.1:`local_port` to `service`:`remote_port` until the block
    ends; `access` is kubectl's cluster flags (`--context X` or `--kubeconfig FILE`). Raises
    CommandFailedError with kubectl's last line when it exits before the port answers."""
    kubectl = require_tool("kubectl")
    argv = [
        kubectl,
        *access,
        "port-forward",
        "--namespace",
        namespace,
        f"service/{service}",
        f"{local_port}:{remote_port}",
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while not _answers(local_port):
            if process.poll() is not None:
                lines = (process.stderr.read() if process.stderr else "").strip().splitlines()
                raise CommandFailedError(
                    f"kubectl port-forward to {namespace}/{service} exited "
                    f"({process.returncode}): {lines[-1] if lines else 'no message'}"
                )
            if time.monotonic() > deadline:
                raise CommandFailedError(
                    f"kubectl port-forward to {namespace}/{service} did not open port "
                    f"{local_port} within {READY_SECONDS:g} s"
                )
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
