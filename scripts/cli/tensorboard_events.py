"""The run's TensorBoard event files on this machine, served by TensorBoard.

    python scripts/cli/tensorboard_events.py --stack llama31-8b-p5            # fetch, then serve
    python scripts/cli/tensorboard_events.py --stack llama31-8b-p5 --no-serve # fetch only

The trainer writes its events under `<run directory>/tensorboard` (infra/job/flags.py), which
is in the stack's bucket (directly without FSx, through the file system's export with it):
this copies that folder with parallel downloads (`scripts.cli.s3_download`) to `--dest` and runs
`tensorboard --logdir` on it. Run it again to pick up newer events.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cli.checkpoints import s3_client
from scripts.cli.run_target import TargetError, add_target_arguments, resolve, split_s3_uri
from scripts.cli.s3_download import download_prefix, list_objects

EVENTS_DIR = "tensorboard"


def fetch_events(client: object, uri: str, dest: Path) -> int:
    """Copy the run's event files to `dest`; returns how many."""
    bucket, prefix = split_s3_uri(uri)
    base = f"{prefix}/{EVENTS_DIR}/" if prefix else f"{EVENTS_DIR}/"
    items = list_objects(client, bucket, base)
    if not items:
        raise TargetError(f"no TensorBoard event files under s3://{bucket}/{base} yet")
    lock = threading.Lock()
    with click.progressbar(
        length=sum(int(item.get("Size", 0)) for item in items), label="events", file=sys.stderr
    ) as bar:

        def landed(size: int) -> None:
            with lock:
                bar.update(size)

        return len(download_prefix(client, bucket, base, dest, progress=landed, items=items))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_target_arguments(parser)
    parser.add_argument("--dest", type=Path, help="local folder (default: .tensorboard/<run>)")
    parser.add_argument("--no-serve", action="store_true", help="fetch the files and exit")
    parser.add_argument("--port", type=int, default=6006, help="TensorBoard's port")
    options = parser.parse_args(argv)
    if not options.no_serve and shutil.which("tensorboard") is None:
        raise FileNotFoundError(2, "not found", "tensorboard")  # before any download
    try:
        target = resolve(options)
        uri = target.require_checkpoint_uri()
        dest = options.dest or Path(".tensorboard") / (target.job_name or uri.rsplit("/", 1)[-1])
        count = fetch_events(s3_client(), uri, dest)
    except TargetError as error:
        print(f"tensorboard: {error}", file=sys.stderr)
        return 2
    print(f"{count} event files -> {dest}")
    if options.no_serve:
        return 0
    command = ["tensorboard", "--logdir", str(dest), "--port", str(options.port)]
    print(f"# {' '.join(command)}", file=sys.stderr)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
