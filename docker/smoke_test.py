"""Smoke test of the trainer image, run by the build before the image is pushed.

    python3 smoke_test.py --level quick|standard|full [--image] [--json results.json]

Levels add to each other:
  quick     the trainer and its dependencies import; the trainer's own flag parser works; the
            torch kept from the base image is one the pinned torchao runs with (fp8).
  standard  + torch's CUDA/NCCL build, the EFA libraries (libfabric, aws-ofi-nccl) load, GPUs
            are visible (where there are any), and every model preset builds a config.
  full      + a tiny model trains: forward, backward and optimizer steps lower the loss on a
            fixed batch, and a one-rank collective runs (NCCL on a GPU, gloo on a CPU).

`--image` says "this is the built image": checks of what the image must contain (EFA libraries,
a CUDA build of torch, no Pulumi) are then required. Without it (a laptop, CI) they are
reported as skipped, not applicable. Checks that need a GPU are skipped, not failed, on a
machine without one: the build host has none. The exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

LEVELS = ("quick", "standard", "full")
Status = Literal["passed", "failed", "skipped"]

logger = logging.getLogger("smoke_test")

REQUIRED_MODULES = (
    "torch",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "transformers",
    "datasets",
    "tokenizers",
    "safetensors",
    "torchao",
    "torchao.float8",
    "trainer",
    "trainer.config",
    "trainer.presets",
    "trainer.models",
    "trainer.parallelize",
    "trainer.distributed",
    "trainer.data",
    "trainer.optim",
    "trainer.checkpoint",
    "trainer.export",
    "trainer.metrics",
    "trainer.float8",
    "trainer.train",
)
"""Everything `python -m trainer` imports on its way to the first step."""

FORBIDDEN_IN_IMAGE = ("pulumi", "pulumi_aws", "boto3", "infra")
"""The image installs the trainer group only; any of these means the wrong group went in."""

EFA_LIBRARY_DIRS = (
    "/opt/amazon/efa/lib",
    "/opt/amazon/efa/lib64",
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    "/opt/amazon/aws-ofi-nccl/lib",
    "/opt/aws-ofi-nccl/lib",
)


class NotApplicable(Exception):  # noqa: N818 - reads as a verdict, like StopIteration
    """Raised by a check that cannot run here (no GPU, not the image); reported as skipped."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    level: str
    status: Status
    detail: str
    seconds: float


@dataclass(frozen=True)
class Context:
    image: bool
    library_dirs: tuple[str, ...]

    @property
    def has_gpu(self) -> bool:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


# --- quick -------------------------------------------------------------------------------


def check_imports(ctx: Context) -> str:
    versions = []
    for name in REQUIRED_MODULES:
        module = importlib.import_module(name)
        version = getattr(module, "__version__", None)
        if version and "." not in name:
            versions.append(f"{name} {version}")
    return ", ".join(versions)


def check_trainer_flags(ctx: Context) -> str:
    from trainer.config import flag_names, parse_args

    parse_args([])  # the defaults alone must form a valid run
    return f"{len(flag_names())} flags, defaults parse"


def check_torchao_pairing(ctx: Context) -> str:
    """The image keeps its base's torch but installs torchao from uv.lock: a torch outside the
    range that torchao runs with would fail only when a run asks for --precision fp8."""
    import torch
    import torchao

    from trainer.float8 import TORCHAO_TORCH_RANGE, check_torch_pairing

    check_torch_pairing(torch.__version__)
    (low_major, low_minor), (high_major, high_minor) = TORCHAO_TORCH_RANGE
    return (
        f"torch {torch.__version__} with torchao {torchao.__version__} "
        f"(runs with torch {low_major}.{low_minor} to {high_major}.{high_minor})"
    )


def check_no_infra_packages(ctx: Context) -> str:
    if not ctx.image:
        raise NotApplicable("not the built image (the dev environment holds pulumi on purpose)")
    present = [name for name in FORBIDDEN_IN_IMAGE if importlib.util.find_spec(name) is not None]
    if present:
        raise AssertionError(f"infra packages in the trainer image: {', '.join(present)}")
    return "no pulumi/boto3/infra"


CACHE_DIR_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
"""Compile caches the first step writes to; an unwritable one fails only once training starts."""


def check_cache_dirs_writable(ctx: Context) -> str:
    configured = {name: os.environ.get(name) for name in CACHE_DIR_VARIABLES}
    if ctx.image and not configured["TRITON_CACHE_DIR"]:
        raise AssertionError("TRITON_CACHE_DIR is not set; Triton would cache under $HOME")
    present = {name: path for name, path in configured.items() if path}
    if not present:
        raise NotApplicable("no compile cache directory configured here")
    for name, path in present.items():
        directory = Path(path)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".smoke-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as error:
            raise AssertionError(
                f"{name}={path} is not writable by uid {os.getuid()}: {error}"
            ) from error
    return ", ".join(f"{name}={path}" for name, path in present.items())


# --- standard ----------------------------------------------------------------------------


def check_torch_cuda_build(ctx: Context) -> str:
    import torch

    if torch.version.cuda is None:
        if ctx.image:
            raise AssertionError(f"torch {torch.__version__} is a CPU-only build")
        raise NotApplicable(f"torch {torch.__version__} is a CPU-only build (fine off-image)")
    if not torch.distributed.is_nccl_available():
        raise AssertionError("torch was built without NCCL")
    major, minor, patch = torch.cuda.nccl.version()
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {major}.{minor}.{patch}"


def check_gpus(ctx: Context) -> str:
    import torch

    if not ctx.has_gpu:
        raise NotApplicable("no GPU on this machine")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    capability = torch.cuda.get_device_capability(0)
    if not torch.cuda.is_bf16_supported():
        raise AssertionError(f"{names[0]} lacks bf16, which the trainer trains in")
    return f"{len(names)} x {names[0]} (sm_{capability[0]}{capability[1]})"


def default_library_dirs() -> tuple[str, ...]:
    """Where the dynamic loader looks: LD_LIBRARY_PATH, ld.so.conf.d entries, EFA's dirs."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for conf in sorted(Path("/etc/ld.so.conf.d").glob("*.conf")):
        lines = conf.read_text().splitlines()
        dirs += [line.strip() for line in lines if line.strip().startswith("/")]
    dirs += EFA_LIBRARY_DIRS
    return tuple(dict.fromkeys(dirs))


def _find_library(patterns: tuple[str, ...], dirs: tuple[str, ...]) -> str | None:
    for directory in dirs:
        for pattern in patterns:
            matches = sorted(Path(directory).glob(pattern))
            if matches:
                return str(matches[0])
    return None


def check_efa_libraries(ctx: Context) -> str:
    if not ctx.image:
        raise NotApplicable("not the built image (EFA libraries live only there)")
    found = []
    for label, patterns in (
        ("libfabric", ("libfabric.so.1", "libfabric.so")),
        ("aws-ofi-nccl", ("libnccl-net-ofi.so", "libnccl-net.so")),
    ):
        path = _find_library(patterns, ctx.library_dirs)
        if path is None:
            raise AssertionError(f"{label} not found in {', '.join(ctx.library_dirs)}")
        try:
            ctypes.CDLL(path)  # loads only if every library it links against resolves
        except OSError as error:
            # The CUDA driver (libcuda.so.1) comes from the host at run time; a build host
            # without a GPU has none, so only that one missing dependency is tolerated there.
            if "libcuda.so" not in str(error) or ctx.has_gpu:
                raise
            found.append(f"{label} {path} (present; loads on a GPU node)")
            continue
        found.append(f"{label} {path}")
    return "; ".join(found)


def check_efa_devices(ctx: Context) -> str:
    devices = sorted(Path("/dev/infiniband").glob("uverbs*"))
    if not devices:
        raise NotApplicable("no EFA device in this container (build host or a non-EFA node)")
    return f"{len(devices)} EFA device(s)"


def check_model_configs(ctx: Context) -> str:
    from trainer.models import count_parameters, hf_config_from
    from trainer.presets import PRESETS

    for name, shape in PRESETS.items():
        config = hf_config_from(shape)
        if config.num_hidden_layers != shape.num_layers:
            raise AssertionError(f"preset {name}: config has {config.num_hidden_layers} layers")
    tiny = {name: count_parameters(hf_config_from(PRESETS[name])) for name in ("tiny", "tiny-moe")}
    return f"{len(PRESETS)} presets; " + ", ".join(f"{k} {v:,} params" for k, v in tiny.items())


# --- full --------------------------------------------------------------------------------


def check_tiny_training_steps(ctx: Context) -> str:
    import torch

    from trainer.models import build_model, hf_config_from
    from trainer.optim import build_optimizer
    from trainer.presets import PRESETS

    device = torch.device("cuda" if ctx.has_gpu else "cpu")
    config = hf_config_from(PRESETS["tiny"])
    model = build_model(config, device=device, seed=0)
    optimizer = build_optimizer(model, lr=3e-3, weight_decay=0.0, beta1=0.9, beta2=0.95)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, config.vocab_size, (4, 64), generator=generator).to(device)
    losses = []
    for _ in range(4):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        if missing:
            raise AssertionError(f"no gradient for {missing[:3]}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    if not all(map(torch.isfinite, map(torch.tensor, losses))):
        raise AssertionError(f"non-finite loss: {losses}")
    if not losses[-1] < losses[0]:
        raise AssertionError(f"loss did not fall on a repeated batch: {losses}")
    return f"{device.type}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps"


def check_collective(ctx: Context) -> str:
    import torch
    import torch.distributed as dist

    backend = "nccl" if ctx.has_gpu else "gloo"
    device = torch.device("cuda", 0) if ctx.has_gpu else torch.device("cpu")
    if ctx.has_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        value = torch.ones(4, device=device)
        dist.all_reduce(value)
        if value.sum().item() != 4.0:
            raise AssertionError(f"all_reduce over one rank changed the tensor: {value}")
    finally:
        dist.destroy_process_group()
    return f"{backend} all_reduce over 1 rank"


CHECKS: dict[str, tuple[tuple[str, Callable[[Context], str]], ...]] = {
    "quick": (
        ("imports", check_imports),
        ("trainer_flags", check_trainer_flags),
        ("torchao_pairing", check_torchao_pairing),
        ("no_infra_packages", check_no_infra_packages),
        ("cache_dirs_writable", check_cache_dirs_writable),
    ),
    "standard": (
        ("torch_cuda_build", check_torch_cuda_build),
        ("gpus", check_gpus),
        ("efa_libraries", check_efa_libraries),
        ("efa_devices", check_efa_devices),
        ("model_configs", check_model_configs),
    ),
    "full": (
        ("tiny_training_steps", check_tiny_training_steps),
        ("collective", check_collective),
    ),
}


def run_checks(level: str, ctx: Context) -> list[CheckResult]:
    """Run every check up to and including `level`, in order, each isolated from the others."""
    if level not in LEVELS:
        raise ValueError(f"--level {level!r} is not one of {', '.join(LEVELS)}")
    results = []
    for current in LEVELS[: LEVELS.index(level) + 1]:
        for name, check in CHECKS[current]:
            started = time.perf_counter()
            status: Status
            try:
                detail = check(ctx)
                status = "passed"
            except NotApplicable as reason:
                status, detail = "skipped", f"not applicable: {reason}"
            except Exception as error:  # a check's failure is a result, not a crash
                status, detail = "failed", f"{type(error).__name__}: {error}"
            seconds = time.perf_counter() - started
            results.append(CheckResult(name, current, status, detail, round(seconds, 3)))
            log = logger.error if status == "failed" else logger.info
            log("%-8s %-20s %-7s %s", current, name, status.upper(), detail)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--level", choices=LEVELS, default="standard", help="how much to check")
    parser.add_argument(
        "--image",
        action="store_true",
        help="running in the built image: require EFA libraries, CUDA torch, no pulumi",
    )
    parser.add_argument(
        "--library-dir",
        action="append",
        default=None,
        help="where to look for libfabric / aws-ofi-nccl (repeatable; default: the loader's dirs)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[smoke] %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    ctx = Context(image=args.image, library_dirs=tuple(args.library_dir or default_library_dirs()))
    results = run_checks(args.level, ctx)
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "skipped", "failed")}
    logger.info(
        "level %s: %d passed, %d skipped (not applicable), %d failed",
        args.level,
        counts["passed"],
        counts["skipped"],
        counts["failed"],
    )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
