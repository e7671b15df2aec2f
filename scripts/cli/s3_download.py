"""Copy everything under an S3 prefix to a local directory, many objects at once.

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
