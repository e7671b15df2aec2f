"""Offline plan: what `pulumi up -s STACK` would create, without the Pulumi CLI or AWS.

    python scripts/cli/plan.py dev                      # a stack name under stacks/
    python scripts/cli/plan.py stacks/Pulumi.dev.yaml   # or a stack file
    python scripts/cli/plan.py --verbose dev            # + every resource and the PyTorchJob
    python scripts/cli/plan.py --all                    # every stack (CI)
    python scripts/cli/plan.py --time dev               # how long one evaluation takes

Evaluates the real program (`infra.program.main`) under Pulumi's mock runtime with AWS-shaped
answers (`infra.offline`) and prints what a reviewer needs: what runs and where, whether it
fits the GPUs' memory, how long it takes, what it costs, and the guardrails' verdict (the same
checks as the policy pack in `infra/policy/`). `--verbose` adds the resources as a tree with
their key settings, the stack outputs and the PyTorchJob exactly as it would be applied.
Secrets in the stack file (`secure:`) are replaced by a placeholder and never printed. A stack
the config model rejects, or one that breaks a guardrail, prints its problems and exits with
status 1: what `pulumi up` would refuse, found first.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from infra.config import (  # noqa: E402
    StackConfig,
    StackConfigError,
    StackFile,
    read_stack_file,
)
from infra.estimates.run_plan import RunPlan  # noqa: E402
from infra.job.flags import run_paths  # noqa: E402
from infra.job.stack_checks import checked_run_plan  # noqa: E402
from infra.offline import Evaluation, RecordedResource, evaluate  # noqa: E402
from infra.platform.gpu_lease import lease_line  # noqa: E402
from infra.policy.offline import Violation, run_policies  # noqa: E402
from infra.policy.settings import policy_config_for  # noqa: E402
from infra.program import main as program  # noqa: E402
from trainer.presets import approx_num_parameters  # noqa: E402

PYTORCHJOB_TYPE = "kubernetes:kubeflow.org/v1:PyTorchJob"
STACKS_DIR = REPO_ROOT / "stacks"

# The settings worth a reviewer's eye, per input key (camelCase, as sent to the engine).
KEY_SETTINGS = (
    "name",
    "bucket",
    "cidrBlock",
    "availabilityZone",
    "version",
    "instanceType",
    "instanceTypes",
    "capacityType",
    "scalingConfig",
    "amiType",
    "chart",
    "namespace",
    "deploymentType",
    "storageCapacity",
    "perUnitStorageThroughput",
    "addonName",
    "addonVersion",
    "strategy",
    "retentionInDays",
)
HIDDEN_TYPES = ("kubernetes:core/v1:Secret",)
"""Shown in the tree, never with their inputs."""


@dataclass(frozen=True)
class Plan:
    stack: StackFile
    run: RunPlan
    evaluation: Evaluation
    seconds: float
    violations: list[Violation]


def evaluate_stack(stack: StackFile) -> Evaluation:
    return evaluate(
        program,
        config=stack.config,
        secret_keys=stack.secret_keys,
        stack=stack.stack_name,
    )


def plan_stack(name: str | Path) -> Plan:
    """Validate and evaluate one stack (raises StackConfigError for a bad one)."""
    stack = read_stack_file(name, STACKS_DIR)
    run = checked_run_plan(  # every problem of the stack at once
        stack.config,
        stack_name=stack.stack_name,
        secret_keys=stack.secret_keys,
        source=stack.path.name,
    )
    config = run.config
    start = time.perf_counter()
    evaluation = evaluate_stack(stack)
    seconds = time.perf_counter() - start
    violations = run_policies(evaluation, policy_config_for(config))
    return Plan(stack, run, evaluation, seconds, violations)


def whole_numbers(value: Any) -> Any:
    """The engine's wire format makes every number a float; show 8, not 8.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def _short(value: Any) -> str:
    value = whole_numbers(value)
    if isinstance(value, dict) and "name" in value and len(value) > 1:
        value = value["name"]  # Kubernetes metadata: the name says it
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True)
    text = " ".join(str(text).split())
    return text if len(text) <= 70 else text[:67] + "..."


def key_settings(resource: RecordedResource) -> str:
    if resource.type in HIDDEN_TYPES:
        return "(contents hidden)"
    inputs = resource.inputs
    shown = [f"{key}={_short(inputs[key])}" for key in KEY_SETTINGS if inputs.get(key)]
    metadata = inputs.get("metadata")
    if isinstance(metadata, dict) and metadata.get("name"):
        shown.insert(0, f"name={metadata['name']}")
    flags = [
        flag
        for flag, on in (
            ("retain", resource.retain_on_delete),
            ("delete-before-replace", resource.delete_before_replace),
        )
        if on
    ]
    return "  ".join(shown + ([f"[{', '.join(flags)}]"] if flags else []))


def resource_tree(evaluation: Evaluation) -> Iterator[str]:
    """`type name  settings` lines, children indented under their component."""
    children: dict[str, list[RecordedResource]] = {}
    known = {r.urn for r in evaluation.resources}
    for resource in evaluation.resources:
        parent = resource.parent if resource.parent in known else ""
        children.setdefault(parent, []).append(resource)

    def walk(parent: str, prefix: str) -> Iterator[str]:
        items = children.get(parent, [])
        for index, resource in enumerate(items):
            last = index == len(items) - 1
            branch = "└─ " if last else "├─ "
            settings = key_settings(resource)
            yield f"{prefix}{branch}{resource.type} {resource.name}" + (
                f"  {settings}" if settings else ""
            )
            yield from walk(resource.urn, prefix + ("   " if last else "│  "))

    yield from walk("", "")


GPU_SUBNET = ("aws:ec2/subnet:Subnet", "network-gpu")


def placement_line(config: StackConfig, evaluation: Evaluation | None = None) -> str:
    """Where the GPU nodes go, and why there."""
    nodes = config.gpu_nodes
    if nodes.availability_zone:
        where = f"{nodes.availability_zone} (gpuNodes.availabilityZone)"
    elif config.cluster.network.gpu_subnet_id:
        where = f"the AZ of subnet {config.cluster.network.gpu_subnet_id} (its own)"
    else:
        chosen = [
            r.inputs.get("availabilityZone")
            for r in (evaluation.of_type(GPU_SUBNET[0]) if evaluation else [])
            if r.name == GPU_SUBNET[1]
        ]
        where = (
            f"{chosen[0]}, the first AZ that offers {nodes.instance_type} (EC2 instance type "
            "offerings: the offline table here, the real look-up at preview; pin it with "
            "gpuNodes.availabilityZone)"
            if chosen
            else f"the first AZ that offers {nodes.instance_type} (looked up at preview)"
        )
    return f"Where:  {where}; cluster mode {config.cluster.mode}"


def saves_line(plan: RunPlan) -> str:
    """Where the checkpoints go, how often, and what one save costs."""
    config = plan.config
    paths = run_paths(plan)
    where = (
        f"FSx ({paths.run_dir})"
        if not paths.in_s3
        else f"S3 ({paths.run_dir.replace('$(CHECKPOINT_BUCKET)', '<bucket>')}; no FSx)"
    )
    every = config.training.checkpoint_every
    when = f"every {every} steps and at the end" if every else "at the end"
    background = str(config.training.extra_args.get("async_checkpoint", 1)) not in ("0", "False")
    return f"Saves:  {where}, {when}, ~{plan.timeouts.checkpoint_seconds:.0f} s of writing each" + (
        " (in the background)" if background else ""
    )


def summary_lines(plan: RunPlan, evaluation: Evaluation | None = None) -> list[str]:
    config = plan.config
    facts = config.instance
    shape = config.model_shape()
    params = approx_num_parameters(shape) / 1e9
    training = config.training
    nodes = config.gpu_nodes
    fit = plan.memory
    chosen = plan.parallelism
    assert plan.duration is not None and plan.cost is not None  # a checked plan has both
    return [
        f"Nodes:  {nodes.count} x {nodes.instance_type} ({facts.gpus} x {facts.gpu_model} "
        f"{facts.gpu_memory_gib} GB, {nodes.efa_interface_count} EFA) -> "
        f"{config.world_size} trainer processes",
        placement_line(config, evaluation),
        f"GPUs:   {lease_line(config)}",
        f"Model:  {config.model.preset} ({params:.2f}B parameters), context "
        f"{training.context_width}, {chosen.sharding_strategy} sharding, "
        f"{chosen.activation_checkpointing} activation checkpointing ({chosen.reason})",
        f"Batch:  {training.micro_batch_size} per GPU x {config.world_size} GPUs x "
        f"{config.gradient_accumulation_steps} accumulation = {config.global_batch_size} "
        f"sequences ({config.tokens_per_step:,} tokens) per step, {training.max_steps} steps",
        f"Memory: {'fits' if fit.fits else 'DOES NOT FIT'}, {fit.summary()}",
        saves_line(plan),
        f"Time:   {plan.duration.summary()}; deadline "
        + (f"{config.job.max_run_hours:g} h" if config.job.max_run_hours else "none"),
        f"Cost:   {plan.cost.summary()}",
        f"Standing: {plan.standing.summary()}",
    ]


def display_path(path: Path) -> str:
    """Repository files relative to the root (as reviewers know them), others as given."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def render(plan: Plan, *, verbose: bool = False) -> str:
    """The summary and the guardrails; with `verbose`, the resources, outputs and the job."""
    evaluation = plan.evaluation
    lines = [
        f"Stack {plan.stack.stack_name} ({display_path(plan.stack.path)})",
        *(f"  {line}" for line in summary_lines(plan.run, plan.evaluation)),
        *(f"  Warning: {warning}" for warning in [*plan.stack.warnings, *plan.run.warnings]),
        "",
        "Guardrails:",
        *([f"  {violation}" for violation in plan.violations] or ["  all passed"]),
    ]
    if not verbose:
        lines += [
            "",
            f"({len(evaluation.resources)} resources; `--verbose` lists them, the outputs and "
            "the PyTorchJob)",
        ]
        return "\n".join(lines)
    lines += [
        "",
        f"Resources ({len(evaluation.resources)}), evaluated offline in {plan.seconds:.2f}s:",
        *resource_tree(evaluation),
        "",
        "Outputs:",
    ]
    for key, value in evaluation.stack_outputs.items():
        if key == "cost":
            continue
        if isinstance(value, dict):
            lines.append(f"  {key}:")
            lines.extend(f"    {k}: {v}" for k, v in value.items())
        else:
            lines.append(f"  {key}: {value}")
    jobs = evaluation.of_type(PYTORCHJOB_TYPE)
    for job in jobs:
        manifest = whole_numbers(
            {key: job.inputs.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
        )
        # Sorted keys, as `kubectl get -o yaml` shows objects.
        lines += ["", "PyTorchJob:", "---", yaml.safe_dump(manifest, sort_keys=True).rstrip()]
    return "\n".join(lines)


def all_stacks() -> list[Path]:
    return sorted(STACKS_DIR.glob("Pulumi.*.yaml"))


def time_stack(name: str | Path, repeats: int) -> list[float]:
    """Seconds per full plan (read, validate, evaluate) of one stack, `repeats` times."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan_stack(name)
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stacks", nargs="*", help="stack names or stack files")
    parser.add_argument("--all", action="store_true", help="every stack under stacks/")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also the resource tree, the stack outputs and the PyTorchJob as applied",
    )
    parser.add_argument(
        "--time", action="store_true", help="time the plan of each stack instead of printing it"
    )
    parser.add_argument("--repeats", type=int, default=5, help="evaluations per stack with --time")
    args = parser.parse_args(argv)
    names: list[str | Path] = [*args.stacks, *(all_stacks() if args.all else [])]
    if not names:
        parser.error("name a stack (e.g. dev) or pass --all")

    status = 0
    if args.time:
        # The first evaluation in a process also imports the provider SDKs' submodules.
        start = time.perf_counter()
        with contextlib.suppress(StackConfigError):  # reported in the loop below
            plan_stack(names[0])
        print(f"first plan in this process (imports included): {time.perf_counter() - start:.2f} s")
        print()
        print("| stack | resources | median s | max s |")
        print("|---|---|---|---|")
    for name in names:
        try:
            if args.time:
                samples = time_stack(name, args.repeats)
                count = len(plan_stack(name).evaluation.resources)
                label = Path(name).name.removeprefix("Pulumi.").removesuffix(".yaml")
                print(
                    f"| {label} | {count} | {statistics.median(samples):.2f} | {max(samples):.2f} |"
                )
            else:
                plan = plan_stack(name)
                print(render(plan, verbose=args.verbose))
                print()
                if plan.violations:
                    status = 1
        except (StackConfigError, FileNotFoundError) as err:
            # A bad stack, or one that does not exist (the message lists the stacks there are).
            print(f"plan: {err}" if isinstance(err, FileNotFoundError) else err, file=sys.stderr)
            status = 2  # a user's mistake; 1 is a plan the guardrails refuse
    return status


if __name__ == "__main__":
    sys.exit(main())
