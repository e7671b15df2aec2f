"""Reduce an upstream CustomResourceDefinition to the machine facts the tests validate against.

    python scripts/tooling/crd_schema.py UPSTREAM.yaml > tests/schemas/<name>.<version>.yaml
    curl -s URL | python scripts/tooling/crd_schema.py - > ...

Keeps apiVersion/kind, metadata.name, spec.group/names/scope and, per version, name, served,
storage, subresources and schema.openAPIV3Schema; every `description` prose string is dropped so
that no upstream documentation text is copied into this repository (tests/schemas/SOURCES.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

_VERSION_KEYS = ("name", "served", "storage", "subresources")


def without_descriptions(node: Any) -> Any:
    """`node` with every `description: <string>` removed at any depth.

    Only string values are prose: a schema property that happens to be named `description`
    (a mapping under `properties`) is part of the schema and stays.
    """
    if isinstance(node, dict):
        return {
            key: without_descriptions(value)
            for key, value in node.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def machine_facts(crd: dict[str, Any]) -> dict[str, Any]:
    """The reduced CRD; raises ValueError when `crd` is not a CustomResourceDefinition."""
    if crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"kind is {crd.get('kind')!r}, not CustomResourceDefinition")
    spec = crd["spec"]
    versions = []
    for version in spec["versions"]:
        reduced = {key: version[key] for key in _VERSION_KEYS if key in version}
        schema = version.get("schema", {}).get("openAPIV3Schema")
        if schema is not None:
            reduced["schema"] = {"openAPIV3Schema": without_descriptions(schema)}
        versions.append(reduced)
    return {
        "apiVersion": crd["apiVersion"],
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd["metadata"]["name"]},
        "spec": {
            "group": spec["group"],
            "names": spec["names"],
            "scope": spec["scope"],
            "versions": versions,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="upstream CRD YAML file, or - for stdin")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.source == "-" else Path(args.source).read_text()
    try:
        reduced = machine_facts(yaml.safe_load(text))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"crd_schema: {args.source} is not a CRD: {error}", file=sys.stderr)
        return 1
    out = yaml.safe_dump(reduced, sort_keys=False, width=100)
    if args.output:
        args.output.write_text(out)
    else:
        sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
