"""The guardrails as `pulumi_policy` policies (CrossGuard), for `--policy-pack infra/policy`."""

from __future__ import annotations

from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.policy.registry import GUARDRAILS, PACK_NAME, Guardrail, ResourceCheck, StackCheck
from infra.policy.settings import policy_config_from_engine
from infra.policy.view import Resource

_LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY}


def _resource_validation(check: ResourceCheck) -> Any:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(Resource.from_policy(args)):
            report_violation(message, None)

    return validate


def _stack_validation(guardrail: Guardrail, check: StackCheck) -> Any:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        settings = dict(args.get_config() or {})
        if guardrail.config_schema:
            # The stack's own config first (all that `--policy-pack infra/policy` alone gives
            # the pack), then whatever a `--policy-pack-config` file says, key by key.
            try:
                from_stack = policy_config_from_engine().get(guardrail.name, {})
            except ValueError as error:
                report_violation(f"cannot read the stack's config: {error}", None)
                return
            settings = {**from_stack, **settings}
        resources = [Resource.from_policy(r) for r in args.resources]
        for finding in check(resources, settings):
            report_violation(finding.message, finding.urn or None)

    return validate


def to_policy(guardrail: Guardrail) -> Policy:
    schema = (
        PolicyConfigSchema(properties=guardrail.config_schema) if guardrail.config_schema else None
    )
    level = _LEVELS[guardrail.enforcement]
    if guardrail.resource_check is not None:
        return ResourceValidationPolicy(
            name=guardrail.name,
            description=guardrail.description,
            validate=_resource_validation(guardrail.resource_check),
            enforcement_level=level,
            config_schema=schema,
        )
    assert guardrail.stack_check is not None, guardrail.name
    return StackValidationPolicy(
        name=guardrail.name,
        description=guardrail.description,
        validate=_stack_validation(guardrail, guardrail.stack_check),
        enforcement_level=level,
        config_schema=schema,
    )


def build_policies() -> list[Policy]:
    return [to_policy(g) for g in GUARDRAILS]


def serve() -> None:
    """Start the policy pack's analyzer server (blocks; the Pulumi CLI talks to it)."""
    PolicyPack(
        name=PACK_NAME,
        policies=build_policies(),
        enforcement_level=EnforcementLevel.MANDATORY,
    )
