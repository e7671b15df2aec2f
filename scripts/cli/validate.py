"""`fsdp-eks validate`: check a stack's GPU cluster before paying for a run: GPUs, EFA devices,
NCCL over EFA.

Three checks from the stack file: nodes Ready with the expected allocatable devices, an
nvidia-smi Job on every GPU node (devices, FSx mount, locked-memory limit), and an NCCL
all-reduce PyTorchJob (`NET/OFI` or the TCP fallback). Exit 0 when all pass, 1 otherwise.
Each check: docs/design/cli.md#validate
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from infra.job.job_api import PYTORCHJOB, TRAINJOB
from infra.job.placement import EFA_RESOURCE, GPU_RESOURCE, INSTANCE_TYPE_LABEL
from scripts.cli.support.errors import CliError
from scripts.cli.support.kube import to_yaml
from scripts.cli.support.stacks import name_of, stack_arguments
from scripts.cli.support.target import resolve_target

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.job.cluster_checks import ExpectedNodeResources
    from infra.job.kube_client import KubeClient

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINER_NAME = "pytorch"  # the training operator finds the container by this name
FIELD_MANAGER = "fsdp-eks-validate"

log = logging.getLogger("validate_cluster")

BENCH_SCRIPT = REPO_ROOT / "infra" / "job" / "payloads" / "nccl_allreduce.py"
CHECKS = ("nodes", "nvidia-smi", "nccl")


# -- results -----------------------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NodeResources:
    name: str
    ready: bool
    gpus: int
    efa: int


def _quantity(value: Any) -> int:
    """Extended resources are whole numbers; Kubernetes reports them as strings."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def parse_nodes(nodes_json: dict[str, Any]) -> list[NodeResources]:
    """`kubectl get nodes -o json` → each node's readiness and allocatable GPUs/EFA devices."""
    nodes = []
    for item in nodes_json.get("items", []):
        status = item.get("status", {})
        allocatable = status.get("allocatable", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", [])
        )
        nodes.append(
            NodeResources(
                name=item["metadata"]["name"],
                ready=ready,
                gpus=_quantity(allocatable.get(GPU_RESOURCE, 0)),
                efa=_quantity(allocatable.get(EFA_RESOURCE, 0)),
            )
        )
    return sorted(nodes, key=lambda node: node.name)


def check_nodes(nodes: Sequence[NodeResources], expected: ExpectedNodeResources) -> CheckResult:
    """Every expected node is Ready and advertises exactly the GPUs and EFA devices it has."""
    problems = []
    ready = [node for node in nodes if node.ready]
    if len(ready) < expected.node_count:
        problems.append(
            f"{len(ready)} Ready {expected.instance_type} node(s), expected {expected.node_count}"
            " (node group still scaling, capacity not granted, or nodes failing to join)"
        )
    for node in nodes:
        if not node.ready:
            problems.append(f"{node.name}: not Ready")
        if node.gpus != expected.gpus:
            hint = " (NVIDIA device plugin not running on it?)" if node.gpus == 0 else ""
            problems.append(
                f"{node.name}: allocatable {GPU_RESOURCE}={node.gpus}, expected {expected.gpus}"
                + hint
            )
        if node.efa != expected.efa:
            hint = " (EFA device plugin not running on it?)" if node.efa == 0 else ""
            problems.append(
                f"{node.name}: allocatable {EFA_RESOURCE}={node.efa}, expected {expected.efa}"
                + hint
            )
    detail = (
        f"{len(ready)}/{expected.node_count} {expected.instance_type} Ready; expected per node "
        f"{GPU_RESOURCE}={expected.gpus}, {EFA_RESOURCE}={expected.efa}"
    )
    return CheckResult("nodes", not problems, detail, problems)


@dataclass(frozen=True)
class GpuCheckReport:
    node: str
    gpus: list[str]
    efa_devices: int
    fsx: str | None = None
    """`writable <size> KiB`, `not writable`, or None when no claim was mounted."""
    memlock: str | None = None
    """A container's soft RLIMIT_MEMLOCK on the node: bytes, `unlimited`, or None (not
    reported)."""
    mem_total_kib: int | None = None
    """The node's memory (`MemTotal`), what the trainer's preflight holds the limit against."""

    def memlock_below_memory(self) -> bool:
        """Whether the limit binds EFA: below the node's memory (the preflight's rule,
        `trainer/preflight.py` `_check_memlock`); False when either figure is missing."""
        if self.memlock is None or not self.memlock.isdigit() or self.mem_total_kib is None:
            return False
        return int(self.memlock) < self.mem_total_kib * 1024

    def memlock_text(self) -> str:
        if self.memlock is None or not self.memlock.isdigit():
            return self.memlock or "not reported"
        return _bytes_text(int(self.memlock))


def _bytes_text(count: int) -> str:
    for unit, size in (
        ("EiB", 2**60),
        ("PiB", 2**50),
        ("TiB", 2**40),
        ("GiB", 2**30),
        ("MiB", 2**20),
    ):
        if count >= size:
            return f"{count / size:.4g} {unit}"
    return f"{count} B"


def parse_gpu_check_log(text: str) -> GpuCheckReport:
    """One gpu-check pod's log (`node:`, `gpu:`, `efa_devices:`, `memlock:`,
    `mem_total_kib:` and `fsx:` lines)."""
    node, gpus, efa, fsx = "?", [], 0, None
    memlock: str | None = None
    mem_total: int | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key == "node":
            node = value
        elif key == "gpu":
            gpus.append(value)
        elif key == "efa_devices" and value.isdigit():
            efa = int(value)
        elif key == "fsx":
            fsx = value
        elif key == "memlock" and value:
            memlock = value
        elif key == "mem_total_kib" and value.isdigit():
            mem_total = int(value)
    return GpuCheckReport(
        node=node, gpus=gpus, efa_devices=efa, fsx=fsx, memlock=memlock, mem_total_kib=mem_total
    )


def check_gpu_reports(
    reports: Sequence[GpuCheckReport], expected: ExpectedNodeResources, *, fsx: bool = False
) -> CheckResult:
    """All GPUs and EFA devices visible in every pod; with `fsx`, the claim writable too."""
    problems = []
    nodes = {report.node for report in reports}
    if len(nodes) < expected.node_count:
        problems.append(
            f"nvidia-smi ran on {len(nodes)} distinct node(s), expected {expected.node_count}"
        )
    for report in reports:
        if len(report.gpus) != expected.gpus:
            problems.append(
                f"{report.node}: nvidia-smi lists {len(report.gpus)} GPU(s), expected "
                f"{expected.gpus}"
            )
        if report.efa_devices != expected.efa:
            problems.append(
                f"{report.node}: {report.efa_devices} EFA device(s) in the pod, expected "
                f"{expected.efa}"
            )
        if fsx and not (report.fsx or "").startswith("writable"):
            problems.append(f"{report.node}: FSx claim {report.fsx or 'not mounted'}")
        if expected.efa and report.memlock_below_memory():
            # The trainer's preflight refuses such a node, after its image was pulled.
            problems.append(
                f"{report.node}: containers may lock {report.memlock_text()} of memory "
                "(RLIMIT_MEMLOCK), below the node's memory: EFA cannot register NCCL's buffers "
                "and the trainer's preflight refuses to start; raise it in the nodes' "
                "containerd base runtime spec (docs/validation.md, 'Locked memory for EFA')"
            )
    models = sorted({gpu.split(",")[1].strip() for r in reports for gpu in r.gpus if "," in gpu})
    detail = f"{len(nodes)} node(s), {'/'.join(models) or 'no GPUs'}"
    limits = sorted({report.memlock_text() for report in reports})
    if limits:
        detail += f", memlock {'/'.join(limits)}"
    if fsx:
        detail += ", FSx writable" if not problems else ", FSx checked"
    return CheckResult("nvidia-smi", not problems, detail, problems)


@dataclass(frozen=True)
class NcclReport:
    sizes: list[int]
    busbw: list[float]
    """Out-of-place bus bandwidth (GB/s) per message size."""
    avg_busbw: float | None
    network: str | None
    """`OFI`, `Socket` or `IB`: the NCCL net transport the log shows."""
    provider: str | None
    """Libfabric provider the OFI plugin selected (`efa`; `tcp`/`sockets` is no better)."""
    gpudirect_rdma: bool
    wrong: int | None

    @property
    def peak_busbw(self) -> float | None:
        return max(self.busbw) if self.busbw else None


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
_WRONG = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w[\w-]*)")
_USING_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_OFI_MARKS = ("NET/OFI", "NET/AWS Libfabric", "NET/Libfabric")


def _network_name(text: str) -> str | None:
    lowered = text.lower()
    if "libfabric" in lowered or "ofi" in lowered:
        return "OFI"
    if "socket" in lowered:
        return "Socket"
    if lowered.startswith("ib"):
        return "IB"
    return None


def parse_nccl_log(text: str) -> NcclReport:
    """An all-reduce log (ours or nccl-tests' `all_reduce_perf`) with `NCCL_DEBUG=INFO`."""
    sizes: list[int] = []
    busbw: list[float] = []
    avg = wrong = None
    network = provider = None
    gdr = False
    for line in text.splitlines():
        if row := _ROW.match(line):
            sizes.append(int(row.group(1)))
            busbw.append(float(row.group(5)))
        elif match := _AVG.search(line):
            avg = float(match.group(1))
        elif match := _WRONG.search(line):
            wrong = int(match.group(1))
        if match := _PROVIDER.search(line):
            provider = match.group(1).lower()
        if match := _USING_NETWORK.search(line):
            network = _network_name(match.group(1)) or network
        elif network is None and any(mark in line for mark in _OFI_MARKS):
            network = "OFI"
        elif network is None and "NET/Socket" in line:
            network = "Socket"
        if "GDRDMA" in line or "GPU Direct RDMA Enabled" in line:
            gdr = True
    return NcclReport(sizes, busbw, avg, network, provider, gdr, wrong)


def check_nccl(report: NcclReport, expected: ExpectedNodeResources) -> CheckResult:
    """NCCL's transport against what the stack asked for, and a sane bandwidth table."""
    problems, warnings = [], []
    if not report.busbw:
        problems.append("no bandwidth rows in the log: the benchmark did not run to the end")
    if report.wrong:
        problems.append(f"{report.wrong} wrong values after all-reduce")
    multi_node = expected.node_count > 1
    if multi_node and expected.efa:
        if report.network != "OFI":
            problems.append(
                f"NCCL used {report.network or 'an unknown transport'}, not NET/OFI: EFA is "
                "not in use (pods without vpc.amazonaws.com/efa, no aws-ofi-nccl in the image, "
                "or FI_PROVIDER not efa)"
            )
        elif report.provider not in (None, "efa"):
            problems.append(f"NET/OFI selected libfabric provider {report.provider!r}, not efa")
        if expected.gpudirect_rdma and report.network == "OFI" and not report.gpudirect_rdma:
            warnings.append(
                "no GDRDMA channels in the log: GPUDirect RDMA seems off (expected on this type)"
            )
    elif multi_node and report.network == "OFI" and report.provider == "efa":
        warnings.append("NCCL used EFA although the stack does not enable it")
    transport = report.network or "unknown"
    if report.provider:
        transport += f" ({report.provider}{', GPUDirect RDMA' if report.gpudirect_rdma else ''})"
    if not multi_node:
        transport += "; one node: the network is not exercised"
    bandwidth = (
        f"busbw avg {report.avg_busbw:.1f} GB/s, peak {report.peak_busbw:.1f} GB/s"
        if report.avg_busbw is not None and report.peak_busbw is not None
        else "no bandwidth"
    )
    return CheckResult(
        "nccl", not problems, f"{bandwidth}, transport {transport}", problems, warnings
    )


# -- cluster access ------------------------------------------------------------------------------


PROGRESS_EVERY_S = 60.0
"""How often a waiting check says what it waits for and for how long (a check may take up to
`--timeout`, 30 minutes by default: GPU nodes scaling up, an image pull)."""


def wait_until(
    condition: Callable[[], str | None],
    *,
    timeout_s: float,
    interval_s: float = 10.0,
    what: str = "the check",
    report: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Poll `condition` until it returns a state (not None) or `timeout_s` passes; every
    `PROGRESS_EVERY_S` say what is awaited and for how long (`report`, the log by default)."""
    say = report or log.info
    started = clock()
    deadline = started + timeout_s
    reported = started
    while True:
        state = condition()
        if state is not None:
            return state
        now = clock()
        if now >= deadline:
            return "timeout"
        if now - reported >= PROGRESS_EVERY_S:
            say(f"waiting for {what}: {_minutes(now - started)} of {_minutes(timeout_s)}")
            reported = now
        sleep(interval_s)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def job_state(job: dict[str, Any]) -> str | None:
    """`Complete`/`Failed` for a batch Job or a TrainJob, `Succeeded`/`Failed` for a
    PyTorchJob, else None."""
    for condition in job.get("status", {}).get("conditions", []) or []:
        if condition.get("status") == "True" and condition.get("type") in (
            "Complete",
            "Succeeded",
            "Failed",
        ):
            return str(condition["type"])
    return None


# -- the checks ----------------------------------------------------------------------------------


def run_node_check(kubectl: KubeClient, expected: ExpectedNodeResources) -> CheckResult:
    nodes = parse_nodes(
        {"items": kubectl.list_nodes(f"{INSTANCE_TYPE_LABEL}={expected.instance_type}")}
    )
    return check_nodes(nodes, expected)


def run_gpu_check(
    kubectl: KubeClient,
    job: dict[str, Any],
    expected: ExpectedNodeResources,
    timeout_s: float,
    *,
    fsx: bool = False,
) -> CheckResult:
    from infra.job.kube_client import KubernetesApiError

    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    state = wait_until(
        lambda: job_state(kubectl.get_batch_job(namespace, name)),
        timeout_s=timeout_s,
        what=f"job {name} (nvidia-smi on every GPU node)",
    )
    pods = {"items": kubectl.list_pods(namespace, f"job-name={name}")}
    reports = []
    for pod in pods.get("items", []):
        pod_name = pod["metadata"]["name"]
        try:
            text = "".join(kubectl.pod_log_lines(namespace, pod_name, None))
            reports.append(parse_gpu_check_log(text))
        except KubernetesApiError as error:  # a pod that never started has no log
            log.warning("no log from %s: %s", pod_name, error)
    result = check_gpu_reports(reports, expected, fsx=fsx)
    if state != "Complete":
        result.passed = False
        result.problems.insert(
            0, f"job {name} ended {state}: see kubectl -n {namespace} describe job {name}"
        )
    return result


def run_nccl_check(
    kubectl: KubeClient, job: dict[str, Any], expected: ExpectedNodeResources, timeout_s: float
) -> tuple[CheckResult, str]:
    from infra.job.kube_client import KubernetesApiError

    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    api = TRAINJOB if job.get("kind") == TRAINJOB.kind else PYTORCHJOB
    state = wait_until(
        lambda: job_state(kubectl.get_job(api, namespace, name)),
        timeout_s=timeout_s,
        what=f"{api.kind} {name} (the NCCL all-reduce)",
    )
    pod = f"{name}-worker-0"
    try:
        if api is TRAINJOB:  # JobSet's pods carry a random suffix: node 0 by its labels
            found = kubectl.list_pods(namespace, api.first_worker_selector(name))
            pod = max((str(p["metadata"]["name"]) for p in found), default=f"{name}-node-0-0")
        text = "".join(kubectl.pod_log_lines(namespace, pod, api.container_name))
    except KubernetesApiError as error:  # a pod that never started has no log
        text = ""
        log.warning("no log from %s: %s", pod, error)
    result = check_nccl(parse_nccl_log(text), expected)
    if state != api.succeeded_condition:
        result.passed = False
        result.problems.insert(
            0,
            f"{api.kind} {name} ended {state}: "
            f"see kubectl -n {namespace} describe {api.kubectl_name} {name}",
        )
    return result, text


def resolve_image(
    config: StackConfig, stack: str, image: str | None, outputs: dict[str, Any]
) -> str:
    """`--image`, else the stack's own `image.uri`, else the image `pulumi up` built."""
    if image:
        return image
    if config.image.uri:
        return config.image.uri
    image_uri = outputs.get("image")
    if not isinstance(image_uri, str) or not image_uri:
        raise CliError(
            f"stack {stack!r} has no image output: pass --image, set image.uri, or run "
            "`pulumi up` first"
        )
    return image_uri


def _format_report(results: Sequence[CheckResult]) -> str:
    lines = []
    for result in results:
        lines.append(f"{'PASS' if result.passed else 'FAIL'}  {result.name:<11} {result.detail}")
        lines += [f"      - {problem}" for problem in result.problems]
        lines += [f"      ! {warning}" for warning in result.warnings]
    return "\n".join(lines)


@click.command()
@stack_arguments()
@click.option("--image", help="Image for the check pods (default: the stack's trainer image).")
@click.option("--context", help="A kubectl context of yours instead of the stack's cluster.")
@click.option("--skip", multiple=True, type=click.Choice(CHECKS), help="Skip a check.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Seconds each check job may take.")  # fmt: skip
@click.option("--keep", is_flag=True, help="Leave the check workloads in place.")
@click.option("--render-only", is_flag=True, help="Print the manifests and exit (offline).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JSON here.")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Every request to the cluster.")
def validate(
    stack: str,
    image: str | None,
    context: str | None,
    skip: tuple[str, ...],
    timeout: float,
    keep: bool,
    render_only: bool,
    json_path: Path | None,
    verbose: bool,
) -> int:
    """Check a stack's GPU cluster before paying for a run: nodes, GPUs and EFA devices, the
    FSx mount, NCCL's bandwidth and transport.

    \b
        fsdp-eks validate llama31-8b-p5               # every check
        fsdp-eks validate llama31-8b-p5 --skip nccl   # devices only
        fsdp-eks validate llama31-8b-p5 --render-only # the check workloads, offline

    It runs on the stack's own cluster (from its outputs), never the current kubectl
    context unless --context names one. Exit status 0 when every check passes, 1 otherwise.
    """
    from infra.job.cluster_checks import expected_node_resources, validation_manifests
    from infra.job.stack_checks import plan_stack_file

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    plan = plan_stack_file(stack)
    config = plan.config
    name = name_of(stack)
    expected = expected_node_resources(config)
    run_id = f"validate-{secrets.token_hex(3)}"
    target = None if render_only else resolve_target(name, context=context)
    if render_only or target is None:
        image = image or config.image.uri or "<trainer image: pulumi stack output image>"
    else:
        image = resolve_image(config, name, image, dict(target.outputs))
    claim = config.storage.claim_name(name)
    documents = validation_manifests(
        plan,
        image=image,
        run_id=run_id,
        bench_script=BENCH_SCRIPT.read_text(),
        claim_name=claim,
    )
    if render_only or target is None:
        click.echo(to_yaml(documents))
        return 0
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    [gpu_job] = [d for d in documents if d["kind"] == "Job"]
    [bench] = [d for d in documents if d["kind"] == "ConfigMap"]
    # The NCCL workload: a PyTorchJob, or a TrainingRuntime and the TrainJob using it.
    workload = [d for d in documents if d not in (*policies, gpu_job, bench)]
    nccl = workload[-1]

    kubectl = target.client()
    results: list[CheckResult] = []
    created: list[dict[str, Any]] = []
    try:
        if {"nvidia-smi", "nccl"} - set(skip):  # before any check pod exists
            kubectl.apply(policies, field_manager=FIELD_MANAGER)
            created += policies
        if "nodes" not in skip:
            log.info("checking %d %s node(s)", expected.node_count, expected.instance_type)
            results.append(run_node_check(kubectl, expected))
        if "nvidia-smi" not in skip:
            log.info("running nvidia-smi on every GPU node (job %s)", gpu_job["metadata"]["name"])
            kubectl.apply([gpu_job], field_manager=FIELD_MANAGER)
            created.append(gpu_job)
            results.append(
                run_gpu_check(kubectl, gpu_job, expected, timeout, fsx=claim is not None)
            )
        if "nccl" not in skip:
            log.info("running the NCCL all-reduce (%s %s)", nccl["kind"], nccl["metadata"]["name"])
            kubectl.apply([bench, *workload], field_manager=FIELD_MANAGER)
            created += [bench, *workload]
            result, text = run_nccl_check(kubectl, nccl, expected, timeout)
            results.append(result)
            if not result.passed:
                log.info("last lines of the NCCL log:\n%s", "\n".join(text.splitlines()[-40:]))
    finally:
        if created and not keep:
            kubectl.delete(reversed(created))
    click.echo(_format_report(results))
    if json_path is not None:
        json_path.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(result.passed for result in results) else 1
