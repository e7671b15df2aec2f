"""The PyTorchJob: rendered from the config alone, valid for the operator, registered cleanly."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi.runtime.rpc import _special_secret_sig as SECRET_VALUE  # noqa: N812
from pulumi.runtime.rpc import _special_sig_key as SECRET_SIG  # noqa: N812

from infra.config import StackConfig, parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.job.flags import TRAINER_LAUNCHER, run_id, trainer_argv
from infra.job.manifest import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    TRAINER_USER_ID,
    container_env,
    kubectl_commands,
    render_job,
)
from infra.launch.training_job import JobNamespace, JobNamespaceArgs, TrainingJob, TrainingJobArgs
from infra.offline import evaluate
from tests.crd_schemas import validate as validate_against_schema
from trainer.config import parse_args

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:" + "a" * 64
KUBECONFIG = '{"apiVersion": "v1", "kind": "Config", "current-context": "c"}'
WATCH = "pulumi-python:dynamic/job:JobStartWatch"
FORBIDDEN = {
    "NCCL_SOCKET_IFNAME",
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_P2P_DISABLE",
    "CUDA_LAUNCH_BLOCKING",
}


def make_config(stack: str = "exp", **sections: dict[str, Any]) -> StackConfig:
    values: dict[str, Any] = {
        "gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
        "job": {"maxRunHours": 1},
        "cost": {"maxUsdPerRun": 10000},
        **sections,
        "training": {"maxSteps": 50, **sections.get("training", {})},
    }
    return parse_stack_config(values, stack_name=stack)


def worker(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["pytorchReplicaSpecs"]["Worker"]


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    containers = worker(manifest)["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pytorch"]
    return containers[0]


def test_p5_job_requests_every_gpu_and_efa_interface(crd_schema: dict[str, Any]) -> None:
    manifest = render_job(plan_run(make_config()), image=IMAGE, pvc_name="fsx-claim").as_dict()
    validate_against_schema(manifest, crd_schema)
    assert worker(manifest)["replicas"] == 4
    assert manifest["spec"]["nprocPerNode"] == "8"
    limits = container(manifest)["resources"]["limits"]
    assert limits[GPU_RESOURCE] == 8
    assert limits[EFA_RESOURCE] == 32
    requests = container(manifest)["resources"]["requests"]
    assert 160 <= int(requests["cpu"]) < 192
    assert requests["memory"] == limits["memory"]
    env = {e["name"]: e.get("value") for e in container(manifest)["env"]}
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env  # the trainer sets it (trainer.distributed)
    assert env["TRITON_CACHE_DIR"].startswith("/tmp/")
    assert not FORBIDDEN & set(env)


def test_job_without_efa_sets_no_efa_provider(crd_schema: dict[str, Any]) -> None:
    config = make_config(
        gpuNodes={"instanceType": "g5.12xlarge", "count": 2, "efa": False},
        model={"preset": "llama3.2-1b", "numLayers": 2},  # fits an A10G's 24 GiB
    )
    manifest = render_job(plan_run(config), image=IMAGE, pvc_name=None).as_dict()
    validate_against_schema(manifest, crd_schema)
    limits = container(manifest)["resources"]["limits"]
    assert limits[GPU_RESOURCE] == 4
    assert EFA_RESOURCE not in limits
    names = {e["name"] for e in container(manifest)["env"]}
    assert "FI_PROVIDER" not in names


def test_volumes_shm_memory_backed_and_checkpoints_on_the_claim() -> None:
    config = make_config()
    job = render_job(plan_run(config), image=IMAGE, pvc_name="fsx-claim")
    pod = worker(job.as_dict())["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    mounts = {m["name"]: m["mountPath"] for m in container(job.as_dict())["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "shared": "/fsx"}
    args = container(job.as_dict())["args"]
    checkpoint_dir = args[args.index("--checkpoint_dir") + 1]
    assert checkpoint_dir == f"/fsx/checkpoints/{run_id(plan_run(config))}"
    assert args[args.index("--resume_from_checkpoint") + 1] == checkpoint_dir


def test_run_directories_are_handed_to_the_trainer_uid_before_it_starts(
    crd_schema: dict[str, Any],
) -> None:
    config = make_config()
    manifest = render_job(plan_run(config), image=IMAGE, pvc_name="fsx-claim").as_dict()
    validate_against_schema(manifest, crd_schema)
    pod = worker(manifest)["template"]["spec"]
    [prepare] = pod["initContainers"]
    assert prepare["image"] == IMAGE
    assert prepare["securityContext"]["runAsUser"] == 0
    assert prepare["volumeMounts"] == [{"name": "shared", "mountPath": "/fsx"}]
    script = prepare["command"][-1]
    checkpoint_dir = f"/fsx/checkpoints/{run_id(plan_run(config))}"
    assert f"mkdir -p '{checkpoint_dir}'" in script
    assert f"chown {TRAINER_USER_ID}:{TRAINER_USER_ID} '{checkpoint_dir}'" in script
    # Only this run's directories change owner, never the shared mount itself.
    assert "'/fsx'" not in script and "-R" not in script
    # The trainer runs as the uid the directories were prepared for, whatever the image's
    # USER (an NGC or DLC base would otherwise run it as root).
    assert container(manifest)["securityContext"]["runAsUser"] == TRAINER_USER_ID


def test_workers_find_each_other_through_c10d_rendezvous(crd_schema: dict[str, Any]) -> None:
    """Without a Master replica the operator sets no MASTER_ADDR / node rank (v1.9): the
    elastic policy is what points torchrun at worker 0."""
    config = make_config(job={"maxRunHours": 1, "backoffLimit": 2})
    manifest = render_job(plan_run(config), image=IMAGE, pvc_name=None).as_dict()
    validate_against_schema(manifest, crd_schema)
    assert list(manifest["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert manifest["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvId": "exp",
        "minReplicas": 4,
        "maxReplicas": 4,
        "maxRestarts": 2,
        # torchrun's 600 s join / 60 s read defaults would restart early workers while a late
        # pod still pulls its image, spending runPolicy.backoffLimit before the first step.
        "rdzvConf": [
            {"key": "join_timeout", "value": "3600"},
            {"key": "read_timeout", "value": "3600"},
        ],
    }
    assert container(manifest)["ports"] == [
        {"name": "pytorchjob-port", "containerPort": 23456},
        {"name": "metrics", "containerPort": 9450},  # the trainer's Prometheus metrics
    ]


def test_run_policy_and_no_wait_annotation() -> None:
    config = make_config(job={"maxRunHours": 2, "ttlHoursAfterFinished": 1, "backoffLimit": 5})
    manifest = render_job(plan_run(config), image=IMAGE, pvc_name=None).as_dict()
    assert manifest["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 5,
        "activeDeadlineSeconds": 7200,
        "ttlSecondsAfterFinished": 3600,
    }
    # No `pulumi.com/waitFor`: it never fails early (a Failed job held `up` for its whole
    # timeout) and counted crash-looping workers as running; infra.launch.start_watch waits instead.
    assert "annotations" not in manifest["metadata"]


def test_rendered_command_parses_with_the_trainers_parser() -> None:
    config = make_config(
        model={"preset": "llama3.1-8b", "numLayers": 8},
        data={"datasetConfigName": None},
        training={
            "contextWidth": 8192,
            "globalBatchSize": 256,
            "shardingStrategy": "hybrid",
            "hsdpShardSize": 8,
            "exportModel": True,
            "extraArgs": {"metrics_file": "/tmp/m.jsonl"},
        },
    )
    job = render_job(plan_run(config), image=IMAGE, pvc_name="claim")
    command = container(job.as_dict())["command"] + container(job.as_dict())["args"]
    assert command[:7] == [*TRAINER_LAUNCHER, "--nnodes=4", "--nproc_per_node=8", "-m", "trainer"]
    parsed = parse_args(command[7:])
    assert parsed.model.preset_name == "llama3.1-8b"
    assert parsed.model.num_layers == 8
    assert parsed.model.max_context_width == 8192
    assert parsed.optim.gradient_accumulation_steps == 4  # 256 / (2 per GPU x 32 GPUs)
    assert parsed.parallel.sharding_strategy == "hybrid"
    assert parsed.parallel.hsdp_shard_size == 8
    assert parsed.checkpoint.export_dir == f"{job.paths.run_dir}/export"
    assert parsed.logging.metrics_file == "/tmp/m.jsonl"
    # null in the stack file reaches the trainer as "no dataset config" (not its default 'en')
    assert parsed.data.dataset_config_name is None


def test_run_id_changes_with_the_experiment_and_not_with_the_job_wrapper() -> None:
    base = make_config()
    assert run_id(plan_run(base)) == run_id(
        plan_run(make_config(job={"maxRunHours": 1, "backoffLimit": 9}))
    )
    assert run_id(plan_run(base)) != run_id(plan_run(make_config(training={"lr": 3e-4})))
    assert run_id(plan_run(make_config(job={"maxRunHours": 1, "runId": "keep"}))) == "keep"
    assert trainer_argv(
        plan_run(base), render_job(plan_run(base), image=IMAGE, pvc_name=None).paths
    )


def test_extra_env_is_added_and_hf_token_is_only_named_by_its_file_path() -> None:
    config = make_config(job={"maxRunHours": 1, "extraEnv": {"NCCL_DEBUG_SUBSYS": "NET"}})
    env = container_env(plan_run(config), hf_secret_name="exp-hf-token")
    by_name = {e["name"]: e for e in env}
    assert by_name["NCCL_DEBUG_SUBSYS"]["value"] == "NET"
    # The token stays in the Secret's file (tests/infra/test_hardening.py); env holds its path.
    assert "HF_TOKEN" not in by_name
    assert by_name["HF_TOKEN_PATH"]["value"] == "/var/run/secrets/huggingface/token"


def test_gpus_per_node_below_the_instance_scales_the_pod() -> None:
    config = make_config(job={"maxRunHours": 1, "gpusPerNode": 4})
    job = render_job(plan_run(config), image=IMAGE, pvc_name=None)
    assert job.spec["nprocPerNode"] == "4"
    assert job.size.gpus == 4
    assert job.size.efa_interfaces == 32
    full = render_job(plan_run(make_config()), image=IMAGE, pvc_name=None)
    assert job.size.cpus * 2 <= full.size.cpus + 1


def test_kubectl_commands_name_the_job() -> None:
    commands = kubectl_commands("exp", "training")
    assert commands["logs"] == "kubectl -n training logs -f exp-worker-0 -c pytorch"
    assert "training.kubeflow.org/job-name=exp" in commands["pods"]


def _job_program(config: StackConfig) -> None:
    provider = k8s.Provider("k8s", kubeconfig="{}")
    dependency = k8s.core.v1.ConfigMap(
        "operator-ready", opts=pulumi.ResourceOptions(provider=provider)
    )
    namespace = JobNamespace(
        "job-namespace", JobNamespaceArgs(config=config.job, k8s_provider=provider)
    )
    job = TrainingJob(
        "job",
        TrainingJobArgs(
            plan=plan_run(config),
            image_uri=IMAGE,
            k8s_provider=provider,
            kubeconfig=pulumi.Output.secret(KUBECONFIG),
            namespace=namespace.name,
            pvc_name="fsx-claim",
            depends_on=[dependency],
        ),
    )
    pulumi.export("jobName", job.job_name)
    pulumi.export("checkpointPath", job.checkpoint_path)


def test_component_registers_a_replace_safe_pytorchjob_with_its_secret() -> None:
    config = parse_stack_config(
        {
            "gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
            "job": {"maxRunHours": 1},
            "training": {"maxSteps": 50},
            "cost": {"maxUsdPerRun": 500},
            "hfToken": "hf_secret_value",
        },
        stack_name="llama",
        secret_keys=["hfToken"],
    )
    result = evaluate(lambda: _job_program(config), config={})
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert job.delete_before_replace
    assert job.replace_on_changes == ["spec"]
    assert job.provider.startswith(result.one("pulumi:providers:kubernetes").urn)
    assert result.depends_on(job, result.one("kubernetes:core/v1:ConfigMap"))
    assert job.inputs["metadata"]["name"] == "llama"
    assert job.inputs["metadata"]["namespace"] == "training"
    spec = job.inputs["spec"]
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "node.kubernetes.io/instance-type": config.gpu_nodes.instance_type
    }
    assert pod["containers"][0]["image"] == IMAGE
    secret = result.one("kubernetes:core/v1:Secret")
    assert secret.inputs["metadata"]["name"] == "llama-hf-token"
    assert result.depends_on(job, secret)  # no worker starts before its token exists
    assert result.one("kubernetes:core/v1:Namespace").inputs["metadata"]["name"] == "training"
    assert result.stack_outputs["jobName"] == "llama"
    assert result.stack_outputs["checkpointPath"].startswith("/fsx/checkpoints/llama-")


def test_existing_namespace_is_not_created() -> None:
    config = make_config(job={"maxRunHours": 1, "createNamespace": False, "namespace": "team-a"})
    result = evaluate(lambda: _job_program(config), config={})
    assert result.of_type("kubernetes:core/v1:Namespace") == []
    assert (
        result.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs["metadata"]["namespace"]
        == "team-a"
    )


def test_up_waits_for_the_workers_through_a_watch_created_after_the_job() -> None:
    """The PyTorchJob itself is not awaited (no waitFor); the JobStartWatch is, after it."""
    config = make_config(job={"maxRunHours": 1})
    result = evaluate(lambda: _job_program(config), config={})
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    watch = result.one(WATCH)
    assert job.urn in watch.dependencies
    assert watch.parent == result.one("fsdp-eks:job:TrainingJob").urn
    assert watch.inputs["namespace"] == "training"
    assert watch.inputs["job_name"] == "exp"
    assert watch.inputs["workers"] == 4
    assert watch.inputs["start_timeout_seconds"] == 3600  # job.startTimeoutMinutes' default
    # The same kubeconfig as the Kubernetes provider, kept secret in the state.
    kubeconfig = watch.inputs["kubeconfig"]
    assert kubeconfig[SECRET_SIG] == SECRET_VALUE and kubeconfig["value"] == KUBECONFIG
    assert "annotations" not in job.inputs["metadata"]


@pytest.mark.parametrize(("minutes", "timeout"), [(60, "61m"), (15, "16m"), (240, "241m")])
def test_the_engine_waits_for_the_watch_as_long_as_the_watch_waits(
    minutes: int, timeout: str
) -> None:
    """The engine's create timeout on the watch (`CustomTimeouts`) must not cut the watch's
    own wait short: the start budget plus the stable minute (`job_watch.wait_limit_seconds`)."""
    from infra.launch.training_job import create_timeout

    assert create_timeout(minutes * 60) == timeout


def test_a_stop_signal_leaves_time_for_the_step_and_a_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kubernetes kills the container `terminationGracePeriodSeconds` after SIGTERM (30 s by
    default), torchrun its workers after its shutdown timeout: both must cover the step in
    flight and a whole save, the agent's inside the pod's."""
    from torch.distributed.launcher.api import LaunchConfig

    config = make_config(model={"preset": "llama3.1-8b"}, training={"maxSteps": 100})
    plan = plan_run(config)
    manifest = render_job(plan, image=IMAGE, pvc_name="fsx-claim").as_dict()
    grace = worker(manifest)["template"]["spec"]["terminationGracePeriodSeconds"]
    env = {e["name"]: e.get("value") for e in container(manifest)["env"]}
    assert plan.duration is not None
    step_s = plan.duration.training_hours_at(plan.duration.mfu.low) * 3600 / 100
    timeouts = plan.timeouts
    assert timeouts.shutdown_grace_seconds >= step_s + timeouts.checkpoint_seconds
    # torch reads the variable itself when torchrun gives no --shutdown-timeout.
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1)
    assert launch.shutdown_timeout == timeouts.shutdown_grace_seconds
    assert launch.shutdown_timeout < grace
    assert "--shutdown-timeout" not in " ".join(container(manifest)["args"])


def test_the_watchdog_floor_covers_a_save_and_the_recorder_dumps_beside_the_checkpoints() -> None:
    config = make_config(model={"preset": "llama3.1-8b"}, training={"maxSteps": 100})
    plan = plan_run(config)
    manifest = render_job(plan, image=IMAGE, pvc_name="fsx-claim").as_dict()
    parsed = parse_args(container(manifest)["args"][4:])
    assert parsed.safety.watchdog_floor_s >= 2 * plan.timeouts.shutdown_grace_seconds
    env = {e["name"]: e.get("value") for e in container(manifest)["env"]}
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(f"{parsed.checkpoint.checkpoint_dir}/")


def test_each_pod_checks_it_got_the_planned_node_before_step_1() -> None:
    manifest = render_job(plan_run(make_config()), image=IMAGE, pvc_name="fsx-claim").as_dict()
    safety = parse_args(container(manifest)["args"][4:]).safety
    assert (safety.preflight, safety.expect_gpu, safety.expect_gpu_memory_gib) == (
        "enforce",
        "H100",
        80,
    )
    assert safety.expect_efa_devices == 32 and safety.allreduce_floor_gbps == 100.0
    env = {e["name"]: e for e in container(manifest)["env"]}
    assert env["NCCL_NET"]["value"] == "AWS Libfabric"  # the EFA plugin or an error
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}

    no_efa = make_config(gpuNodes={"instanceType": "p5.48xlarge", "count": 4, "efa": False})
    manifest = render_job(plan_run(no_efa), image=IMAGE, pvc_name="fsx-claim").as_dict()
    assert parse_args(container(manifest)["args"][4:]).safety.expect_efa_devices == 0
    assert "NCCL_NET" not in {e["name"] for e in container(manifest)["env"]}


def test_the_pod_declares_the_metrics_port_the_trainer_serves_and_its_labels() -> None:
    """The named port is the one `--metrics_port` serves on (its default, as the flag is not
    rendered, or what extraArgs sets); the env gives the `stack` and `node` labels, and the
    run directory's name the `run` label (trainer.telemetry.RunLabels)."""
    from trainer.telemetry import RunLabels

    manifest = render_job(plan_run(make_config()), image=IMAGE, pvc_name="fsx-claim").as_dict()
    served = parse_args(container(manifest)["args"][4:])
    ports = {p["name"]: p["containerPort"] for p in container(manifest)["ports"]}
    assert ports["metrics"] == served.logging.metrics_port
    env = {e["name"]: e.get("value") for e in container(manifest)["env"]}
    pod_env = {"FSDP_EKS_STACK": env["FSDP_EKS_STACK"], "NODE_NAME": "ip-10-0-1-1"}
    labels = RunLabels.of_process(
        rank=3, checkpoint_dir=served.checkpoint.checkpoint_dir, env=pod_env
    )
    assert labels.values() == ("exp", manifest["metadata"]["labels"]["fsdp-eks/run-id"],
                               "ip-10-0-1-1", "3")  # fmt: skip

    moved = make_config(training={"extraArgs": {"metrics_port": 9500}})
    manifest = render_job(plan_run(moved), image=IMAGE, pvc_name="fsx-claim").as_dict()
    assert {"name": "metrics", "containerPort": 9500} in container(manifest)["ports"]
    off = make_config(training={"extraArgs": {"metrics_port": 0}})
    manifest = render_job(plan_run(off), image=IMAGE, pvc_name="fsx-claim").as_dict()
    assert [p["name"] for p in container(manifest)["ports"]] == ["pytorchjob-port"]
