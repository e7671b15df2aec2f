"""One table of trainer flags (trainer/config.py `_flag`): each flag's stack key (or what the
program renders it from) and whether it shapes the model, from which the rendering, the
rendered-flag set, the stack keys' docs, `fsdp-eks trainer-flags`' marks and the plan's
checks are derived (issue 29 item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from infra.config.trainer_keys import keyed_rows, rendered_flag_names, stack_value
from infra.job.flags import RUN_PATH_FLAGS, run_paths, trainer_argv, trainer_flags
from infra.job.stack_checks import plan_stack_file
from trainer.config import shape_flag_names

ROOT = Path(__file__).resolve().parents[2]


def test_every_stack_key_of_the_table_is_a_key_of_the_stack_schema() -> None:
    config = plan_stack_file("llama31-8b-p5").config
    for key in keyed_rows():
        stack_value(config, key)  # StopIteration for a key the schema lacks


def test_the_job_renders_exactly_the_flags_the_table_marks_rendered() -> None:
    """Before the table, the rendered set was a hand-kept list of 50 names beside the renderer."""
    plan = plan_stack_file("llama31-8b-p5")
    assert set(trainer_flags(plan)) | RUN_PATH_FLAGS == rendered_flag_names()
    argv = trainer_argv(plan, run_paths(plan))
    assert {name.removeprefix("--") for name in argv[::2]} <= rendered_flag_names()


def test_the_shape_flags_are_the_model_section_s_architecture() -> None:
    assert shape_flag_names() == (
        "model", "model_type", "num_layers", "hidden_width", "num_heads",
        "num_key_value_heads", "intermediate_size", "vocab_size", "num_local_experts",
        "num_experts_per_tok", "rope_theta", "tie_word_embeddings",
    )  # fmt: skip


ADD_A_FLAG = r"""
import dataclasses, json
import trainer.config as tc

# A new trainer flag with a stack key: the trainer's field (its table row) and its own check.
@dataclasses.dataclass
class OptimConfig(tc.OptimConfig):
    ema_decay: "float | None" = tc._flag(
        None, "Decay of an exponential moving average of the weights.",
        stack_key="training.emaDecay",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"--ema_decay must be in (0, 1), got {self.ema_decay}")

tc._SECTION_TYPES["optim"] = OptimConfig

from infra.config import StackConfigError, read_stack_file
from infra.job.flags import run_id, trainer_flags
from infra.job.stack_checks import checked_run_plan
from scripts.tooling.config_docs import render_table
from tests.cli.conftest import run_cli

dev = read_stack_file("dev")

def plan(**training):
    values = {**dev.config, "fsdp-eks:training": {**dev.config["fsdp-eks:training"], **training}}
    return checked_run_plan(values, stack_name="dev")

def refusal(**training):
    try:
        plan(**training)
    except StackConfigError as err:
        return err.problems
    return []

print(json.dumps({
    "rendered": trainer_flags(plan(emaDecay=0.99)).get("ema_decay"),
    "run_id_unset": run_id(plan()),
    "documented": [line for line in render_table().splitlines() if "training.emaDecay" in line],
    "checked": refusal(emaDecay=1.5),
    "typed": refusal(emaDecay="high"),
    "marked": run_cli("trainer-flags", "ema_decay").out,
    "extra_args": refusal(extraArgs={"ema_decay": 0.5}),
}))
"""


def test_a_new_flag_with_a_stack_key_needs_only_its_row_in_the_trainer() -> None:
    """The trainer gains `--ema_decay` with `stack_key="training.emaDecay"` (in a fresh process,
    before the program is imported): the stack file takes the key, the job renders the flag,
    the docs list it, the trainer's own check refuses a bad value under the key, and
    `fsdp-eks trainer-flags` marks it. A stack that leaves it unset keeps its run id."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", ADD_A_FLAG], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    golden = json.loads((ROOT / "tests/infra/golden/rendered_flags.json").read_text())
    assert seen["rendered"] == 0.99
    assert seen["run_id_unset"] == golden["dev"]["run_id"]
    [row] = seen["documented"]
    assert row.startswith("| `training.emaDecay` | float \\| null | `null` | Decay of an ")
    assert row.endswith("Trainer flag: `--ema_decay`. |")
    assert seen["checked"] == [
        "training.emaDecay 1.5: the trainer refuses it: --ema_decay must be in (0, 1), got 1.5"
    ]
    [typed] = seen["typed"]
    assert typed.startswith("training.emaDecay = 'high': input should be a valid number")
    assert seen["marked"].startswith("--ema_decay (set by stack key training.emaDecay)")
    assert seen["extra_args"] == [
        "training.extraArgs.ema_decay is set from its own stack key; allowed: training.emaDecay "
        "instead"
    ]
