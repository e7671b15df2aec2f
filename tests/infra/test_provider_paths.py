"""Deployed stacks hold each dynamic provider pickled at the module path it had when they were
last updated; the engine unpickles that blob for every later diff, update and delete
(pulumi `sdk/python/lib/pulumi/dynamic/__main__.py` `get_provider`: `dill.loads` of the
`__provider` property). dill pickles a class of an importable module by reference (module and
qualified name), so a provider that moved must stay importable at its old path.

The blobs below are what `pulumi.dynamic.dynamic.serialize_provider` produced for both
providers before they moved from `infra/image_build.py` and `infra/job_watch.py` (decoded,
they name those modules).
"""

from __future__ import annotations

import base64

import dill
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from infra.image.build import ImageBuildProvider
from infra.launch.start_watch import JobStartWatchProvider

PICKLED_AT_OLD_PATHS = {
    "infra.image_build": (
        "gASVLwAAAAAAAACMEWluZnJhLmltYWdlX2J1aWxklIwSSW1hZ2VCdWlsZFByb3ZpZGVylJOUKYGULg==",
        ImageBuildProvider,
    ),
    "infra.job_watch": (
        "gASVMAAAAAAAAACMD2luZnJhLmpvYl93YXRjaJSMFUpvYlN0YXJ0V2F0Y2hQcm92aWRlcpSTlCmBlC4=",
        JobStartWatchProvider,
    ),
}


@pytest.mark.parametrize("old_module", sorted(PICKLED_AT_OLD_PATHS))
def test_a_provider_pickled_at_its_old_path_unpickles(old_module: str) -> None:
    blob, provider_class = PICKLED_AT_OLD_PATHS[old_module]
    raw = base64.b64decode(blob)
    assert old_module.encode() in raw  # the blob really names the old module
    provider = dill.loads(raw)
    assert isinstance(provider, provider_class)


@pytest.mark.parametrize(
    ("provider_class", "module"),
    [
        (ImageBuildProvider, "infra.image.build"),
        (JobStartWatchProvider, "infra.launch.start_watch"),
    ],
)
def test_new_stacks_pickle_the_provider_at_its_own_path(provider_class: type, module: str) -> None:
    """A stack updated now holds the new path, so the shim is needed only by older state."""
    raw = base64.b64decode(serialize_provider(provider_class()))
    assert module.encode() in raw
    assert isinstance(dill.loads(raw), provider_class)
