"""`fsdp-eks tensorboard`: the run's TensorBoard event files on this machine, served.

The trainer writes its events under `<run directory>/tensorboard` (infra/job/flags.py), which
is in the stack's bucket (directly without FSx, through the file system's export with it):
this copies that folder with parallel downloads to `--dest` and runs `tensorboard --logdir` on
it. Run it again to pick up newer events.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import click

from scripts.cli.support.errors import CliError
from scripts.cli.support.s3 import download_prefix, list_objects, s3_client, split_s3_uri
from scripts.cli.support.stacks import stack_arguments
from scripts.cli.support.target import RunTarget, run_options
from scripts.cli.support.tools import require_tool

EVENTS_DIR = "tensorboard"


def fetch_events(client: object, uri: str, dest: Path) -> int:
    """Copy the run's event files to `dest`; returns how many."""
    bucket, prefix = split_s3_uri(uri)
    base = f"{prefix}/{EVENTS_DIR}/" if prefix else f"{EVENTS_DIR}/"
    items = list_objects(client, bucket, base)
    if not items:
        raise CliError(f"no TensorBoard event files under s3://{bucket}/{base} yet")
    lock = threading.Lock()
    with click.progressbar(
        length=sum(int(item.get("Size", 0)) for item in items), label="events", file=sys.stderr
    ) as bar:

        def landed(size: int) -> None:
            with lock:
                bar.update(size)

        return len(download_prefix(client, bucket, base, dest, progress=landed, items=items))


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path),
              help="Local folder (default: .tensorboard/<job>).")  # fmt: skip
@click.option("--no-serve", is_flag=True, help="Fetch the event files and exit.")
@click.option("--port", type=click.IntRange(1, 65535), default=6006, show_default=True,
              help="TensorBoard's port.")  # fmt: skip
def tensorboard(target: RunTarget, dest: Path | None, no_serve: bool, port: int) -> int:
    """Fetch a run's TensorBoard event files and serve them here.

    \b
        fsdp-eks tensorboard llama31-8b-p5
        fsdp-eks tensorboard llama31-8b-p5 --no-serve --dest ./events
    """
    server = None if no_serve else require_tool("tensorboard")  # before any download
    uri = target.require_checkpoint_uri()
    dest = dest or Path(".tensorboard") / (target.job_name or uri.rsplit("/", 1)[-1])
    count = fetch_events(s3_client(), uri, dest)
    click.echo(f"{count} event files -> {dest}")
    if server is None:
        return 0
    command = [server, "--logdir", str(dest), "--port", str(port)]
    click.echo(f"# {' '.join(command)}", err=True)
    return subprocess.run(command, check=False).returncode
