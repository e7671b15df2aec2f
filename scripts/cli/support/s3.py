"""The run's files in S3: URIs, a client, one object or everything under a prefix.

A checkpoint is hundreds of shard files and a TensorBoard run dozens of event files: one
`download_file` after the other leaves the link idle between objects. boto3's clients are
thread-safe, and each `download_file` is already a multipart transfer (s3transfer), so a small
pool of workers keeps several objects in flight; `progress` hears about every finished file.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from scripts.cli.support.errors import CliError

PARALLEL_OBJECTS = 8
"""Objects in flight at once: s3transfer's own default concurrency per transfer is 10 threads,
so 8 objects saturate a laptop's or a node's link without thousands of threads."""


def list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under `prefix` (a folder: ends with '/'), with its key and size."""
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        items.extend(page.get("Contents", []))
    return items


def download_prefix(
    client: Any,
    bucket: str,
    prefix: str,
    dest: Path,
    *,
    progress: Callable[[int], None] | None = None,
    items: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Copy the objects under `prefix` into `dest`, keeping their layout below the prefix.

    A key that would leave `dest` (`..`) is skipped; `progress(bytes)` is called as each file
    lands. Returns the local paths written."""
    objects = items if items is not None else list_objects(client, bucket, prefix)
    jobs: list[tuple[str, Path, int]] = []
    for item in objects:
        relative = PurePosixPath(item["Key"][len(prefix) :])
        if not relative.parts or ".." in relative.parts:
            continue
        jobs.append((item["Key"], dest.joinpath(*relative.parts), int(item.get("Size", 0))))

    def fetch(job: tuple[str, Path, int]) -> Path:
        key, path, size = job
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(path))
        if progress is not None:
            progress(size)
        return path

    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS) as pool:
        return list(pool.map(fetch, jobs))


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/a/b -> ("bucket", "a/b") (no trailing slash)."""
    if not uri.startswith("s3://"):
        raise CliError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise CliError(f"{uri!r} names no bucket")
    return bucket, prefix.strip("/")


def s3_client() -> Any:
    """A boto3 S3 client; AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 point it elsewhere (tests)."""
    import boto3

    # A session of its own: boto3's default session keeps the first credentials it resolved
    # for the life of the process, whatever the environment says later.
    return boto3.session.Session().client("s3")


def fetch_object(uri: str, directory: Path) -> Path:
    """Download one S3 object into `directory`; its local path."""
    bucket, key = split_s3_uri(uri)
    local = directory / Path(key).name
    s3_client().download_file(bucket, key, str(local))
    return local
