"""Where the tests find an upstream CRD: $FSDP_EKS_SCHEMAS when set, then ../shared/schemas/
(reference data beside the repository), then tests/schemas/ (reduced by
scripts/tooling/crd_schema.py, sources in tests/schemas/SOURCES.md)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
SEARCH_PATH = (REPO_ROOT.parent / "shared" / "schemas", REPO_ROOT / "tests" / "schemas")


def crd_path(file_name: str) -> Path | None:
    """The first folder's copy of `file_name`, or None when no folder holds it."""
    override = os.environ.get("FSDP_EKS_SCHEMAS")
    folders = (Path(override), *SEARCH_PATH) if override else SEARCH_PATH
    for folder in folders:
        if (folder / file_name).is_file():
            return folder / file_name
    return None


@functools.cache
def openapi_schema(file_name: str, version: str) -> dict[str, Any]:
    """`version`'s openAPIV3Schema of the CRD `file_name`. A missing file fails the test: the
    schemas ship in tests/schemas/ (or beside the repository), so a skip would only hide it.
    Read once per worker; tests only read it."""
    path = crd_path(file_name)
    assert path is not None, f"{file_name} is in none of {SEARCH_PATH}"
    crd = yaml.safe_load(path.read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(found["schema"]["openAPIV3Schema"])


_checked: dict[int, tuple[dict[str, Any], Any]] = {}


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """`jsonschema.validate`, with the schema itself checked against its metaschema once per
    schema rather than at every call: that check took 70 s of the infra tests (a CRD's schema
    is hundreds of KB). The error raised is the same (`best_match`)."""
    kept = _checked.get(id(schema))
    if kept is None or kept[0] is not schema:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        kept = (schema, cls(schema))  # the schema is held, so its id is not reused
        _checked[id(schema)] = kept
    error = jsonschema.exceptions.best_match(kept[1].iter_errors(instance))
    if error is not None:
        raise error
