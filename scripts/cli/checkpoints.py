"""List and download a run's checkpoints from S3, where FSx exports them.

    python scripts/cli/checkpoints.py --stack llama31-8b-p5 list
    python scripts/cli/checkpoints.py --stack llama31-8b-p5 download latest ./ckpt
    python scripts/cli/checkpoints.py --s3-uri s3://bucket/checkpoints/run-1234 download export ./m

The trainer writes `step-N/` directories under its checkpoint directory on FSx and marks each
complete one with a `COMPLETE` file written last (trainer.checkpoint); FSx's data repository
association exports them to the bucket. A `step-N/` without the marker is a save in progress
or an export still catching up, so `latest` skips it and `download` refuses it unless asked.
`export` is the Hugging Face model the run writes at the end (training.exportModel).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

if __package__ in (None, ""):  # run as a script: make `scripts.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cli.run_target import TargetError, add_target_arguments, resolve, split_s3_uri
from scripts.cli.s3_download import download_prefix

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


def s3_client() -> Any:
    """A boto3 S3 client; AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 point it elsewhere (tests)."""
    import boto3

    # A session of its own: boto3's default session keeps the first credentials it resolved
    # for the life of the process, whatever the environment says later.
    return boto3.session.Session().client("s3")


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
            raise TargetError("no complete checkpoint (step-N with a COMPLETE marker) yet")
        return complete[-1]
    name = f"step-{which}" if which.isdigit() else which
    for checkpoint in checkpoints:
        if checkpoint.name == name:
            return checkpoint
    known = ", ".join(c.name for c in checkpoints) or "none"
    raise TargetError(f"no checkpoint {which!r}; there are: {known}")


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
    objects at a time (`scripts.cli.s3_download`); `progress(bytes)` per file."""
    if not checkpoint.complete and not allow_incomplete:
        raise TargetError(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_target_arguments(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list step-N checkpoints and the export")
    listing.add_argument("--json", action="store_true")
    fetch = commands.add_parser("download", help="copy one checkpoint to a local directory")
    fetch.add_argument("which", help="latest, step-N, N or export")
    fetch.add_argument("dest", type=Path, help="local directory (gets a <name>/ inside)")
    fetch.add_argument("--allow-incomplete", action="store_true")
    options = parser.parse_args(argv)
    try:
        uri = resolve(options).require_checkpoint_uri()
        client = s3_client()
        checkpoints = list_checkpoints(client, uri)
        if options.command == "list":
            if options.json:
                print(json.dumps([asdict(c) for c in checkpoints], indent=2))
            else:
                print(f"{uri}\n{format_table(checkpoints)}")
            return 0
        checkpoint = pick(checkpoints, options.which)
        with click.progressbar(
            length=checkpoint.bytes, label=checkpoint.name, file=sys.stderr
        ) as bar:
            lock = threading.Lock()

            def landed(size: int) -> None:
                with lock:
                    bar.update(size)

            files = download(
                client,
                uri,
                checkpoint,
                options.dest,
                allow_incomplete=options.allow_incomplete,
                progress=landed,
            )
    except TargetError as error:
        print(f"checkpoints: {error}", file=sys.stderr)
        return 2
    print(f"{checkpoint.name}: {len(files)} files -> {options.dest / checkpoint.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
