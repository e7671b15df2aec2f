"""Whole-stack checks on what the stack renders: one failing and one passing stack each, the
shipped stacks, and the program refusing before any resource is registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.config import StackConfigError, load_stack_file, parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.job.stack_checks import check_run, checked_run_plan, semantic_problems
from infra.offline import evaluate
from infra.program import main as program

STACKS = sorted(
    path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    for path in (Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml")
)
BASE: dict[str, Any] = {
    "gpuNodes": {"instanceType": "p5.48xlarge", "count": 2},
    "job": {"maxRunHours": 1},
    "training": {"maxSteps": 20},
    # The stack's own file system, sized so that a checkpoint is no deadline's business.
    "storage": {"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}},
    "cost": {"maxUsdPerRun": 1000},
}
EXISTING = {"mode": "existing", "name": "team"}
"""A shared cluster, where the job mounts the team's claim."""
TEAM_CLAIM = {"fsx": {"existingClaimName": "shared"}}


def problems(**sections: Any) -> list[str]:
    values = {**BASE, **{k: {**BASE.get(k, {}), **v} for k, v in sections.items()}}
    return semantic_problems(plan_run(parse_stack_config(values, stack_name="exp")))


def test_a_base_stack_and_every_shipped_stack_pass() -> None:
    assert problems() == []
    for name in STACKS:
        assert semantic_problems(plan_run(load_stack_file(name))) == [], name


def test_an_extra_arg_the_trainer_refuses_names_the_key() -> None:
    [problem] = problems(training={"extraArgs": {"loss_spike_factor": 0.5}})
    assert problem.startswith("training.extraArgs.loss_spike_factor 0.5: the trainer refuses it")
    assert "--loss_spike_factor must be 0 (off) or > 1" in problem
    with pytest.raises(
        StackConfigError,
        match=(
            r"training.extraArgs.watchdog_factor 'often' is no value --watchdog_factor takes; "
            "allowed: a number$"
        ),
    ):
        problems(training={"extraArgs": {"watchdog_factor": "often"}})
    assert problems(training={"extraArgs": {"loss_spike_factor": 4}}) == []


def test_extra_env_may_not_replace_what_the_stack_sets() -> None:
    [problem] = problems(job={"extraEnv": {"NCCL_NET": "Socket"}})
    assert problem.startswith(
        "job.extraEnv.NCCL_NET 'Socket' would replace the 'AWS Libfabric' the stack sets"
    )
    [timeout] = problems(job={"extraEnv": {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30"}})
    assert "job.extraEnv.TORCH_ELASTIC_SHUTDOWN_TIMEOUT '30' would replace" in timeout
    assert problems(job={"extraEnv": {"NCCL_DEBUG_SUBSYS": "NET"}}) == []


def test_a_run_in_s3_keeps_its_bucket_region_and_prefix() -> None:
    """No FSx: the pods' `$(CHECKPOINT_BUCKET)` and AWS_REGION are the stack's, and the trainer
    may write to S3 only under the run's own prefix (all its Pod Identity role reaches)."""
    no_fsx = {"storage": {"fsx": {"enabled": False}}}
    [bucket] = problems(job={"extraEnv": {"CHECKPOINT_BUCKET": "other"}}, **no_fsx)
    assert "job.extraEnv.CHECKPOINT_BUCKET 'other' would replace" in bucket
    [region] = problems(job={"extraEnv": {"AWS_REGION": "eu-west-1"}}, **no_fsx)
    assert "job.extraEnv.AWS_REGION 'eu-west-1' would replace" in region
    assert problems(job={"extraEnv": {"AWS_REGION": "eu-west-1"}}) == []  # FSx: not rendered
    [elsewhere] = problems(
        training={"extraArgs": {"metrics_file": "s3://another-bucket/m.jsonl"}}, **no_fsx
    )
    assert elsewhere.startswith(
        "training.extraArgs.metrics_file 's3://another-bucket/m.jsonl': the job's pods may not "
        "write there; allowed: a path under s3://$(CHECKPOINT_BUCKET)/checkpoints/exp-"
    )
    inside = "s3://$(CHECKPOINT_BUCKET)/checkpoints/"
    [with_fsx] = problems(training={"extraArgs": {"metrics_file": f"{inside}x/m.jsonl"}})
    assert with_fsx.endswith("allowed: a path on the FSx mount")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HF_TOKEN", "anything"),
        ("WANDB_API_KEY", "0123"),
        ("MY_SETTING", "hf_" + "a" * 34),
        ("S3_KEY_ID", "AKIA" + "A" * 16),
    ],
)
def test_extra_env_may_not_carry_a_credential_in_plain_text(name: str, value: str) -> None:
    [problem] = problems(job={"extraEnv": {name: value}})
    assert problem.startswith(f"job.extraEnv.{name} looks like a credential in plain text")
    assert value not in problem  # the message does not repeat the secret


def test_a_created_cluster_gets_every_add_on_the_job_needs() -> None:
    [problem] = problems(addons={"trainingOperator": {"install": False}})
    assert problem.startswith("addons.trainingOperator.install (nothing would run the PyTorchJob)")
    assert len(problems(addons={"efaDevicePlugin": {"install": False}})) == 1
    assert (
        problems(
            cluster=EXISTING, storage=TEAM_CLAIM, addons={"trainingOperator": {"install": False}}
        )
        == []
    )


@pytest.mark.parametrize("namespace", ["kube-system", "kubeflow"])
def test_the_job_namespace_is_neither_the_systems_nor_the_operators(namespace: str) -> None:
    [problem] = problems(job={"namespace": namespace})
    assert problem.startswith(f"job.namespace {namespace!r} is")
    assert problems(job={"namespace": "team-a"}) == []


def test_the_program_refuses_before_registering_anything() -> None:
    values = {f"fsdp-eks:{k}": v for k, v in BASE.items()}
    values["fsdp-eks:job"] = {"maxRunHours": 1, "extraEnv": {"HF_TOKEN": "hf_x"}}
    # The root `__main__.py` turns this error into the engine's one-line RunError.
    with pytest.raises(StackConfigError) as error:
        evaluate(program, config=values, stack="exp")
    # One problem is one line: the source, then the problem.
    assert str(error.value).startswith("stack 'exp': job.extraEnv.HF_TOKEN looks like a credential")
    assert "\n" not in str(error.value)


def test_require_semantics_is_the_stack_is_invalid_error() -> None:
    config = parse_stack_config({**BASE, "job": {"maxRunHours": 1, "namespace": "kube-public"}},
                                stack_name="exp")  # fmt: skip
    with pytest.raises(StackConfigError, match=r"^exp: job.namespace"):
        check_run(config, source="exp")


def test_a_vocabulary_smaller_than_the_known_tokenizer_is_refused() -> None:
    llama2 = {"preset": "llama2-7b"}
    values = {
        **BASE,
        "model": llama2,
        "data": {"tokenizer": "meta-llama/Llama-3.1-8B"},
        "hfToken": "hf_placeholder",  # the tokenizer is gated
    }
    config = parse_stack_config(values, stack_name="exp", secret_keys=["hfToken"])
    [problem] = semantic_problems(plan_run(config))
    assert problem.startswith("model.vocabSize 32000 (of preset 'llama2-7b' or the stack)")
    assert "which has 128256 tokens" in problem
    matching = {**values, "data": {"tokenizer": "meta-llama/Llama-2-7b-hf"}}
    config = parse_stack_config(matching, stack_name="exp", secret_keys=["hfToken"])
    assert semantic_problems(plan_run(config)) == []
    assert problems(model=llama2, data={"tokenizer": "/fsx/models/own-tokenizer"}) == []


@pytest.mark.parametrize(
    ("sections", "start"),
    [
        ({"data": {"dataset": "/data/c4"}}, "data.dataset '/data/c4' is not on any volume"),
        ({"data": {"dataset": "corpora/c4/en"}}, "data.dataset 'corpora/c4/en' is not on any"),
        ({"data": {"tokenizer": "s3://bucket/tok"}}, "data.tokenizer 's3://bucket/tok' is a URI"),
        ({"model": {"initFrom": "/opt/weights"}}, "model.initFrom '/opt/weights' is not on any"),
        (
            {"training": {"extraArgs": {"metrics_file": "/tmp/metrics.jsonl"}}},
            "training.extraArgs.metrics_file '/tmp/metrics.jsonl': --metrics_file would write "
            "outside every writable volume",
        ),
    ],
)
def test_what_the_trainer_reads_or_writes_lies_on_a_mounted_volume(
    sections: dict[str, Any], start: str
) -> None:
    [problem] = problems(**sections)
    assert problem.startswith(start)
    assert "allowed: " in problem and "/fsx" in problem


def test_paths_on_the_claim_hub_ids_and_the_rendered_run_dirs_pass() -> None:
    assert problems(data={"dataset": "allenai/c4", "tokenizer": "/fsx/tok"}) == []
    assert problems(model={"initFrom": "/fsx/models/llama"}) == []
    assert problems(training={"extraArgs": {"metrics_file": "/fsx/metrics.jsonl"}}) == []


def test_an_input_on_a_pod_local_volume_is_empty_when_the_pod_starts() -> None:
    single = {"gpuNodes": {"count": 1}, "storage": {"fsx": {"enabled": False}}}
    [problem] = problems(**single, data={"dataset": "/scratch/c4"})
    assert problem.startswith("data.dataset '/scratch/c4' lies on /scratch (a emptyDir volume)")
    assert "storage.fsx.enabled true" in problem
    # The checkpoints themselves may live there: one node keeps them across container restarts.
    assert problems(**single) == []


@pytest.mark.parametrize(
    ("mount", "hidden"),
    [
        ("/opt/fsdp-eks", "/opt/fsdp-eks"),  # the Dockerfile's WORKDIR: the trainer code
        ("/opt", "/opt/amazon"),  # EFA, from the Dockerfile
        ("/usr/local", "/usr"),
        ("/tmp", "/tmp/hf-home"),
    ],
)
def test_no_mount_hides_the_images_code_libraries_or_caches(mount: str, hidden: str) -> None:
    [problem] = problems(storage={"fsx": {"mountPath": mount}})
    assert problem.startswith(f"storage.fsx.mountPath {mount!r} would hide ")
    assert hidden in problem and "allowed: a directory of its own" in problem
    fine = {"fsx": {"mountPath": "/mnt/fsx"}}
    assert problems(storage=fine, data={"dataset": "/mnt/fsx/c4"}) == []


def test_the_default_namespace_is_refused_only_when_the_stack_would_create_it() -> None:
    [problem] = problems(job={"namespace": "default"})
    assert problem.startswith("job.namespace 'default' with job.createNamespace true")
    assert problems(cluster=EXISTING, storage=TEAM_CLAIM, job={"namespace": "default"}) == []


# --- what extraArgs, initFrom and the tokenizer may not contradict -------------------------


def test_extra_args_may_not_change_the_model_the_plan_estimates() -> None:
    """`--model_type` and the MoE/rope flags change what the trainer builds
    (trainer.config `ModelConfig.shape`); the memory, time and cost are the preset's."""
    [problem] = problems(training={"extraArgs": {"model_type": "mixtral"}})
    assert problem.startswith("training.extraArgs.model_type would make the trainer build")
    assert "model_type 'llama' -> 'mixtral'" in problem and "num_local_experts 0 -> 8" in problem
    assert "allowed: model.preset" in problem
    [tied] = problems(training={"extraArgs": {"tie_word_embeddings": True}})
    assert tied.startswith("training.extraArgs.tie_word_embeddings would make the trainer")
    assert "tie_word_embeddings False -> True" in tied
    # The preset's own value changes nothing.
    assert problems(training={"extraArgs": {"rope_theta": 500000.0}}) == []


def test_extra_args_may_not_move_the_run_off_the_gpus_it_pays_for() -> None:
    [problem] = problems(training={"extraArgs": {"device": "cpu"}})
    assert problem.startswith("training.extraArgs.device 'cpu' would train on the CPUs of the")
    assert problems(training={"extraArgs": {"device": "cuda"}}) == []


GATED = {"hfToken": "hf_placeholder"}


def gated_problems(**sections: Any) -> list[str]:
    """`problems` for a stack that names gated Hub repositories (with its token)."""
    values = {**BASE, **GATED, **{k: {**BASE.get(k, {}), **v} for k, v in sections.items()}}
    config = parse_stack_config(values, stack_name="exp", secret_keys=["hfToken"])
    return semantic_problems(plan_run(config))


def test_weights_of_another_architecture_than_the_preset_are_refused() -> None:
    [problem] = gated_problems(
        model={"preset": "llama3.2-1b", "initFrom": "meta-llama/Llama-3.1-8B-Instruct"}
    )
    assert problem.startswith(
        "model.initFrom 'meta-llama/Llama-3.1-8B-Instruct' is a llama3.1-8b (its config.json), "
        "but model.preset is 'llama3.2-1b'"
    )
    assert (
        gated_problems(
            model={"preset": "llama3.1-8b", "initFrom": "meta-llama/Llama-3.1-8B-Instruct"}
        )
        == []
    )


def test_shape_keys_beside_weights_are_refused() -> None:
    """The trainer ignores every shape flag with `--init_from` (trainer.train)."""
    [problem] = gated_problems(
        model={"preset": "llama3.1-8b", "initFrom": "meta-llama/Llama-3.1-8B", "numLayers": 4}
    )
    assert problem.startswith("model.numLayers with model.initFrom 'meta-llama/Llama-3.1-8B'")


@pytest.mark.parametrize(
    ("model", "tokenizer", "start", "size"),
    [
        # Mistral 7B v0.3 extended the vocabulary to 32,768; the mistral-7b preset is v0.1's.
        ({"preset": "mistral-7b"}, "mistralai/Mistral-7B-Instruct-v0.3", "model.vocabSize 32000",
         32768),
        # An Instruct variant has its base's tokenizer.
        ({"preset": "llama2-7b"}, "meta-llama/Llama-3.2-3B-Instruct", "model.vocabSize 32000",
         128256),
        # With weights, their vocabulary counts, not the preset's.
        ({"preset": "llama2-7b", "initFrom": "meta-llama/Llama-2-7b-hf"}, "meta-llama/Llama-3.2-1B",
         "model.initFrom 'meta-llama/Llama-2-7b-hf' has a vocabulary of 32000", 128256),
    ],
)  # fmt: skip
def test_a_tokenizer_with_more_ids_than_the_model_is_refused(
    model: dict[str, Any], tokenizer: str, start: str, size: int
) -> None:
    [problem] = gated_problems(model=model, data={"tokenizer": tokenizer})
    assert problem.startswith(start), problem
    assert f"which has {size} tokens" in problem


def test_every_problem_of_a_stack_is_listed_at_once() -> None:
    """A rule between sections, a deadline the run outlasts, a memory overrun, a namespace of
    the system's and a device the stack does not pay for: five problems, one error."""
    values = {
        **BASE,
        "job": {"maxRunHours": 1, "namespace": "kube-system", "shmSizeGiB": 1500},
        "model": {"preset": "llama3.1-70b"},
        "training": {
            "maxSteps": 5000,
            "microBatchSize": 8,
            "shardingStrategy": "hybrid",
            "extraArgs": {"device": "cpu"},
        },
    }
    with pytest.raises(StackConfigError) as raised:
        checked_run_plan(values, stack_name="exp")
    listed = raised.value.problems
    for start in (
        "job.shmSizeGiB 1500 leaves too little",
        "the run needs ~",
        "job.maxRunHours 1 is shorter than the run",
        "job.namespace 'kube-system' is Kubernetes' own",
        "training.extraArgs.device 'cpu'",
    ):
        assert any(problem.startswith(start) for problem in listed), (start, listed)
