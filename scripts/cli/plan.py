"""`fsdp-eks plan`: what `pulumi up` would create, fit, take and cost, without AWS or Pulumi.

Evaluates the real program (`infra.program.main`) under Pulumi's mock runtime (`infra.offline`)
and prints placement, memory fit, duration, cost, warnings and the guardrails' verdict; secrets
never printed. Exit status: 0 planned; 1 a guardrail refuses it; 2 the stack is invalid.
Usage and detail: docs/design/cli.md#plan
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from scripts.cli.support import plan_cache
from scripts.cli.support.plan_cache import CachedPlan
from scripts.cli.support.stacks import stack_arguments

if TYPE_CHECKING:
    from infra.config import StackConfig, StackFile
    from infra.estimates.run_plan import RunPlan
    from infra.offline import Evaluation, RecordedResource
    from infra.policy.offline import Violation

REPO_ROOT = Path(__file__).resolve().parents[2]
EVALUATED_LINE = re.compile(r"^(Resources \(\d+\), evaluated offline in [\d.]+s):$", re.MULTILINE)
"""`render`'s timing line of a verbose plan."""

PYTORCHJOB_TYPE = "kubernetes:kubeflow.org/v1:PyTorchJob"
TRAINJOB_TYPES = (
    "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime",
    "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob",
)
"""What a stack with `job.api: trainjob` submits instead (infra.launch.training_job)."""

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
    from infra.offline import evaluate
    from infra.program import main as program

    return evaluate(
        program,
        config=stack.config,
        secret_keys=stack.secret_keys,
        stack=stack.stack_name,
    )


def plan_stack(name: str | Path) -> Plan:
    """Validate and evaluate one stack (raises StackConfigError for a bad one)."""
    from infra.config.files import display_path, read_stack_file
    from infra.job.stack_checks import checked_run_plan
    from infra.policy.offline import run_policies
    from infra.policy.settings import policy_config_for

    stack = read_stack_file(name)
    run = checked_run_plan(
        stack.config,
        stack_name=stack.stack_name,
        secret_keys=stack.secret_keys,
        source=display_path(stack.path),
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
    text = value if isinstance(value, str) else _yaml(value, flow=True)
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
    submitted = (
        "; submitted as a TrainJob (Kubeflow Trainer v2)" if config.job.api == "trainjob" else ""
    )
    return f"Where:  {where}; cluster mode {config.cluster.mode}{submitted}"


def saves_line(plan: RunPlan) -> str:
    """Where the checkpoints go, how often, and what one save costs."""
    from infra.estimates.duration import async_saves
    from infra.job.flags import run_paths

    config = plan.config
    paths = run_paths(plan)
    where = (
        f"FSx ({paths.run_dir})"
        if not paths.in_s3
        else f"S3 ({paths.run_dir.replace('$(CHECKPOINT_BUCKET)', '<bucket>')}; no FSx)"
    )
    every = config.training.checkpoint_every
    when = f"every {every} steps and at the end" if every else "at the end"
    background = async_saves(config)
    return f"Saves:  {where}, {when}, ~{plan.timeouts.checkpoint_seconds:.0f} s of writing each" + (
        " (in the background)" if background else ""
    )


def precision_text(config: StackConfig) -> str:
    """The matmul precision, as the run will use it."""
    training = config.training
    if training.precision == "fp8":
        return (
            f"fp8 {training.fp8_recipe or 'rowwise'} matmuls (torchao; the LM head and small "
            "layers in bf16)"
        )
    return "bf16 matmuls" if training.bf16 else "fp32 matmuls"


def summary_lines(plan: RunPlan, evaluation: Evaluation | None = None) -> list[str]:
    from infra.job.grafana import grafana_plan
    from infra.platform.gpu_lease import lease_line
    from trainer.presets import approx_num_parameters

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
        f"{chosen.activation_checkpointing} activation checkpointing ({chosen.reason}), "
        f"{precision_text(config)}",
        f"Batch:  {training.micro_batch_size} per GPU x {config.world_size} GPUs x "
        f"{config.gradient_accumulation_steps} accumulation = {config.global_batch_size} "
        f"sequences ({config.tokens_per_step:,} tokens) per step, {training.max_steps} steps",
        f"Memory: {'fits' if fit.fits else 'DOES NOT FIT'}, {fit.summary()}",
        saves_line(plan),
        *labelled(
            "Time:",
            [
                f"{plan.duration.headline()}; deadline "
                + (f"{config.job.max_run_hours:g} h" if config.job.max_run_hours else "none"),
                f"= {plan.duration.arithmetic()}",
            ],
        ),
        *labelled("Cost:", plan.cost.summary_lines()),
        *labelled("Standing:", plan.standing.summary_lines()),
        *labelled("Metrics:", [plan.metrics.summary()]),
        *labelled("Grafana:", [grafana_plan(plan).summary()]),
        *(labelled("Queue:", queue) if (queue := queue_lines(config)) else []),
    ]


def queue_lines(config: StackConfig) -> list[str]:
    """Where a queued run waits for admission, and what its Kueue integration's status is."""
    from infra.job.queueing import plan_lines

    return plan_lines(config.scheduling, cluster_mode=config.cluster.mode, job_api=config.job.api)


LINE_WIDTH = 100
"""Where a figure of several lines wraps (its parts are split first, then long ones wrapped)."""


def labelled(label: str, lines: list[str]) -> list[str]:
    """A figure of several lines: the label on the first, the rest aligned under its text,
    each wrapped at a comma or a space to stay readable in a terminal or a PR comment."""
    width = max(len(label) + 1, 8)
    wrapped = [
        part
        for line in lines
        for part in textwrap.wrap(
            line, LINE_WIDTH - width, subsequent_indent="  ", break_on_hyphens=False
        )
    ]
    return [f"{label:<{width}}{wrapped[0]}", *(" " * width + line for line in wrapped[1:])]


def render(plan: Plan, *, verbose: bool = False) -> str:
    """The summary and the guardrails; with `verbose`, the resources, outputs and the job."""
    from infra.config.files import display_path
    from infra.job.job_api import job_api

    evaluation = plan.evaluation
    warnings = [*plan.stack.warnings, *plan.run.warnings, *evaluation.warnings]
    lines = [
        f"Stack {plan.stack.stack_name} ({display_path(plan.stack.path)})",
        *(f"  {line}" for line in summary_lines(plan.run, plan.evaluation)),
        *(f"  Warning: {warning}" for warning in warnings),
        "",
        "Guardrails:",
        *([f"  {violation}" for violation in plan.violations] or ["  all passed"]),
    ]
    if not verbose:
        lines += [
            "",
            f"({len(evaluation.resources)} resources; `--verbose` lists them, the outputs and "
            f"the {job_api(plan.run.config.job.api).kind})",
        ]
        return "\n".join(label_placeholders(line) for line in lines)
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
        if key == "dashboard":  # Grafana JSON: a file to import, not lines to read here
            lines.append(
                f"  {key}: Grafana JSON ({len(str(value)):,} characters; "
                "`fsdp-eks dashboard` writes it)"
            )
            continue
        if isinstance(value, dict):
            lines.append(f"  {key}:")
            lines.extend(f"    {k}: {v}" for k, v in value.items())
        else:
            lines.append(f"  {key}: {value}")
    jobs = [job for kind in (PYTORCHJOB_TYPE, *TRAINJOB_TYPES) for job in evaluation.of_type(kind)]
    for job in jobs:
        manifest = whole_numbers(
            {key: job.inputs.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
        )
        # Sorted keys, as `kubectl get -o yaml` shows objects.
        lines += ["", f"{job.type.rsplit(':', 1)[-1]}:", "---", _yaml(manifest)]
    return "\n".join(label_placeholders(line) for line in "\n".join(lines).splitlines())


PLAIN_SETTING = re.compile(r"^\s*(- )?[\w./-]+: [^\s#]+$")
"""A `key: value` line whose value is one plain YAML scalar: a comment may follow it."""


def label_placeholders(line: str) -> str:
    """The mock runtime's account, caller and image digests said to be stand-ins, so that no
    one copies them: the principal in prose, a YAML comment after a setting that holds one."""
    from infra.offline.outputs import ACCOUNT_ID, DEPLOYER_ARN

    if DEPLOYER_ARN in line and not PLAIN_SETTING.match(line):
        return line.replace(
            DEPLOYER_ARN,
            f"{DEPLOYER_ARN}, an offline placeholder for whoever runs `pulumi up`",
        )
    held = [
        what
        for what, present in (
            (f"account {ACCOUNT_ID}", ACCOUNT_ID in line),
            ("image digest", "@sha256:" in line),
        )
        if present
    ]
    if held and PLAIN_SETTING.match(line):
        return f"{line}  # offline placeholder{'s' if len(held) > 1 else ''}: {', '.join(held)}"
    return line


def _yaml(value: Any, *, flow: bool = False) -> str:
    import yaml

    if flow:
        return str(yaml.safe_dump(value, default_flow_style=True))
    # Sorted keys, as `kubectl get -o yaml` shows objects.
    return str(yaml.safe_dump(value, sort_keys=True)).rstrip()


def time_stack(name: str, repeats: int) -> list[float]:
    """Seconds per full plan (read, validate, evaluate) of one stack, `repeats` times."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan_stack(name)
        samples.append(time.perf_counter() - start)
    return samples


def plan_output(name: str, *, verbose: bool) -> CachedPlan:
    """What planning one stack prints, and its exit status."""
    from infra.config import StackConfigError

    try:
        planned = plan_stack(name)
    except StackConfigError as error:  # the same line `fsdp-eks local` and `pulumi up` give
        return CachedPlan("", f"fsdp-eks plan: {error}\n", 2)  # 2: a mistake; 1: refused
    return CachedPlan(render(planned, verbose=verbose) + "\n\n", "", 1 if planned.violations else 0)


def cached_plan_output(name: str, *, verbose: bool, use_cache: bool) -> CachedPlan:
    """`plan_output`, from the plan cache when nothing it follows from has changed."""
    from infra.config.files import display_path
    from infra.config.names import stack_file_path

    if not use_cache or plan_cache.cache_dir() is None:
        return plan_output(name, verbose=verbose)
    path = stack_file_path(name)
    try:
        key = plan_cache.plan_key(path, display_path(path), verbose=verbose)
    except OSError:  # the file cannot be read: the plan says so in its one line
        return plan_output(name, verbose=verbose)
    kept = plan_cache.load(key)
    if kept is not None:
        return replayed(kept)
    output = plan_output(name, verbose=verbose)
    plan_cache.store(key, output)
    return output


def replayed(kept: CachedPlan) -> CachedPlan:
    """A kept plan as shown again: its one timing line (with `--verbose`) says when and that the
    evaluation was not this one."""
    if kept.evaluated_at is None:
        return kept
    when = kept.evaluated_at.strftime("%Y-%m-%d %H:%M UTC")
    stdout = EVALUATED_LINE.sub(rf"\1 at {when}, shown from the plan cache:", kept.stdout, count=1)
    return dataclasses.replace(kept, stdout=stdout)


@click.command()
@stack_arguments(many=True, all_flag=True)
@click.option("-v", "--verbose", is_flag=True, help="Also every resource, the outputs and the job.")
@click.option("--time", "timed", is_flag=True, help="Time the plan of each stack instead.")
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True,
              help="Evaluations per stack with --time.")  # fmt: skip
@click.option("--no-cache", is_flag=True,
              help="Evaluate even when nothing the plan reads has changed.")  # fmt: skip
def plan(stacks: list[str], verbose: bool, timed: bool, repeats: int, no_cache: bool) -> int:
    """What `pulumi up` would create, fit, take and cost: offline, no AWS, no Pulumi CLI.

    \b
        fsdp-eks plan dev                # a stack under stacks/ (or a stack file)
        fsdp-eks plan dev llama31-8b-p5  # several
        fsdp-eks plan --all              # every stack
        fsdp-eks plan -v dev             # + every resource, the outputs, the PyTorchJob

    The real program runs under Pulumi's mock runtime with AWS-shaped answers in the stack's
    region: what runs where, whether it fits the GPUs' memory, how long it takes, what it
    costs, the program's warnings and the guardrails' verdict (the policy pack's checks).
    A plan is kept (~/.cache/fsdp-eks) and shown again while nothing it follows from has
    changed: the stack file, the program's sources, the installed packages.
    Exit status: 0 planned, 1 a guardrail refuses it, 2 the stack is invalid.
    """
    if timed:
        return time_stacks(stacks, repeats)
    status = 0
    for name in stacks:
        output = cached_plan_output(name, verbose=verbose, use_cache=not no_cache)
        click.echo(output.stdout, nl=False)
        click.echo(output.stderr, nl=False, err=True)
        if output.status == 2 or (output.status == 1 and status == 0):
            status = output.status
    return status


def time_stacks(stacks: list[str], repeats: int) -> int:
    """A table of how long each stack's plan takes, evaluated every time (no cache)."""
    from infra.config import StackConfigError

    status = 0
    click.echo("| stack | resources | median s | max s |")
    click.echo("|---|---|---|---|")
    for name in stacks:
        try:
            samples = time_stack(name, repeats)
            count = len(plan_stack(name).evaluation.resources)
        except StackConfigError as error:
            click.echo(f"fsdp-eks plan: {error}", err=True)
            status = 2
            continue
        click.echo(f"| {name} | {count} | {statistics.median(samples):.2f} | {max(samples):.2f} |")
    return status
