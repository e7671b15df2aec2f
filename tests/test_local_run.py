"""The README's first command: a stack's job, scaled to this machine, interrupted and resumed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import StackConfig, StackConfigError, load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.flags import TRAINER_LAUNCHER, run_id
from infra.job.manifest import render_job
from scripts.cli import local as local_run
from scripts.cli.support import local_topology
from scripts.cli.support.errors import CliError
from tests.cli.conftest import assert_one_line_mistake, run_cli
from trainer.config import parse_args

REPO_ROOT = Path(__file__).resolve().parents[1]

DOCUMENTED_LOCAL_RUN = ("local", "dev")
"""The README's first command, which the slow test below trains, interrupts, resumes and
plots; tests/cli/test_docs_commands.py checks that it is the local run its reader finds."""


def test_local_plan_keeps_the_stacks_choices_and_scales_the_rest(tmp_path: Path) -> None:
    config = load_stack_file("llama31-8b-p5")
    plan = local_topology.plan_local_run(
        plan_run(config),
        "llama31-8b-p5",
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=40,
        context=64,
        batch_size=4,
        device="cpu",
        nproc=2,
    )
    launcher = plan.cluster_command.index("trainer", len(TRAINER_LAUNCHER)) + 1
    cluster = parse_args(plan.cluster_command[launcher:])
    local = parse_args(plan.local_args)
    assert cluster.model.preset_name == "llama3.1-8b"
    assert cluster.model.max_context_width == 8192
    assert local.model.preset_name == "tiny"
    assert local.model.max_context_width == 64
    assert local.data.tokenizer == str(tmp_path / "assets" / "tokenizer")
    assert local.parallel.device == "cpu" and not local.parallel.bf16
    # What the stack decides and a laptop can honour is kept.
    assert local.parallel.sharding_strategy == cluster.parallel.sharding_strategy
    assert local.optim.lr_decay_style == cluster.optim.lr_decay_style
    # A checkpoint exists before the interruption, and the interruption is not on one.
    every = local.checkpoint.checkpoint_freq
    assert every <= plan.fail_at_step < local.optim.max_steps
    assert plan.fail_at_step % every != 0
    assert local.checkpoint.resume_from_checkpoint == local.checkpoint.checkpoint_dir


def test_mixture_of_experts_stacks_run_the_tiny_moe_locally(tmp_path: Path) -> None:
    plan = local_topology.plan_local_run(
        plan_run(load_stack_file("mixtral-8x7b-p5")),
        "mixtral-8x7b-p5",
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=20,
        context=64,
        batch_size=2,
        device="cpu",
        nproc=2,
    )
    assert parse_args(plan.local_args).model.shape().num_local_experts > 0


def test_local_run_needs_no_pulumi() -> None:
    code = (
        "import sys; import scripts.cli.local; "
        "bad = [m for m in ('pulumi', 'pulumi_aws', 'pulumi_kubernetes') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_local_run_trains_is_interrupted_resumes_and_plots(tmp_path: Path) -> None:
    result = run_cli(
        *DOCUMENTED_LOCAL_RUN, "--steps", "12", "--context", "32", "--batch-size", "4",
        "--device", "cpu", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.code == 0, result.err[-3000:]
    # The interruption is announced before it happens, and torchrun's ~40-line account of it
    # is one line (its whole text is in the node's log).
    announced = next(i for i, line in enumerate(result.lines) if "stops on purpose" in line)
    collapsed = [i for i, line in enumerate(result.lines) if "reported the planned exit" in line]
    assert len(collapsed) == 1 and announced < collapsed[0]
    assert "ChildFailedError" not in result.out and "Root Cause" not in result.out
    agent_log = (tmp_path / "dev" / "node-0" / "agent.log").read_text()
    # Kept whole. Every rank exits 17 at that step: the first failure torchrun saw is either.
    assert re.search(r"trainer\.launch: rank [01] exited with 17; exiting with 17\n", agent_log)
    assert "Traceback" not in result.out + result.err
    run = tmp_path / "dev"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    assert steps[-1] == 12
    summary = local_run.summarise(records)
    assert summary.resumed, steps  # the restart replayed steps after the last checkpoint
    assert summary.last_loss < summary.first_loss
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No FSx: one directory plays the run's prefix in the bucket, at the same key path.
    (run_dir,) = run.glob("shared/checkpoints/dev-*")
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-10", "step-12"]


# --- the rehearsal of the job's topology -----------------------------------------------------


def _plan(
    config: StackConfig, name: str, tmp_path: Path, **kwargs: Any
) -> local_topology.LocalPlan:
    return local_topology.plan_local_run(
        plan_run(config),
        name,
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=10,
        context=32,
        batch_size=4,
        device="cpu",
        nproc=2,
        **kwargs,
    )


def _past_its_deadline() -> StackConfig:
    """The dev stack with a deadline its steps cannot meet. Built with model_copy, which skips
    validation, because every loader refuses it."""
    dev = load_stack_file("dev")
    return dev.model_copy(update={"job": dev.job.model_copy(update={"max_run_hours": 0.01})})


def test_a_multi_node_fsx_stack_is_rehearsed_as_agents_sharing_one_directory(
    tmp_path: Path,
) -> None:
    config = load_stack_file("llama31-8b-p5")
    plan = _plan(config, "llama31-8b-p5", tmp_path)
    # Four nodes scaled to two agents of one process each (two CPU cores).
    assert plan.cluster_nodes == 4 and plan.shared_storage
    assert [(a.index, a.nproc) for a in plan.agents] == [(0, 1), (1, 1)]
    # One directory plays FSx for both, at the job's own path below the mount.
    job = render_job(plan_run(config), image="img", pvc_name="claim")
    relative = Path(job.paths.run_dir).relative_to(job.paths.mount_path)
    for agent in plan.agents:
        assert agent.volume_dir == tmp_path / "llama31-8b-p5" / "shared"
        assert agent.run_dir == agent.volume_dir / relative
        parsed = parse_args(agent.args)
        assert parsed.checkpoint.checkpoint_dir == str(agent.run_dir)
        assert parsed.checkpoint.resume_from_checkpoint == str(agent.run_dir)
        assert local_topology.agent_command(plan, agent)[3:7] == [
            "--nnodes=2",
            "--nproc_per_node=1",
            "--max-restarts=0",
            "-m",
        ]
    assert without_port(plan.agents[0].args) == without_port(plan.agents[1].args)


def without_port(args: list[str]) -> list[str]:
    """An agent's trainer arguments less `--metrics_port`, the one flag that differs."""
    at = args.index("--metrics_port")
    return args[:at] + args[at + 2 :]


def test_each_agent_serves_the_trainers_metrics_on_its_own_port_and_says_where(
    tmp_path: Path,
) -> None:
    """Pods share a port on different addresses; agents share an address, so each gets a
    port of its own, and the labels the pod template gives (stack, node) come in env."""
    plan = _plan(load_stack_file("llama31-8b-p5"), "llama31-8b-p5", tmp_path)
    ports = [parse_args(agent.args).logging.metrics_port for agent in plan.agents]
    assert ports == [a.metrics_port for a in plan.agents] == [9450, 9451]
    envs = [local_topology.agent_env(plan, a, endpoint="127.0.0.1:1") for a in plan.agents]
    assert [(e["FSDP_EKS_STACK"], e["NODE_NAME"]) for e in envs] == [
        ("llama31-8b-p5", "local-node-0"),
        ("llama31-8b-p5", "local-node-1"),
    ]
    assert local_topology.metrics_line(plan) == (
        "Trainer metrics (Prometheus, every rank of a node on its port): "
        "http://127.0.0.1:9450/metrics (node 0), http://127.0.0.1:9451/metrics (node 1)"
    )


def test_agents_join_through_the_rendezvous_the_job_renders(tmp_path: Path) -> None:
    """What the operator makes of the job's elasticPolicy (training-operator v1.9.0
    `pkg/controller.v1/pytorch/elastic.go`: PET_RDZV_BACKEND, PET_RDZV_ID, PET_NNODES=min:max,
    PET_MAX_RESTARTS, PET_RDZV_CONF joined `k=v,k=v`) is what each local agent gets; torchrun
    reads them as its flags' defaults (torch `distributed/argparse_util.py` `env`)."""
    config = load_stack_file("llama31-8b-p5")
    plan = _plan(config, "llama31-8b-p5", tmp_path)
    policy = render_job(plan_run(config), image="img", pvc_name="claim").spec["elasticPolicy"]
    conf = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    assert "join_timeout=" in conf
    envs = [local_topology.agent_env(plan, a, endpoint="127.0.0.1:29400") for a in plan.agents]
    for index, (env, is_host) in enumerate(zip(envs, ("1", "0"), strict=True)):
        assert env == {
            "FSDP_EKS_STACK": "llama31-8b-p5",  # the metrics' labels (trainer.telemetry)
            "NODE_NAME": f"local-node-{index}",
            "PET_RDZV_ENDPOINT": "127.0.0.1:29400",
            "PET_RDZV_BACKEND": policy["rdzvBackend"],
            "PET_RDZV_ID": policy["rdzvId"],
            "PET_NNODES": "2:2",  # the job's min = max, for the local number of nodes
            "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
            # Worker 0 hosts the store: on the cluster because the endpoint is its hostname.
            "PET_RDZV_CONF": f"{conf},is_host={is_host}",
        }


def test_operator_env_follows_the_operators_generator() -> None:
    policy = {
        "rdzvBackend": "c10d",
        "rdzvId": "exp",
        "minReplicas": 2,
        "maxReplicas": 4,
        "rdzvConf": [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}],
    }
    assert local_topology.operator_env(policy, endpoint="exp-worker-0:23456") == {
        "PET_RDZV_ENDPOINT": "exp-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ID": "exp",
        "PET_NNODES": "2:4",
        "PET_RDZV_CONF": "a=1,b=2",
    }


def test_a_stack_without_fsx_is_rehearsed_with_one_directory_playing_its_s3_prefix(
    tmp_path: Path,
) -> None:
    """No FSx: the job keeps the run under its prefix in the stack's bucket, one store every
    pod reaches, so the rehearsal gives every agent the same directory, at the key path."""
    dev = _plan(load_stack_file("dev"), "dev", tmp_path)
    assert not dev.shared_storage
    (agent,) = dev.agents  # one node, as a single torchrun with both processes
    assert agent.nproc == 2 and agent.volume_dir == tmp_path / "dev" / "shared"
    run = run_id(plan_run(load_stack_file("dev")))
    assert agent.run_dir == agent.volume_dir / "checkpoints" / run
    assert "as the run's prefix in S3" in local_topology.describe_topology(dev)

    one = load_stack_file("dev")
    two_nodes = one.model_copy(update={"gpu_nodes": one.gpu_nodes.model_copy(update={"count": 2})})
    two = _plan(two_nodes, "dev2", tmp_path)
    assert [a.volume_dir for a in two.agents] == [tmp_path / "dev2" / "shared"] * 2
    assert without_port(two.agents[0].args) == without_port(two.agents[1].args)  # one dir


def test_the_rehearsal_runs_the_plans_checks_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(StackConfigError) as caught:
        _plan(_past_its_deadline(), "dev-late", tmp_path)
    assert any("job.maxRunHours" in problem for problem in caught.value.problems)
    assert not (tmp_path / "dev-late").exists()


def test_a_stack_the_plan_refuses_fails_locally_with_the_plans_message(
    tmp_path: Path,
) -> None:
    """llama32-1b-g5 with a deadline its steps cannot meet: the local run prints exactly what
    `fsdp-eks plan` prints for it, and starts nothing."""
    shipped = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.llama32-1b-g5.yaml").read_text())
    shipped["config"]["fsdp-eks:job"]["maxRunHours"] = 0.05
    stack_file = tmp_path / "Pulumi.g5-late.yaml"
    stack_file.write_text(yaml.safe_dump(shipped))

    planned = run_cli("plan", str(stack_file))
    local = run_cli("local", str(stack_file), "--out", str(tmp_path / "out"), "--quiet")
    assert planned.code == local.code == 2
    assert planned.err.removeprefix("fsdp-eks plan: ") == local.err.removeprefix("fsdp-eks local: ")
    assert "job.maxRunHours 0.05" in local.err
    assert not (tmp_path / "out" / "g5-late").exists()


def test_an_unknown_stack_is_one_line_naming_the_stacks(tmp_path: Path) -> None:
    assert_one_line_mistake(
        run_cli("local", "llama-typo", "--out", str(tmp_path)),
        "no stack 'llama-typo'",
        "stacks: dev, ",
    )


def test_out_never_removes_a_folder_local_did_not_make(tmp_path: Path) -> None:
    """`--out DIR` with a `DIR/dev` of the user's: refused in one line, nothing removed (the
    run would start afresh by removing `DIR/dev`)."""
    mine = tmp_path / "dev" / "thesis.tex"
    mine.parent.mkdir()
    mine.write_text("years of work")
    refused = run_cli("local", "dev", "--out", str(tmp_path), "--device", "cuda", "--quiet")
    assert_one_line_mistake(refused, f"{tmp_path / 'dev'} exists and was not made by")
    assert mine.read_text() == "years of work"


def test_a_run_folder_local_made_is_emptied_for_the_next_run(tmp_path: Path) -> None:
    made = local_run.fresh_run_root(tmp_path, "dev")
    (made / "metrics.jsonl").write_text("{}\n")
    again = local_run.fresh_run_root(tmp_path, "dev")
    assert again == made and sorted(p.name for p in made.iterdir()) == [local_run.RUN_MARKER]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / local_run.RUN_MARKER).write_text("")
    with pytest.raises(CliError, match="not made by"):  # never through a link
        local_run.fresh_run_root(tmp_path, "linked")
    assert (tmp_path / "elsewhere" / local_run.RUN_MARKER).exists()


@pytest.mark.slow
def test_two_agents_train_resume_and_checkpoint_into_one_shared_directory(
    tmp_path: Path,
) -> None:
    """llama2-7b-p4d (2 nodes, FSx) as two torchrun agents of one gloo process each, joined by
    c10d rendezvous: both ranks' state lands in the one shared directory, and the relaunch
    after the planned interruption resumes both agents from it."""
    result = run_cli(
        "local", "llama2-7b-p4d", "--steps", "10", "--context", "32", "--batch-size", "4",
        "--device", "cpu", "--quiet", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.code == 0, result
    run = tmp_path / "llama2-7b-p4d"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert local_run.summarise(records).resumed
    assert [r["step"] for r in records if r["kind"] == "train"][-1] == 10
    (latest,) = run.glob("shared/checkpoints/*/step-10")
    assert json.loads((latest / "COMPLETE").read_text())["world_size"] == 2
    assert sorted(p.name for p in (latest / "train_state").iterdir()) == [
        "rank-00000.pt",
        "rank-00001.pt",
    ]


@pytest.mark.parametrize(
    "path",
    sorted((REPO_ROOT / "stacks").glob("Pulumi.*.yaml")),
    ids=lambda path: path.stem.removeprefix("Pulumi."),
)
def test_every_stack_rehearses_locally_without_pulumi_or_its_secrets(
    path: Path, tmp_path: Path
) -> None:
    """Gated tokenizers (hfToken unset: a placeholder stands in), Hub datasets, FSx or S3:
    the local run trains on the generated corpus and tokenizer and needs none of them."""
    name = path.stem.removeprefix("Pulumi.")
    config = load_stack_file(path)
    plan = local_topology.plan_local_run(
        plan_run(config),
        name,
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=8,
        context=32,
        batch_size=2,
        device="cpu",
        nproc=2,
    )
    local = parse_args(plan.local_args)
    assert local.data.tokenizer == str(tmp_path / "assets" / "tokenizer")
    assert local.data.dataset == str(tmp_path / "assets" / "corpus")
    assert "HF_TOKEN" not in " ".join(plan.local_args)
