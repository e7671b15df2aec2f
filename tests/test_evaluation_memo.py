"""The test suite's evaluation memo (tests/evaluation_memo.py) answers again only where a fresh
evaluation would give the same answer."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pulumi import FileAsset

import infra.job.flags
import scripts.cli.plan
from infra.config import read_stack_file
from infra.offline import Evaluation, FakeCloud
from infra.offline.outputs import INVOKE_RESULTS
from infra.offline.runtime import evaluate as installed_evaluate
from infra.program import main as program
from tests.evaluation_memo import MEMO_ENV, Memo

CALLER = "aws:index/getCallerIdentity:getCallerIdentity"
real_evaluate: Any = getattr(installed_evaluate, "__wrapped__", installed_evaluate)
"""The evaluate tests/conftest.py put the suite's memo in front of."""


class Recorder:
    """An evaluate that counts its calls and returns a new mutable answer each time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, run: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if kwargs.get("config", {}).get("refused"):
            raise ValueError("refused")
        return {"call": self.calls, "resources": [{"name": "job"}]}


def test_same_inputs_evaluate_once_and_each_caller_gets_its_own_copy() -> None:
    recorder = Recorder()
    memo = Memo(recorder)
    first = memo(program, config={"a": 1}, stack="dev")
    first["resources"][0]["name"] = "changed by a test"
    again = memo(program, config={"a": 1}, stack="dev")
    assert recorder.calls == 1
    assert again == {"call": 1, "resources": [{"name": "job"}]}
    memo(program, config={"a": 2}, stack="dev")
    memo(program, config={"a": 1}, stack="prod")
    assert recorder.calls == 3
    assert memo.counts == {"evaluated": 3, "reused": 1}


def test_a_patch_the_program_could_see_evaluates_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    memo = Memo(recorder)
    memo(program, config={})
    monkeypatch.setattr(scripts.cli.plan, "HIDDEN_TYPES", ())  # infra never imports scripts
    memo(program, config={})
    assert recorder.calls == 1
    with monkeypatch.context() as patch:
        patch.setattr(infra.job.flags, "TRAINER_LAUNCHER", infra.job.flags.TRAINER_LAUNCHER)
        memo(program, config={})
        memo(program, config={})
    assert recorder.calls == 3
    memo(program, config={})  # the patch is undone
    assert recorder.calls == 3


def test_the_environment_and_directory_are_part_of_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    recorder = Recorder()
    memo = Memo(recorder)
    memo(program, config={})
    monkeypatch.setenv("PULUMI_CONFIG", '{"fsdp-eks:x": "1"}')
    memo(program, config={})
    monkeypatch.chdir(tmp_path)
    memo(program, config={})
    assert recorder.calls == 3


def test_a_mocked_answer_swapped_without_monkeypatch_changes_the_key() -> None:
    recorder = Recorder()
    memo = Memo(recorder)
    memo(program, config={})
    real = INVOKE_RESULTS[CALLER]
    INVOKE_RESULTS[CALLER] = lambda args: {**real(args), "arn": "arn:aws:sts::1:assumed-role/x/y"}
    try:
        memo(program, config={})
    finally:
        INVOKE_RESULTS[CALLER] = real
    memo(program, config={})
    assert recorder.calls == 2


def test_a_config_without_a_canonical_form_is_evaluated_not_refused() -> None:
    recorder = Recorder()
    memo = Memo(recorder)
    mixed = {"training": {True: "from YAML `on:`", "steps": 1}}
    memo(program, config=mixed)
    memo(program, config=mixed)
    assert recorder.calls == 2


def test_other_programs_fake_clouds_refusals_and_off_always_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder()
    memo = Memo(recorder)

    def own_program() -> None:
        return None

    for _ in range(2):
        memo(own_program, config={})
        memo(program, config={}, fake_cloud=FakeCloud("us-west-2"))
        with pytest.raises(ValueError, match="refused"):
            memo(program, config={"refused": True})
    assert recorder.calls == 6
    monkeypatch.setenv(MEMO_ENV, "off")
    memo(program, config={})
    memo(program, config={})
    assert recorder.calls == 8


def test_a_kept_evaluation_is_what_a_fresh_one_registers() -> None:
    stack = read_stack_file("dev")
    memo = Memo(real_evaluate)
    arguments: dict[str, Any] = {
        "config": stack.config,
        "secret_keys": stack.secret_keys,
        "stack": "dev",
    }
    memo(program, **arguments)
    kept = memo(program, **arguments)
    fresh = real_evaluate(program, **arguments)
    assert memo.counts == {"evaluated": 1, "reused": 1}
    assert real_evaluate is not installed_evaluate  # fresh is a real evaluation
    assert canonical(kept) == canonical(fresh)


def canonical(evaluation: Evaluation) -> dict[str, Any]:
    """What an evaluation registered, without what varies between two evaluations: the order
    the SDK's tasks register in, and the identity of asset objects."""

    def plain(value: Any) -> Any:
        if isinstance(value, FileAsset):
            return ("FileAsset", value.path)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    resources = {
        r.urn: {**plain(dataclasses.asdict(r)), "dependencies": sorted(r.dependencies)}
        for r in evaluation.resources
    }
    assert len(resources) == len(evaluation.resources)
    return {
        "resources": resources,
        "outputs": plain(evaluation.stack_outputs),
        "invokes": sorted(json.dumps(plain(i), sort_keys=True) for i in evaluation.invokes),
        "warnings": sorted(evaluation.warnings),
    }
