"""The GPU benchmark matrix: every efficiency choice of the trainer, one command, one table.

`python scripts/bench/throughput.py --matrix` runs, for each model, `torch.compile` off and on and
each activation-checkpointing policy (off, op-level, full) of the trainer in bf16; the plain
Hugging Face loop a user would write (`--loop plain`) with compile off and on, as the baseline
each trainer row is compared with; and, with compile on (fp8 requires it), the trainer in fp8
with each torchao recipe (rowwise, tensorwise). One `throughput.py` process per cell (a
fresh CUDA context: no cell inherits another's allocator state or compiled graphs); the table
between the `gpu-matrix` markers of docs/benchmarks.md is rewritten after every cell, so a
device session cut short still leaves the cells it finished. A cell that fails (out of memory,
a compile error) is a row that says so; the others still run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks.md"
START = "<!-- gpu-matrix:start (written by scripts/bench/throughput.py --matrix) -->"
END = "<!-- gpu-matrix:end -->"

MODELS = ("llama3.2-1b", "llama3.2-3b")
AC_POLICIES = ("off", "op", "full")
MATRIX_BATCH_SIZE = 2
"""Sequences of 4096 tokens per GPU: room on an 80 GB card for the 3B model without
checkpointing now that the loss never holds the whole vocabulary's fp32 logits."""


FP8_RECIPES = ("rowwise", "tensorwise")


@dataclass(frozen=True)
class Cell:
    model: str
    compile: bool
    ac: str
    loop: str = "trainer"
    precision: str = "bf16"
    """bf16, or fp8-<recipe>."""

    def argv(self, args: argparse.Namespace) -> list[str]:
        """The `throughput.py` flags of this cell."""
        fp8 = self.precision.startswith("fp8-")
        return [
            "--model", self.model,
            "--seq_len", str(args.seq_len),
            "--batch_size", str(args.batch_size),
            "--steps", str(args.steps),
            "--warmup_steps", str(max(args.warmup_steps, 1 if self.compile else 0)),
            "--compile", str(int(self.compile)),
            "--activation_checkpointing", self.ac,
            "--loss_chunk_tokens", str(args.loss_chunk_tokens),
            "--bf16", str(int(args.bf16)),
            "--device", args.device,
            "--loop", self.loop,
            "--precision", "fp8" if fp8 else "bf16",
            *(["--fp8_recipe", self.precision.removeprefix("fp8-")] if fp8 else []),
            *(["--num_layers", str(args.num_layers)] if args.num_layers else []),
        ]  # fmt: skip


def cells(models: Sequence[str], compiles: Sequence[bool]) -> list[Cell]:
    """Per model: the plain baseline first (so every later row shows its ratio to it), the
    trainer's bf16 cells, then fp8 (compiled only)."""
    result = []
    for model in models:
        result += [Cell(model, c, "off", loop="plain") for c in compiles]
        result += [Cell(model, c, ac) for c, ac in itertools.product(compiles, AC_POLICIES)]
        if True in compiles:
            result += [Cell(model, True, "off", precision=f"fp8-{r}") for r in FP8_RECIPES]
    return result


def run_cell(cell: Cell, args: argparse.Namespace) -> dict[str, Any]:
    """One benchmark process; its JSON line, or the reason it gave none."""
    command = [sys.executable, str(ROOT / "scripts" / "bench" / "throughput.py"), *cell.argv(args)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.cell_timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.cell_timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    reason = next(
        (line for line in reversed(done.stderr.splitlines()) if "Error" in line),
        (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1],
    )
    return {"error": reason.strip()[:200]}


def table(results: list[tuple[Cell, dict[str, Any]]]) -> str:
    """The markdown table of the cells run so far; "vs plain" is tokens/s over the plain
    loop's with the same model and compile setting (once that cell has run)."""
    rows = [
        "| model | loop | precision | compile | activation checkpointing | tokens/s per GPU | "
        "MFU | step time | peak memory | vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = {
        (cell.model, cell.compile): result["tokens_per_sec_per_gpu"]
        for cell, result in results
        if cell.loop == "plain" and "error" not in result
    }
    for cell, result in results:
        head = (
            f"| {cell.model} | {cell.loop} | {cell.precision} | {'on' if cell.compile else 'off'} "
            f"| {cell.ac} |"
        )
        if "error" in result:
            rows.append(f"{head} failed: {result['error']} | | | | |")
            continue
        mfu = "n/a" if result.get("mfu") is None else f"{100 * result['mfu']:.1f}%"
        baseline = plain.get((cell.model, cell.compile))
        ratio = "" if baseline is None else f"{result['tokens_per_sec_per_gpu'] / baseline:.2f}"
        rows.append(
            f"{head} {result['tokens_per_sec_per_gpu']:,.0f} | {mfu} | "
            f"{result['step_time_s']:.3f} s | {result['peak_mem_gib']:.1f} GiB | {ratio} |"
        )
    return "\n".join(rows)


def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the markers (added at the end when absent)."""
    document = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{START}\n\n{text}\n\n{END}"
    if START in document and END in document:
        before, rest = document.split(START, 1)
        after = rest.split(END, 1)[1]
        document = f"{before}{block}{after}"
    else:
        document = f"{document.rstrip()}\n\n{block}\n"
    path.write_text(document, encoding="utf-8")


def run_matrix(args: argparse.Namespace) -> int:
    """Every cell in turn; the docs table rewritten after each. Exit 1 if any cell failed."""
    models = args.matrix_models or list(MODELS)
    compiles = args.matrix_compile
    results: list[tuple[Cell, dict[str, Any]]] = []
    for cell in cells(models, compiles):
        print(
            f"matrix: {cell.model}, {cell.loop} {cell.precision}, compile {int(cell.compile)}, "
            f"AC {cell.ac}",
            flush=True,
        )
        result = run_cell(cell, args)
        results.append((cell, result))
        if args.json_out is not None:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            with args.json_out.open("a", encoding="utf-8") as out:
                out.write(json.dumps({**result, "cell": cell.__dict__}) + "\n")
        device = next((r["device"] for _, r in results if "device" in r), "unknown device")
        header = (
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {device}, torch "
            f"{next((r['torch_version'] for _, r in results if 'torch_version' in r), '?')}: "
            f"bf16={int(args.bf16)}, {args.batch_size} x {args.seq_len} tokens per GPU, "
            f"{args.steps} timed steps, loss in slices of {args.loss_chunk_tokens} tokens; "
            "fp8 MFU against the bf16 peak, as torchtitan reports it "
            f"(`python scripts/bench/throughput.py --matrix`)."
        )
        write_docs(args.docs, f"{header}\n\n{table(results)}")
        print(table(results), flush=True)
    return 1 if any("error" in result for _, result in results) else 0
