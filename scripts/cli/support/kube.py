"""The one kubectl client of the commands, bound to the stack's own cluster.

The cluster's name comes from the stack's `clusterName` output and its region from the stack
file (`aws:region`); EKS tells the endpoint and certificate authority (`DescribeCluster`), and
credentials come from `aws eks get-token` at each call, as `aws eks update-kubeconfig` sets it
up (AWS CLI v2 `customizations/eks/update_kubeconfig.py`), but in a kubeconfig of the stack's
own: the user's `~/.kube/config` and its current context are neither read nor changed. Only
`--context` (an explicit choice) uses a context of the user's kubeconfig. (An EKS cluster on
Outposts, addressed by `--cluster-id`, is not handled.)
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from scripts.cli.support.errors import CliError, ToolFailedError
from scripts.cli.support.tools import require_tool

Runner = Callable[[Sequence[str], str | None], str]


class ClusterNotReadyError(CliError):
    """EKS has no endpoint or certificate for the cluster yet (it is still being created)."""


def run_command(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run kubectl; stdout, or one line with its last error."""
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        verb = " ".join(command_words(argv[1:])[:2])
        raise ToolFailedError(f"kubectl {verb} failed: {lines[-1] if lines else done.returncode}")
    return done.stdout


VALUE_OPTIONS = {"--context", "--kubeconfig", "-n", "--namespace", "--field-manager"}
"""kubectl's options whose value is the next word."""


def command_words(args: Sequence[str]) -> list[str]:
    """kubectl's verb and object (`get nodes`), without its options and their values."""
    words: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
    return words


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects (labels) out in full: no YAML anchors in manifests."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifests: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(manifests), Dumper=_PlainDumper, sort_keys=False)


class Kubectl:
    """kubectl for one cluster (a kubeconfig of its own, or an explicit context) and, by
    default, one namespace. A runner can be swapped in for tests."""

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        runner: Runner = run_command,
    ) -> None:
        self.kubeconfig, self.context, self.namespace = kubeconfig, context, namespace
        self._run = runner

    def command(self, *args: str) -> list[str]:
        """The whole kubectl command line for `args` on this cluster."""
        base = [require_tool("kubectl") if self._run is run_command else "kubectl"]
        if self.context:
            base += ["--context", self.context]
        elif self.kubeconfig:
            base += ["--kubeconfig", self.kubeconfig]
        if self.namespace:
            base += ["-n", self.namespace]
        return [*base, *args]

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self._run(self.command(*args), stdin)

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifests: Iterable[dict[str, Any]], *, field_manager: str) -> None:
        self("apply", "--server-side", f"--field-manager={field_manager}", "-f", "-",
             stdin=to_yaml(manifests))  # fmt: skip

    def delete(self, manifests: Iterable[dict[str, Any]]) -> None:
        self("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=to_yaml(manifests))


def kubeconfig_dir() -> Path:
    """A directory only this user can enter (`$XDG_CACHE_HOME/fsdp-eks`, else
    `~/.cache/fsdp-eks`): credentials config never sits at a guessable path in a shared /tmp."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "fsdp-eks"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def stack_cluster_access(stack: str, cluster: str) -> tuple[dict[str, Any], Any]:
    """(the kubeconfig `pulumi up` signs with, a boto3 session) for the stack's cluster: EKS
    `DescribeCluster` in the stack file's region, signed through `aws eks get-token` with the
    stack's `aws:profile` and `cluster.adminRoleArn` (`infra.job.kubeconfig`, the module the
    program builds its own Kubernetes provider's kubeconfig with), so the tool reaches the
    cluster as the same identity as the deploy."""
    import boto3

    from infra.config import load_stack_file, read_stack_file
    from infra.job.kubeconfig import described_cluster_kubeconfig, stack_kubernetes_access

    values = read_stack_file(stack).config
    profile = values.get("aws:profile") if isinstance(values.get("aws:profile"), str) else None
    region = values.get("aws:region") if isinstance(values.get("aws:region"), str) else None
    session = boto3.session.Session(profile_name=profile, region_name=region)
    described = session.client("eks").describe_cluster(name=cluster)["cluster"]
    if not described.get("endpoint") or not (described.get("certificateAuthority") or {}).get(
        "data"
    ):
        raise ClusterNotReadyError(
            f"EKS cluster {cluster!r} has no endpoint yet (status {described.get('status')})"
        )
    config = load_stack_file(stack)
    caller = None
    if config.cluster.admin_role_arn is not None:  # only then does who we are matter
        caller = session.client("sts").get_caller_identity().get("Arn")
    access = stack_kubernetes_access(config, profile, caller)
    document = described_cluster_kubeconfig(described, region or session.region_name, access)
    return document, session


def write_stack_kubeconfig(stack: str, cluster: str) -> Path:
    """The stack cluster's kubeconfig (`stack_cluster_access`) in a file of the stack's own
    (mode 0600, in a directory only this user can enter); its path."""
    document, _ = stack_cluster_access(stack, cluster)
    directory = kubeconfig_dir()
    path = directory / f"{stack.replace('/', '_')}.kubeconfig"
    # Written beside, then renamed over: never through a link someone else placed there.
    descriptor, staged = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        yaml.safe_dump(document, out, sort_keys=False)
    Path(staged).replace(path)
    return path
