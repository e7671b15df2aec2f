"""Raw stack-config values, as the engine or a stack file holds them, into a `StackConfig`.

One parser for every source: the Pulumi program (the engine's config map), the offline plan,
the local run and the tests (a stack file). It refuses, before anything else runs, what the
schema refuses: unknown or misplaced keys, wrong types, a token in plaintext, rules between
sections, AZs outside the provider's region.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from infra.config.errors import (
    StackConfigError,
    _sections_with,
    allowed_keys,
    format_validation_error,
)
from infra.config.stack import HF_TOKEN_KEY, PROJECT, StackConfig, cross_section_problems
from infra.facts.regions import REGIONS


def config_keys() -> list[str]:
    """The keys a stack may set in the `fsdp-eks:` namespace."""
    return allowed_keys(StackConfig)


def _unqualified(key: str) -> str | None:
    """`fsdp-eks:gpuNodes` or `gpuNodes` → `gpuNodes`; another namespace → None."""
    namespace, sep, name = key.rpartition(":")
    if not sep:
        return key
    return name if namespace == PROJECT else None


PROVIDER_NAMESPACES = frozenset({"aws", "kubernetes", "eks", "pulumi"})
"""Namespaces something else reads: the providers this program uses (pyproject.toml: pulumi-aws,
pulumi-kubernetes, pulumi-eks read `<package>:<key>`) and the engine's own (`pulumi:tags`)."""


def _looks_like_project(namespace: str, name: str) -> bool:
    """`fsdp_eks`, `fsdp-EKS`, `fsdpeks`: a misspelt project namespace, not a provider's; and
    any namespace no provider reads holding one of this project's section names (`fsdp:training`
    is too far from `fsdp-eks` to look misspelt, yet nothing would read it)."""
    folded = re.sub(r"[^a-z0-9]", "", namespace.lower())
    if name in config_keys() and namespace not in PROVIDER_NAMESPACES:
        return True
    return folded == re.sub(r"[^a-z0-9]", "", PROJECT) or bool(
        difflib.get_close_matches(namespace, [PROJECT], n=1, cutoff=0.75)
    )


def dns_name(stack_name: str) -> str:
    """A stack name as a DNS-1035 label (what the training operator accepts as a job name),
    for the default job name: a name that starts with a digit gets a `job-` prefix."""
    name = re.sub(r"[^a-z0-9-]+", "-", stack_name.lower()).strip("-")
    if name[:1].isdigit():
        name = f"job-{name}"
    return name[:48].rstrip("-") or "training"


@dataclass(frozen=True)
class ValidatedStack:
    """A stack file's config as the schema reads it, and what breaks the rules between its
    sections (or names an AZ outside the provider's region)."""

    config: StackConfig
    problems: tuple[str, ...]


def parse_stack_config(
    values: Mapping[str, Any],
    *,
    stack_name: str,
    secret_keys: Collection[str] = (),
    source: str | None = None,
) -> StackConfig:
    """Validate raw stack-config values (`[fsdp-eks:]key` → value) into a StackConfig.

    Values may be Python objects or JSON text (as the engine passes them). `secret_keys` are
    the keys that were Pulumi secrets. Raises StackConfigError listing every problem.
    """
    validated = validate_stack_config(
        values, stack_name=stack_name, secret_keys=secret_keys, source=source
    )
    if validated.problems:
        raise StackConfigError(list(validated.problems), source=source or f"stack {stack_name!r}")
    return validated.config


def validate_stack_config(
    values: Mapping[str, Any],
    *,
    stack_name: str,
    secret_keys: Collection[str] = (),
    source: str | None = None,
) -> ValidatedStack:
    """`parse_stack_config` without raising for the rules between sections: they come back
    with the config, so that a caller that checks the run too (`infra.job.stack_checks`
    `checked_run_plan`) lists every problem of the stack at once. Raises StackConfigError only
    when no config can be built (unknown keys, wrong types, a plaintext token)."""
    where = source or f"stack {stack_name!r}"
    problems: list[str] = []
    sections: dict[str, Any] = {}
    allowed = config_keys()
    secret_names = {_unqualified(key) for key in secret_keys}
    for key, raw in values.items():
        name = _unqualified(key)
        if name is None:
            namespace, _, section = key.rpartition(":")
            if _looks_like_project(namespace, section):
                problems.append(
                    f"{key} is in namespace {namespace!r}, which the program does not read (it "
                    f"reads {PROJECT}:<key> only): the setting would be silently ignored; "
                    f"allowed: {PROJECT}:{key.rpartition(':')[2]}"
                )
            continue  # provider config such as aws:region belongs to its provider
        if name not in allowed:
            hint = difflib.get_close_matches(name, allowed, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            if homes := _sections_with(name):
                suggestion = f" (it is a key of a section: did you mean {' or '.join(homes)}?)"
            problems.append(
                f"{PROJECT}:{name} is not a stack config key{suggestion}; "
                f"allowed: {', '.join(allowed)}"
            )
            continue
        if name == HF_TOKEN_KEY:
            if raw not in (None, "") and name not in secret_names:
                problems.append(
                    f"{PROJECT}:{HF_TOKEN_KEY} is stored in plaintext; a token must be a "
                    f"Pulumi secret: `pulumi config set --secret {HF_TOKEN_KEY} hf_...` "
                    "(and rotate the exposed token)"
                )
                continue
            sections[name] = raw
            continue
        value = raw
        if isinstance(raw, str):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append(
                f"{PROJECT}:{name} must be a mapping of keys (e.g. {name}: {{...}}), got {value!r}"
            )
            continue
        sections[name] = value
    if problems:
        raise StackConfigError(problems, source=where)
    try:
        config = StackConfig.model_validate(sections)
    except ValidationError as err:
        raise StackConfigError(format_validation_error(err), source=where) from None
    filled: dict[str, Any] = {}
    if config.job.name is None:
        filled["name"] = dns_name(stack_name)
    if config.job.create_namespace is None:
        filled["create_namespace"] = config.cluster.mode == "create"
    if filled:
        config = config.model_copy(update={"job": config.job.model_copy(update=filled)})
    problems = cross_section_problems(config)
    problems.extend(region_problems(config, values.get("aws:region")))
    return ValidatedStack(config, tuple(problems))


def region_problems(config: StackConfig, region: Any) -> list[str]:
    """`aws:region` must be a region, and every AZ the stack names must be in it.

    Caught here, an AZ of another region is one line in the same list as every other
    mistake; left to the program, it surfaces from the first EC2 call of `pulumi up` as a
    provider error on a half-created stack.
    """
    if region is None:
        return []  # the AWS provider's own default (AWS_REGION, the profile) applies
    if not isinstance(region, str) or region not in REGIONS:
        hint = difflib.get_close_matches(str(region), sorted(REGIONS), n=1, cutoff=0.6)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        return [
            f"aws:region {region!r} is not an AWS region{suggestion}; allowed: "
            f"{', '.join(sorted(REGIONS))} (infra/facts/regions.py)"
        ]
    named = [
        ("gpuNodes.availabilityZone", config.gpu_nodes.availability_zone),
        *(
            (f"cluster.network.availabilityZones[{index}]", zone)
            for index, zone in enumerate(config.cluster.network.availability_zones or [])
        ),
    ]
    return [
        f"{key} {zone!r} is not in aws:region {region!r}; allowed: an AZ of {region} "
        f"({region}a, {region}b, ...), or set aws:region to the zone's region"
        for key, zone in named
        if zone is not None and not _in_region(zone, region)
    ]


def _in_region(zone: str, region: str) -> bool:
    """`us-west-2b` is in `us-west-2` (the config model accepts only region + letter names)."""
    return zone[:-1] == region
