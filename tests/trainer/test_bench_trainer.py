"""The benchmark script runs the trainer's own code on CPU and reports consistent figures."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scripts.bench import matrix as bench_matrix
from scripts.bench import throughput as bench_trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--seq_len", "32", "--batch_size", "2", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _restore_trainer_logger():
    """main() sets up the trainer's logging for the process; undo it for the tests after."""
    logger = logging.getLogger("trainer")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def _last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_bench_tiny_on_cpu_reports_consistent_figures(capsys, tmp_path):
    json_out = tmp_path / "bench.jsonl"
    argv = [*TINY, "--steps", "2", "--warmup_steps", "1", "--bf16", "0"]
    assert bench_trainer.main([*argv, "--peak_tflops", "0.5", "--json_out", str(json_out)]) == 0
    assert not dist.is_initialized()  # the script cleans up its process group
    out = capsys.readouterr().out
    result = _last_json_line(out)
    assert result == json.loads(json_out.read_text().strip())
    assert "tokens/s per GPU" in out and "MFU" in out  # the human-readable table

    assert result["model"] == "tiny" and result["world_size"] == 1
    assert result["tokens_per_step"] == 2 * 32
    assert result["tokens_per_sec"] > 0
    assert result["tokens_per_sec"] == pytest.approx(
        result["tokens_per_step"] / result["step_time_s"]
    )
    assert result["tokens_per_sec_per_gpu"] == pytest.approx(result["tokens_per_sec"])
    # MFU is achieved model FLOP/s over the given peak.
    assert result["peak_tflops_per_gpu"] == pytest.approx(0.5)
    assert result["mfu"] == pytest.approx(result["model_tflops_per_gpu"] / 0.5)
    assert 0 < result["params"] < 2_000_000
    assert math.isfinite(result["final_loss"])
    # Random tokens over a 512 vocabulary: the loss starts near ln(512).
    assert abs(result["final_loss"] - math.log(512)) < 1.0
    assert result["peak_mem_gib"] > 0


def test_bench_without_known_peak_reports_no_mfu(capsys):
    argv = [*TINY, "--steps", "1", "--warmup_steps", "0", "--num_layers", "1"]
    assert bench_trainer.main([*argv, "--activation_checkpointing", "1"]) == 0
    result = _last_json_line(capsys.readouterr().out)
    assert result["mfu"] is None and result["peak_tflops_per_gpu"] is None
    assert result["num_layers"] == 1 and result["activation_checkpointing"] == "full"
    assert result["dtype"].startswith("bf16")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "llama9-1t"], "is not a preset; allowed: llama2-7b"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--compile", "maybe"], "expected 0/1/true/false"),
        (["--compile", "1", "--warmup_steps", "0"], "needs --warmup_steps >= 1"),
        (["--seq_length", "8"], "unrecognized arguments: --seq_length"),
        (["--precision", "fp8"], "--precision fp8 needs --compile 1"),
        (["--precision", "fp8", "--compile", "1", "--bf16", "0"], "needs --bf16 1"),
        (["--fp8_emulate", "1"], "--fp8_emulate applies only to --precision fp8"),
        (["--loop", "plain", "--activation_checkpointing", "1"], "--loop plain is the bf16"),
    ],
)
def test_bench_rejects_bad_flags(capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        bench_trainer.parse_args([*TINY, *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_bench_under_torchrun_two_ranks_as_documented(tmp_path):
    """The documented invocation (`torchrun ... scripts/bench/throughput.py`), two CPU ranks."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        str(ROOT / "scripts" / "bench" / "throughput.py"),
        *TINY,
        "--steps",
        "2",
        "--warmup_steps",
        "1",
        "--bf16",
        "0",
        "--num_layers",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the script must find the repository by itself
    done = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _last_json_line(done.stdout)
    assert result["world_size"] == 2
    assert result["tokens_per_step"] == 2 * 2 * 32
    assert result["tokens_per_sec_per_gpu"] == pytest.approx(result["tokens_per_sec"] / 2)
    assert math.isfinite(result["final_loss"])


def test_bench_cpu_offload_materialises_shards_in_cpu_memory(capsys, monkeypatch):
    """FSDP2 refuses offloaded parameters outside CPU memory: the bench must put them there
    (and the rotary buffers on the compute device), as the trainer does."""
    calls = []
    real = bench_trainer.materialize

    def spy(model, **kwargs):
        calls.append(kwargs)
        real(model, **kwargs)

    monkeypatch.setattr(bench_trainer, "materialize", spy)
    argv = [*TINY, "--steps", "1", "--warmup_steps", "0", "--num_layers", "1", "--bf16", "0"]
    assert bench_trainer.main([*argv, "--cpu_offload", "1"]) == 0
    assert math.isfinite(_last_json_line(capsys.readouterr().out)["final_loss"])
    [kwargs] = calls
    assert kwargs["device"].type == "cpu"
    assert kwargs["buffer_device"].type == "cpu"  # the compute device of this CPU run


def test_offloaded_parameters_live_in_cpu_memory_whatever_the_compute_device():
    from trainer.parallelize import ParallelPlan, parameter_device

    gpu = torch.device("cuda", 5)
    assert parameter_device(ParallelPlan(cpu_offload=True), gpu) == torch.device("cpu")
    assert parameter_device(ParallelPlan(cpu_offload=False), gpu) == gpu


@pytest.mark.slow
def test_the_matrix_runs_every_cell_and_writes_the_table_into_the_docs(tmp_path):
    """`--matrix` on CPU with the tiny preset: one process per compile x AC cell, the table
    between the markers of the docs file (kept text around it), one JSON line per cell."""
    docs = tmp_path / "benchmarks.md"
    docs.write_text(
        f"# Benchmarks\n\nbefore\n\n{bench_matrix.START}\nold\n{bench_matrix.END}\n\nafter\n"
    )
    json_out = tmp_path / "matrix.jsonl"
    argv = [
        "--matrix",
        "--matrix_models", "tiny",
        "--matrix_compile", "0",
        "--seq_len", "32", "--steps", "1", "--warmup_steps", "0", "--num_layers", "2",
        "--device", "cpu", "--bf16", "0",
        "--docs", str(docs), "--json_out", str(json_out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "throughput.py"), *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n") and text.endswith("\n\nafter\n")
    assert "old" not in text
    rows = [line for line in text.splitlines() if line.startswith("| tiny |")]
    # The plain loop first, then the trainer's AC policies, each compared with it; no fp8
    # cells without compile.
    assert [row.split(" | ")[1:5] for row in rows] == [
        ["plain", "bf16", "off", "off"],
        ["trainer", "bf16", "off", "off"],
        ["trainer", "bf16", "off", "op"],
        ["trainer", "bf16", "off", "full"],
    ]
    assert rows[0].endswith("| 1.00 |") and all(re.search(r"\| \d+\.\d\d \|$", r) for r in rows)
    assert "--matrix" in text and "2 x 32 tokens per GPU" in text
    results = [json.loads(line) for line in json_out.read_text().splitlines()]
    assert [(r["cell"]["ac"], r["activation_checkpointing"]) for r in results] == [
        ("off", "off"),
        ("off", "off"),
        ("op", "op"),
        ("full", "full"),
    ]
    assert [r["loop"] for r in results] == ["plain", "trainer", "trainer", "trainer"]
    assert all(r["batch_size"] == bench_matrix.MATRIX_BATCH_SIZE for r in results)


def test_the_matrix_has_fp8_cells_where_compile_is_on() -> None:
    cells = bench_matrix.cells(["llama3.2-3b"], [False, True])
    assert [(c.loop, c.precision, c.compile, c.ac) for c in cells] == [
        ("plain", "bf16", False, "off"),
        ("plain", "bf16", True, "off"),
        *[("trainer", "bf16", compiled, ac) for compiled in (False, True)
          for ac in ("off", "op", "full")],
        ("trainer", "fp8-rowwise", True, "off"),
        ("trainer", "fp8-tensorwise", True, "off"),
    ]  # fmt: skip
    args = bench_trainer.parse_args(["--matrix"])
    argv = cells[-1].argv(args)
    assert argv[argv.index("--precision") + 1] == "fp8"
    assert argv[argv.index("--fp8_recipe") + 1] == "tensorwise"
    assert bench_trainer.parse_args(argv).precision == "fp8"  # each cell's flags parse


def test_bench_plain_loop_and_emulated_fp8_on_cpu(capsys) -> None:
    """The baseline and the fp8 path run end to end at a tiny size (numbers: a smoke test)."""
    argv = [*TINY, "--steps", "1", "--warmup_steps", "1", "--num_layers", "2"]
    assert bench_trainer.main([*argv, "--loop", "plain"]) == 0
    plain = _last_json_line(capsys.readouterr().out)
    assert (plain["loop"], plain["precision"]) == ("plain", "bf16")
    assert bench_trainer.main([*argv, "--precision", "fp8", "--fp8_emulate", "1"]) == 0
    fp8 = _last_json_line(capsys.readouterr().out)
    assert (fp8["loop"], fp8["precision"]) == ("trainer", "fp8 rowwise")
    # Same shape, same tokens, same FLOPs formula: the same work per token.
    assert fp8["params"] == plain["params"]
    assert fp8["model_tflops_per_gpu"] / fp8["tokens_per_sec_per_gpu"] == pytest.approx(
        plain["model_tflops_per_gpu"] / plain["tokens_per_sec_per_gpu"]
    )
    assert abs(fp8["final_loss"] - plain["final_loss"]) < 0.05


def test_fp8_without_fp8_tensor_cores_is_one_line(capsys) -> None:
    argv = [*TINY, "--steps", "1", "--warmup_steps", "1", "--precision", "fp8", "--compile", "1"]
    assert bench_trainer.main(argv) == 2
    assert "error: --precision fp8 needs a GPU with FP8 tensor cores" in capsys.readouterr().err


def test_a_failed_cell_is_a_row_that_says_why():
    cell = bench_matrix.Cell("llama3.2-3b", True, "off", precision="fp8-rowwise")
    table = bench_matrix.table([(cell, {"error": "torch.OutOfMemoryError: CUDA out of memory"})])
    assert (
        "| llama3.2-3b | trainer | fp8-rowwise | on | off | failed: torch.OutOfMemoryError" in table
    )


def test_the_matrix_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit):
        bench_trainer.parse_args(["--matrix", "--matrix_models", "llama9"])
    assert "--matrix_models 'llama9' is not a preset" in capsys.readouterr().err
