"""scripts/tooling/crd_schema.py: upstream CRDs reduced to their machine facts, no prose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scripts.tooling.crd_schema import machine_facts
from tests import crd_schemas
from tests.crd_schemas import openapi_schema

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "scripts" / "tooling" / "crd_schema.py"
SCHEMAS = ROOT / "tests" / "schemas"

UPSTREAM: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "widgets.example.com",
        "annotations": {"controller-gen.kubebuilder.io/version": "v0.18.0"},
    },
    "spec": {
        "group": "example.com",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "additionalPrinterColumns": [{"name": "Age", "type": "date"}],
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "description": "Widget is the upstream's prose.",
                        "type": "object",
                        "properties": {
                            "spec": {
                                "description": "More prose.",
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "description": "Prose."},
                                    # A field named description is schema, not prose.
                                    "description": {"type": "string"},
                                    "parts": {
                                        "type": "array",
                                        "items": {"description": "Deep prose.", "type": "string"},
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _strings_under_description(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == "description" and isinstance(v, str)]
        return found + [s for v in node.values() for s in _strings_under_description(v)]
    if isinstance(node, list):
        return [s for item in node for s in _strings_under_description(item)]
    return []


def test_prose_and_presentation_go_and_the_schema_stays() -> None:
    reduced = machine_facts(UPSTREAM)
    assert _strings_under_description(reduced) == []
    assert "annotations" not in reduced["metadata"]
    (version,) = reduced["spec"]["versions"]
    assert "additionalPrinterColumns" not in version
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["size"]
    assert spec["properties"]["description"] == {"type": "string"}
    assert spec["properties"]["parts"]["items"] == {"type": "string"}
    assert reduced["spec"]["names"]["kind"] == "Widget"


def test_the_command_reads_stdin_and_refuses_what_is_not_a_crd() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "-"],
        input=yaml.safe_dump(UPSTREAM),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == machine_facts(UPSTREAM)
    refused = subprocess.run(
        [sys.executable, str(TOOL), "-"],
        input="kind: ConfigMap\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "crd_schema: - is not a CRD: kind is 'ConfigMap', not CustomResourceDefinition"
    ]


def test_every_stored_schema_is_reduced_and_has_its_source_listed() -> None:
    sources = (SCHEMAS / "SOURCES.md").read_text()
    stored = sorted(SCHEMAS.glob("*.yaml"))
    assert stored
    for path in stored:
        crd = yaml.safe_load(path.read_text())
        assert machine_facts(crd) == crd, f"{path.name} is not the tool's output"
        assert f"| {path.name} |" in sources


def test_a_missing_schema_fails_the_test_that_needs_it() -> None:
    """The schemas ship with the repository: a missing one is a failure, never a skip."""
    with pytest.raises(AssertionError, match=r"nothing\.v0\.yaml is in none of"):
        openapi_schema("nothing.v0.yaml", "v1")


def test_validate_checks_a_schema_once_and_raises_what_jsonschema_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = {
        "type": "object",
        "properties": {"replicas": {"type": "integer", "minimum": 1}},
        "additionalProperties": False,
    }
    checks: list[object] = []
    real_check = jsonschema.Draft202012Validator.check_schema

    def counting_check(cls: Any, checked: Any, *args: Any, **kwargs: Any) -> None:
        checks.append(checked)
        real_check(checked, *args, **kwargs)

    monkeypatch.setattr(
        jsonschema.Draft202012Validator, "check_schema", classmethod(counting_check)
    )
    for bad in ({"replicas": 0}, {"replicas": 2, "extra": 1}):
        with pytest.raises(jsonschema.ValidationError) as ours:
            crd_schemas.validate(bad, schema)
        with pytest.raises(jsonschema.ValidationError) as theirs:
            jsonschema.validate(bad, schema)
        assert ours.value.message == theirs.value.message
    crd_schemas.validate({"replicas": 2}, schema)
    assert sum(1 for checked in checks if checked is schema) == 1 + 2  # ours once, theirs twice
