"""Which training run a command talks to: read from the stack's outputs, or given by flags.

After `pulumi up -s <stack>` the stack outputs name the PyTorchJob, its namespace, the cluster
and where the run's files land in S3, so a user types only the stack. Each value can also be
given as a flag, for a run whose Pulumi state is not at hand (`--job`, `--namespace`,
`--s3-uri`, and `--context` for a kubectl context of the user's own).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import click

from scripts.cli.support.errors import CliError
from scripts.cli.support.kube import cluster_client
from scripts.cli.support.pulumi import stack_outputs
from scripts.cli.support.stacks import name_of

if TYPE_CHECKING:
    from infra.job.job_api import JobApi
    from infra.job.kube_client import KubeClient

# Output names, first match wins (the program exports the first of each).
JOB_NAME_KEYS = ("jobName", "job_name")
JOB_API_KEYS = ("jobApi",)
NAMESPACE_KEYS = ("namespace", "jobNamespace")
CHECKPOINT_URI_KEYS = ("checkpointS3Uri", "checkpointUri")
USD_PER_HOUR_KEYS = ("estimatedUsdPerHour", "usdPerHour")


@dataclass(frozen=True)
class RunTarget:
    stack: str | None
    job_name: str | None
    namespace: str
    checkpoint_uri: str | None
    """s3://bucket/prefix of the run's directory (S3 itself, or where FSx exports it)."""
    usd_per_hour: float | None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    context: str | None = None
    stack_file: str | None = None
    """The stack as the user named it (a name, or a stack file's path): what its settings are
    read from; `stack` is its name, as Pulumi knows it."""
    job_api_name: str = "pytorchjob"
    """`job.api` of the deployed stack (its `jobApi` output; stacks deployed before TrainJobs
    existed have none and run a PyTorchJob), or `--job-api`."""

    @property
    def api(self) -> JobApi:
        """The job API every verb reads and changes the job through."""
        from infra.job.job_api import job_api

        return job_api(self.job_api_name)

    def require_job(self) -> str:
        if not self.job_name:
            raise CliError("no job to look at: name a deployed stack, or pass --job NAME")
        return self.job_name

    def require_checkpoint_uri(self) -> str:
        """The flag or output, else derived from the stack's outputs and FSx settings."""
        uri = self.checkpoint_uri
        if uri is None and self.stack_file is not None:
            uri = checkpoint_uri_from_stack(self.stack_file, self.outputs)
        if not uri:
            raise CliError(
                "no checkpoint location: name a stack after `pulumi up`, or pass "
                "--s3-uri s3://BUCKET/PREFIX"
            )
        return uri

    def client(self) -> KubeClient:
        """The one cluster client on the run's cluster: signed as `pulumi up` signs (the
        stack's own kubeconfig), or as `kubectl --context` would."""
        return cluster_client(self.stack_file, self.outputs.get("clusterName"), self.context)


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
        raise CliError(
            f"{checkpoint_path} is not under the FSx directory linked to S3 "
            f"({mount_path} + {file_system_path}); pass --s3-uri"
        ) from None
    key = "/".join(part for part in (prefix.strip("/"), linked.as_posix()) if part and part != ".")
    return f"s3://{bucket}/{key}"


def checkpoint_uri_from_stack(stack: str, outputs: Mapping[str, Any]) -> str | None:
    """The S3 location of the run's files from the `checkpointPath` and `bucketName` outputs
    and the stack file's FSx settings; None when the outputs do not say."""
    path, bucket = outputs.get("checkpointPath"), outputs.get("bucketName")
    if isinstance(path, str) and path.startswith("s3://"):
        return path  # no FSx: the trainer writes the run into the bucket itself
    if not isinstance(path, str) or not isinstance(bucket, str):
        return None
    from infra.config import load_stack_file

    fsx = load_stack_file(stack).storage.fsx
    if not fsx.enabled or not fsx.auto_export:
        raise CliError(
            f"stack {stack!r} keeps its run on FSx without exporting it to S3 "
            "(storage.fsx.autoExport); nothing of it can be read from here"
        )
    return export_uri(
        path,
        bucket,
        mount_path=fsx.mount_path,
        file_system_path=fsx.file_system_path,
        prefix=fsx.data_repository_prefix,
    )


def resolve_target(
    stack: str | None,
    *,
    job: str | None = None,
    namespace: str | None = None,
    s3_uri: str | None = None,
    context: str | None = None,
    job_api: str | None = None,
) -> RunTarget:
    """Flags first, then the stack's outputs, then defaults."""
    name = name_of(stack) if stack else None
    outputs = stack_outputs(name) if name and not (job and s3_uri and context) else {}
    usd = first(outputs, USD_PER_HOUR_KEYS)
    cost = outputs.get("cost")
    if usd is None and isinstance(cost, Mapping):
        usd = cost.get("usdPerHour")
    return RunTarget(
        stack=name,
        job_name=job or first(outputs, JOB_NAME_KEYS),
        namespace=namespace or first(outputs, NAMESPACE_KEYS) or "default",
        checkpoint_uri=s3_uri or first(outputs, CHECKPOINT_URI_KEYS),
        usd_per_hour=float(usd) if isinstance(usd, int | float) else None,
        outputs=outputs,
        context=context,
        stack_file=stack,
        job_api_name=job_api or first(outputs, JOB_API_KEYS) or "pytorchjob",
    )


def run_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """`--job`, `--namespace`, `--s3-uri`, `--context`: the run's parts, when not the stack's."""

    @functools.wraps(function)
    def command(
        *args: Any,
        job: str | None,
        namespace: str | None,
        s3_uri: str | None,
        context: str | None,
        job_api: str | None,
        stack: str | None,
        **kwargs: Any,
    ) -> Any:
        target = resolve_target(
            stack, job=job, namespace=namespace, s3_uri=s3_uri, context=context, job_api=job_api
        )
        return function(*args, target=target, **kwargs)

    for option in (
        click.option(
            "--job-api",
            type=click.Choice(["pytorchjob", "trainjob"]),
            help="The job's API (default: the stack's jobApi output, else pytorchjob).",
        ),
        click.option(
            "--context", help="A kubectl context of yours instead of the stack's cluster."
        ),
        click.option("--s3-uri", help="The run's files in S3 (s3://BUCKET/PREFIX)."),
        click.option("-n", "--namespace", help="The job's namespace (default: the stack's)."),
        click.option("--job", help="The job (default: the stack's jobName output)."),
    ):
        command = option(command)
    return command
