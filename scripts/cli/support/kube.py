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

import base64
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.config.names import stack_name
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


def _kubeconfig_files() -> list[Path]:
    """The files `kubectl` reads: those `KUBECONFIG` lists (each once), else `~/.kube/config`
    (kubernetes/client-go `tools/clientcmd/loader.go` `NewDefaultClientConfigLoadingRules`)."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [Path(p) for p in dict.fromkeys(listed)]
    return [Path.home() / ".kube" / "config"]


def _absolute(path: str, base: Path) -> str:
    return path if not path or Path(path).is_absolute() else str(base / path)


def _read_referenced(path: str, base: Path, context: str) -> bytes:
    """A file a kubeconfig entry names (a CA, a token), relative to its kubeconfig's folder."""
    try:
        return Path(_absolute(path, base)).read_bytes()
    except OSError as error:
        raise CliError(f"--context {context}: {error.strerror}: {error.filename}") from None


def user_context_kubeconfig(context: str) -> dict[str, Any]:
    """A kubeconfig of one context of the user's own, as `kubectl --context` reads it: the
    files merged so that the first to name a context, cluster or user wins, and file paths in
    each resolved against that file's folder (client-go `loader.go` `Load`,
    `ResolveLocalPaths`). The cluster's CA file and the user's token file are read in, since
    `infra.job.kube_api.KubernetesApi.from_kubeconfig` takes their data only."""
    entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
        "contexts": {},
        "clusters": {},
        "users": {},
    }
    for path in _kubeconfig_files():
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            continue  # a missing file in the list is skipped, as kubectl skips it
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise CliError(f"kubeconfig {path} cannot be read: {error}") from None
        for kind, found in entries.items():
            for entry in (document.get(kind) if isinstance(document, dict) else None) or []:
                if isinstance(entry, dict) and "name" in entry:
                    found.setdefault(str(entry["name"]), (entry, path.parent.resolve()))
    if context not in entries["contexts"]:
        files = ", ".join(map(str, _kubeconfig_files()))
        known = ", ".join(entries["contexts"]) or "none"
        raise CliError(f"--context {context}: no such context in {files} (contexts: {known})")
    chosen = entries["contexts"][context][0].get("context") or {}
    cluster_name, user_name = chosen.get("cluster"), chosen.get("user")
    if cluster_name not in entries["clusters"] or user_name not in entries["users"]:
        raise CliError(
            f"--context {context}: its cluster {cluster_name!r} or user {user_name!r} is not "
            "in your kubeconfig"
        )
    cluster_entry, cluster_base = entries["clusters"][cluster_name]
    cluster = dict(cluster_entry.get("cluster") or {})
    if cluster.get("certificate-authority") and not cluster.get("certificate-authority-data"):
        ca = _read_referenced(cluster.pop("certificate-authority"), cluster_base, context)
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    user_entry, user_base = entries["users"][user_name]
    user = dict(user_entry.get("user") or {})
    if user.get("tokenFile") and not user.get("token"):
        user["token"] = _read_referenced(user["tokenFile"], user_base, context).decode().strip()
    exec_spec = user.get("exec")
    if isinstance(exec_spec, dict) and os.sep in str(exec_spec.get("command", "")):
        user["exec"] = {**exec_spec, "command": _absolute(str(exec_spec["command"]), user_base)}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": context, "context": chosen}],
        "current-context": context,
    }


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
    path = directory / f"{stack_name(stack)}.kubeconfig"
    # Written beside, then renamed over: never through a link someone else placed there.
    descriptor, staged = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        yaml.safe_dump(document, out, sort_keys=False)
    Path(staged).replace(path)
    return path
