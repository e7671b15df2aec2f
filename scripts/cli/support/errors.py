"""An error is one line: exit status 2 for a mistake the user can fix (a bad flag, stack or
stack file, a missing tool or credentials), 1 for a failure (a tool that ran and failed, a
cluster or AWS that refused or did not answer, a run that did not start); a bug says how to
see its traceback.

Errors are told apart by their type, not by their class name: the exception types of the
libraries a command used are looked up in `sys.modules`, so a command that never imported
botocore never pays for importing it here.
"""

from __future__ import annotations

import sys
from typing import IO, Any

import click

EXIT_MISTAKE = 2
"""Exit status of a refused command: a bad flag, stack, config or missing tool."""
EXIT_FAILURE = 1
"""Exit status of a command that could not do its work: what it ran or asked failed."""

DEPENDENCY_GROUPS = {
    "pulumi": "infra",
    "pulumi_aws": "infra",
    "pulumi_eks": "infra",
    "pulumi_kubernetes": "infra",
    "boto3": "infra",
    "botocore": "infra",
    "kubernetes": "infra",
    "torch": "trainer",
    "transformers": "trainer",
    "datasets": "trainer",
    "matplotlib": "local",
}
"""Where a missing import comes from (pyproject.toml dependency groups): `dev.py local` installs
the trainer without Pulumi, `pulumi install` the infra group without torch."""


class CliError(click.ClickException):
    """A mistake the user can fix: one line on stderr, prefixed with the command, exit 2."""

    exit_code = EXIT_MISTAKE

    def show(self, file: IO[Any] | None = None) -> None:
        context = click.get_current_context(silent=True)
        prefix = context.command_path if context is not None else "fsdp-eks"
        click.echo(f"{prefix}: {self.format_message()}", file=file or sys.stderr)


class CommandFailedError(CliError):
    """Not the user's mistake: what the command ran or asked failed. One line, exit 1."""

    exit_code = EXIT_FAILURE


class ToolMissingError(CliError):
    """A program a command runs is not installed."""


class ToolFailedError(CommandFailedError):
    """A program a command ran failed; the message is its last line of error output."""


def _is(error: BaseException, module: str, *names: str) -> bool:
    """Whether `error` is one of `module`'s exception types (only if `module` was imported)."""
    loaded = sys.modules.get(module)
    types = tuple(getattr(loaded, name) for name in names if hasattr(loaded, name))
    return bool(types) and isinstance(error, types)


def exit_status(error: BaseException) -> int:
    """EXIT_FAILURE for an error `explain` tells that is a failure, else EXIT_MISTAKE."""
    if _is(error, "botocore.exceptions", "NoCredentialsError", "PartialCredentialsError"):
        return EXIT_MISTAKE
    if _is(error, "infra.job.kube_client", "KubernetesCredentialError"):
        return EXIT_MISTAKE  # no usable credentials, as for AWS
    if (
        _is(error, "botocore.exceptions", "BotoCoreError", "ClientError")
        or _is(error, "infra.job.kube_client", "KubernetesApiError")
        or _is(error, "infra.job.stop_start", "PodsRemainError")
        or _is(error, "infra.job.start_rule", "JobStartError")
    ):
        return EXIT_FAILURE
    return EXIT_MISTAKE


def explain(error: BaseException) -> str | None:
    """The one line for an error a user can fix; None for a bug."""
    if _is(error, "infra.config.errors", "StackConfigError"):
        return str(error)
    if _is(error, "infra.config.names", "UnknownStackError"):
        return str(error)
    if _is(error, "botocore.exceptions", "NoCredentialsError", "PartialCredentialsError"):
        return (
            "no AWS credentials: run `aws configure` or `aws sso login`, or set AWS_PROFILE "
            "to a profile that has them"
        )
    if _is(error, "botocore.exceptions", "ClientError"):
        details: Any = getattr(error, "response", {}).get("Error", {})
        return f"AWS refused: {details.get('Code', '?')}: {details.get('Message', error)}"
    if _is(error, "botocore.exceptions", "BotoCoreError"):
        return f"AWS could not be reached: {error}"
    if _is(error, "infra.job.kube_client", "KubernetesApiError"):
        return str(error)
    if _is(error, "infra.job.stop_start", "JobControlError"):
        return str(error)
    if _is(error, "infra.job.start_rule", "JobStartError"):
        return str(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        package = error.name.split(".")[0]
        group = DEPENDENCY_GROUPS.get(package)
        if group is not None:
            return (
                f"this command needs {package} (the `{group}` dependency group), which this "
                "environment lacks: run `python3 scripts/dev.py setup` (installs every group)"
            )
    return None
