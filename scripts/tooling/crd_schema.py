"""Reduce an upstream CRD to the machine facts tests validate against.

    python -m scripts.tooling.crd_schema UPSTREAM_CRD.yaml VERSION OUT_DIR

Keeps the group, the names, and each served version's `openAPIV3Schema` with every
`description` removed, so no upstream prose is copied; the output keeps the upstream file
name with the pinned version before `.yaml` (`tests/schemas/SOURCES.md` lists each source).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def without_descriptions(node: Any) -> Any:
    """The schema with every `description` key dropped (a property named `description` is
    a key of `properties` whose value is a schema, so it stays)."""
    if isinstance(node, dict):
        kept = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            kept[key] = (
                {name: without_descriptions(schema) for name, schema in value.items()}
                if key == "properties" and isinstance(value, dict)
                else without_descriptions(value)
            )
        return kept
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def schema_facts(crd: dict[str, Any]) -> dict[str, Any]:
    spec = crd["spec"]
    return {
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "metadata": {"name": crd["metadata"]["name"]},
        "spec": {
            "group": spec["group"],
            "names": spec["names"],
            "scope": spec["scope"],
            "versions": [
                {
                    "name": version["name"],
                    "served": version["served"],
                    "storage": version["storage"],
                    "schema": {
                        "openAPIV3Schema": without_descriptions(
                            version["schema"]["openAPIV3Schema"]
                        )
                    },
                }
                for version in spec["versions"]
            ],
        },
    }


def output_name(upstream: Path, version: str) -> str:
    return f"{upstream.stem}.{version}{upstream.suffix}"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    upstream, version, out_dir = Path(argv[0]), argv[1], Path(argv[2])
    crd = yaml.safe_load(upstream.read_text())
    target = out_dir / output_name(upstream, version)
    target.write_text(yaml.safe_dump(schema_facts(crd), sort_keys=False))
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
