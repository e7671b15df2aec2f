"""Guardrails for every stack: a Pulumi policy pack (CrossGuard) and the same checks offline.

    pulumi preview --policy-pack infra/policy   # reads the stack's own config (settings.py)
    infra.policy.offline.run_policies(evaluation, config) -> list[Violation]

The check functions live in `kube_checks`, `aws_checks` and `cost_checks`, the list of
guardrails in `registry`; `pack` adapts them to pulumi_policy and `offline` to an
`infra.offline.Evaluation`.
"""
