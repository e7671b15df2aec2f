"""Which training run an ops helper talks to: read from a stack's outputs, or given by flags.

After `pulumi up -s <stack>` the stack outputs name the PyTorchJob, its namespace and where
its checkpoints land in S3; the helpers (status, logs, checkpoints, plot_loss) read them with
`pulumi stack output --json`, so a user only types the stack name. Every value can also be
given as a flag, for a run on a cluster without the Pulumi state at hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("fsdp_eks.ops")

# Output names, first match wins (STACK exports the first of each; the others are accepted).
JOB_NAME_KEYS = ("jobName", "job_name")
NAMESPACE_KEYS = ("namespace", "jobNamespace")
CHECKPOINT_URI_KEYS = ("checkpointS3Uri", "checkpointUri")
USD_PER_HOUR_KEYS = ("estimatedUsdPerHour", "usdPerHour")


class TargetError(RuntimeError):
    """The run cannot be identified: the message says which flag or output is missing."""


@dataclass(frozen=True)
class RunTarget:
    job_name: str | None
    namespace: str
    checkpoint_uri: str | None
    """s3://bucket/prefix of the run's checkpoint directory (FSx exports it there)."""
    usd_per_hour: float | None
    kube_context: str | None = None
    stack: str | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    kubeconfig: str | None = None
    """The stack's own cluster access (`scripts.cli.stack_kubeconfig`), when the stack names one."""

    def require_job(self) -> str:
        if not self.job_name:
            raise TargetError("no job name: pass --job NAME or --stack STACK (after pulumi up)")
        return self.job_name

    def require_checkpoint_uri(self) -> str:
        """The flag or output, else derived from the stack's outputs and FSx settings."""
        uri = self.checkpoint_uri
        if uri is None and self.stack is not None:
            uri = checkpoint_uri_from_stack(self.stack, self.outputs)
        if not uri:
            raise TargetError(
                "no checkpoint location: pass --s3-uri s3://BUCKET/PREFIX or --stack STACK "
                "(after pulumi up)"
            )
        return uri

    def kubectl(self, *args: str) -> list[str]:
        """A kubectl command line for this run's namespace, on the stack's cluster (or the
        context given with --context; the current one only when neither is known)."""
        command = ["kubectl", "-n", self.namespace]
        if self.kube_context:
            command += ["--context", self.kube_context]
        elif self.kubeconfig:
            command += ["--kubeconfig", self.kubeconfig]
        return [*command, *args]


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("which run")
    group.add_argument("--stack", "-s", help="Pulumi stack whose outputs name the run")
    group.add_argument("--job", help="PyTorchJob name (default: the stack's jobName output)")
    group.add_argument("--namespace", "-n", help="namespace (default: the stack's output)")
    group.add_argument("--s3-uri", help="checkpoint location s3://BUCKET/PREFIX")
    group.add_argument(
        "--context",
        help="kubectl context (default: the stack's cluster from its outputs; else the current)",
    )


def read_stack_outputs(stack: str, *, cwd: Path = ROOT) -> dict[str, Any]:
    """`pulumi stack output --json` of `stack` (secrets stay hidden)."""
    if shutil.which("pulumi") is None:
        raise TargetError(
            "the pulumi CLI is not on PATH; install it, or pass --job/--namespace/--s3-uri"
        )
    result = subprocess.run(
        ["pulumi", "stack", "output", "--json", "--stack", stack],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        error = result.stderr.strip()
        raise TargetError(f"pulumi stack output for stack {stack!r} failed: {error}")
    outputs = json.loads(result.stdout or "{}")
    if not isinstance(outputs, dict):
        raise TargetError(f"stack {stack!r} outputs are not a JSON object: {result.stdout[:200]}")
    return outputs


def first(outputs: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if outputs.get(key) is not None:
            return outputs[key]
    return None


def export_uri(
    checkpoint_path: str,
    bucket: str,
    *,
    mount_path: str,
    file_system_path: str = "/",
    prefix: str = "",
) -> str:
    """Where FSx's data repository association exports a directory of the mounted volume.

    The pods mount the Lustre root at `mount_path`; the association links the Lustre directory
    `file_system_path` to `s3://bucket/prefix`.
    """
    try:
        inside = PurePosixPath("/") / PurePosixPath(checkpoint_path).relative_to(mount_path)
        linked = inside.relative_to(file_system_path)
    except ValueError:
        raise TargetError(
            f"{checkpoint_path} is not under the FSx directory linked to S3 "
            f"({mount_path} + {file_system_path}); pass --s3-uri"
        ) from None
    key = "/".join(part for part in (prefix.strip("/"), linked.as_posix()) if part and part != ".")
    return f"s3://{bucket}/{key}"


def checkpoint_uri_from_stack(stack: str, outputs: Mapping[str, Any]) -> str | None:
    """The S3 location of the run's checkpoints from `checkpointPath` + `bucketName` outputs and
    the stack file's FSx settings; None when the outputs do not say."""
    path, bucket = outputs.get("checkpointPath"), outputs.get("bucketName")
    if isinstance(path, str) and path.startswith("s3://"):
        return path  # no FSx: the trainer writes the run into the bucket itself
    if not isinstance(path, str) or not isinstance(bucket, str):
        return None
    from infra.config import load_stack_file  # the stack model: pydantic, no pulumi

    fsx = load_stack_file(stack).storage.fsx
    if not fsx.enabled or not fsx.auto_export:
        raise TargetError(
            f"stack {stack!r} keeps checkpoints on FSx without exporting them to S3 "
            "(storage.fsx.autoExport); there is nothing to list"
        )
    return export_uri(
        path,
        bucket,
        mount_path=fsx.mount_path,
        file_system_path=fsx.file_system_path,
        prefix=fsx.data_repository_prefix,
    )


def resolve(options: argparse.Namespace) -> RunTarget:
    """Flags first, then the stack's outputs, then defaults."""
    outputs = read_stack_outputs(options.stack) if options.stack else {}
    usd = first(outputs, USD_PER_HOUR_KEYS)
    cost = outputs.get("cost")
    if usd is None and isinstance(cost, Mapping):
        usd = cost.get("usdPerHour")
    return RunTarget(
        job_name=options.job or first(outputs, JOB_NAME_KEYS),
        namespace=options.namespace or first(outputs, NAMESPACE_KEYS) or "default",
        checkpoint_uri=options.s3_uri or first(outputs, CHECKPOINT_URI_KEYS),
        usd_per_hour=float(usd) if isinstance(usd, int | float) else None,
        kube_context=options.context,
        stack=options.stack,
        outputs=outputs,
        kubeconfig=_stack_access(options.stack, outputs) if options.context is None else None,
    )


def _stack_access(stack: str | None, outputs: Mapping[str, Any]) -> str | None:
    """The kubeconfig of the cluster the stack's `clusterName` output names, in its region."""
    cluster = outputs.get("clusterName")
    if stack is None or not isinstance(cluster, str):
        return None
    from scripts.cli.stack_kubeconfig import ClusterNotReadyError, write_stack_kubeconfig

    try:
        from infra.config import read_stack_file

        region = read_stack_file(stack).config.get("aws:region")
    except FileNotFoundError:
        region = None
    try:
        return str(write_stack_kubeconfig(stack, cluster, region))
    except ClusterNotReadyError as error:
        raise TargetError(str(error)) from None


def kubectl_json(target: RunTarget, *args: str) -> dict[str, Any]:
    """Run `kubectl ... -o json` and parse it; a failure names the command and its error."""
    command = target.kubectl(*args, "-o", "json")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TargetError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    parsed = json.loads(result.stdout)
    if not isinstance(parsed, dict):
        raise TargetError(f"{' '.join(command)} did not return a JSON object")
    return parsed


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/a/b -> ("bucket", "a/b") (no trailing slash)."""
    if not uri.startswith("s3://"):
        raise TargetError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise TargetError(f"{uri!r} names no bucket")
    return bucket, prefix.strip("/")
