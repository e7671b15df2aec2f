"""The guardrails without the Pulumi CLI: run them over an offline evaluation.

`scripts/cli/plan.py` (and tests) evaluate the real program under the mock runtime and call
`run_policies(evaluation, config)`; the same check functions back the policy pack, so a plan
that passes here passes `pulumi preview --policy-pack infra/policy` on the same resources.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.policy.registry import GUARDRAILS, Enforcement, Guardrail
from infra.policy.view import Resource

if TYPE_CHECKING:
    from infra.offline import Evaluation


@dataclass(frozen=True)
class Violation:
    """One broken guardrail: which, what to do, and where ("" urn: the whole stack)."""

    policy: str
    message: str
    urn: str = ""
    enforcement: Enforcement = "mandatory"

    def __str__(self) -> str:
        return f"[{self.enforcement}] {self.policy}: {self.message}"


def check_resources(
    resources: Iterable[Resource],
    config: Mapping[str, Mapping[str, Any]] | None = None,
    guardrails: Iterable[Guardrail] = GUARDRAILS,
) -> list[Violation]:
    """Every violation of `guardrails` among `resources`, resource checks first."""
    resources = list(resources)
    config = config or {}
    violations: list[Violation] = []
    stack_rails = []
    for guardrail in guardrails:
        if guardrail.resource_check is not None:
            violations.extend(
                Violation(guardrail.name, message, resource.urn, guardrail.enforcement)
                for resource in resources
                for message in guardrail.resource_check(resource)
            )
        if guardrail.stack_check is not None:
            stack_rails.append(guardrail)
    for guardrail in stack_rails:
        assert guardrail.stack_check is not None
        settings = config.get(guardrail.name, {})
        violations.extend(
            Violation(guardrail.name, finding.message, finding.urn, guardrail.enforcement)
            for finding in guardrail.stack_check(resources, settings)
        )
    return violations


def run_policies(
    evaluation: Evaluation, config: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Violation]:
    """Violations of the guardrails by an evaluated program.

    `config` has the shape of a policy-pack config file; build it with
    `infra.policy.settings.policy_config(...)` or `policy_config_from_stack_file(path)`.
    Without it the cost ceiling uses its defaults (CostConfig's default ceiling).
    """
    return check_resources((Resource.from_recorded(r) for r in evaluation.resources), config)


def check_stack_file(path: Path) -> list[Violation]:
    """Evaluate the real program for one stack file offline and run the guardrails over it.

    The stack's own `cost` section configures the ceiling. Raises the config model's
    StackConfigError for a stack file the program rejects before registering anything.
    """
    from infra.config import read_stack_file
    from infra.offline import evaluate
    from infra.policy.settings import policy_config_from_stack_file
    from infra.program import main as program

    stack_file = read_stack_file(path)
    evaluation = evaluate(
        program,
        config=stack_file.config,
        secret_keys=stack_file.secret_keys,
        stack=stack_file.stack_name,
    )
    return run_policies(evaluation, policy_config_from_stack_file(stack_file.path))
