"""`fsdp-eks checkpoints`: list or download a run's checkpoints, in S3 (or where FSx exports
them).

The trainer writes `step-N/` directories under its checkpoint directory on FSx and marks each
complete one with a `COMPLETE` file written last (trainer.checkpoint); FSx's data repository
association exports them to the bucket. A `step-N/` without the marker is a save in progress
or an export still catching up, so `latest` skips it and `download` refuses it unless asked.
`export` is the Hugging Face model the run writes at the end (training.exportModel).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from scripts.cli.support.errors import CliError
from scripts.cli.support.s3 import download_prefix, s3_client, split_s3_uri
from scripts.cli.support.stacks import stack_arguments
from scripts.cli.support.target import RunTarget, run_options

COMPLETE_MARKER = "COMPLETE"  # trainer.checkpoint.COMPLETE_MARKER (not imported: it needs torch)
EXPORT_DIR = "export"
_STEP = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    name: str
    """`step-N` or `export`."""
    step: int | None
    complete: bool
    files: int
    bytes: int
    last_modified: str


def list_checkpoints(client: Any, uri: str) -> list[Checkpoint]:
    """Checkpoints (and the export) under `uri`, oldest step first."""
    bucket, prefix = split_s3_uri(uri)
    base = f"{prefix}/" if prefix else ""
    groups: dict[str, list[dict[str, Any]]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
        for item in page.get("Contents", []):
            top, _, rest = item["Key"][len(base) :].partition("/")
            if rest and (_STEP.match(top) or top == EXPORT_DIR):
                groups.setdefault(top, []).append(item)
    checkpoints = []
    for name, items in groups.items():
        match = _STEP.match(name)
        relative = {item["Key"][len(base) + len(name) + 1 :] for item in items}
        checkpoints.append(
            Checkpoint(
                name=name,
                step=int(match.group(1)) if match else None,
                complete=COMPLETE_MARKER in relative if match else True,
                files=len(items),
                bytes=sum(int(item["Size"]) for item in items),
                last_modified=max(item["LastModified"] for item in items).isoformat(),
            )
        )
    return sorted(checkpoints, key=lambda c: (c.step is None, c.step or 0))


def pick(checkpoints: list[Checkpoint], which: str) -> Checkpoint:
    """`latest` (newest complete step), `step-N`, `N` or `export`."""
    if which == "latest":
        complete = [c for c in checkpoints if c.step is not None and c.complete]
        if not complete:
            raise CliError("no complete checkpoint (step-N with a COMPLETE marker) yet")
        return complete[-1]
    name = f"step-{which}" if which.isdigit() else which
    for checkpoint in checkpoints:
        if checkpoint.name == name:
            return checkpoint
    known = ", ".join(c.name for c in checkpoints) or "none"
    raise CliError(f"no checkpoint {which!r}; there are: {known}")


def download(
    client: Any,
    uri: str,
    checkpoint: Checkpoint,
    dest: Path,
    *,
    allow_incomplete: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Copy every object of `checkpoint` to `dest/<name>/`, keeping the layout, several
    objects at a time (`scripts.cli.support.s3`); `progress(bytes)` per file."""
    if not checkpoint.complete and not allow_incomplete:
        raise CliError(
            f"{checkpoint.name} has no {COMPLETE_MARKER} marker (a save or export in progress); "
            "pass --allow-incomplete to copy it anyway"
        )
    bucket, prefix = split_s3_uri(uri)
    base = f"{prefix}/{checkpoint.name}/" if prefix else f"{checkpoint.name}/"
    return download_prefix(client, bucket, base, dest / checkpoint.name, progress=progress)


def _size(num: int) -> str:
    size = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_table(checkpoints: list[Checkpoint]) -> str:
    if not checkpoints:
        return "no checkpoints yet"
    rows = [f"{'NAME':<14} {'COMPLETE':<9} {'FILES':>6} {'SIZE':>12}  LAST MODIFIED"]
    rows += [
        f"{c.name:<14} {'yes' if c.complete else 'NO':<9} {c.files:>6} {_size(c.bytes):>12}  "
        f"{c.last_modified}"
        for c in checkpoints
    ]
    return "\n".join(rows)


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option("--json", "as_json", is_flag=True, help="List as JSON.")
@click.option(
    "--download", "which", metavar="WHICH", help="Download one: latest, step-N, N or export."
)
@click.option(
    "--to",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(),
    show_default=True,
    help="Local directory the download goes into (as DEST/<name>/).",
)
@click.option("--allow-incomplete", is_flag=True, help="Download a checkpoint not marked complete.")
def checkpoints(
    target: RunTarget, as_json: bool, which: str | None, dest: Path, allow_incomplete: bool
) -> int:
    """List a run's checkpoints and its exported model, or download one.

    \b
        fsdp-eks checkpoints llama31-8b-p5
        fsdp-eks checkpoints llama31-8b-p5 --download latest --to ./ckpt
        fsdp-eks checkpoints --s3-uri s3://bucket/checkpoints/run-1 --download export
    """
    uri = target.require_checkpoint_uri()
    client = s3_client()
    found = list_checkpoints(client, uri)
    if which is None:
        if as_json:
            click.echo(json.dumps([asdict(c) for c in found], indent=2))
        else:
            click.echo(f"{uri}\n{format_table(found)}")
        return 0
    checkpoint = pick(found, which)
    if not checkpoint.complete and not allow_incomplete:
        raise CliError(
            f"{checkpoint.name} has no {COMPLETE_MARKER} marker (a save or export in progress); "
            "pass --allow-incomplete to copy it anyway"
        )
    with click.progressbar(length=checkpoint.bytes, label=checkpoint.name, file=sys.stderr) as bar:
        lock = threading.Lock()

        def landed(size: int) -> None:
            with lock:
                bar.update(size)

        files = download(
            client, uri, checkpoint, dest, allow_incomplete=allow_incomplete, progress=landed
        )
    click.echo(f"{checkpoint.name}: {len(files)} files -> {dest / checkpoint.name}")
    return 0
