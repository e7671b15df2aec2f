"""Whole-stack checks that need what the stack renders, not only what it says.

Each finds before anything is created a mistake that would surface only once nodes are up
(refused trainer flags, clobbering or secret env vars, missing add-ons, reserved namespaces,
unmounted paths, shadowing volumes). `check_run` lists them with the run plan's problems.
The full list and why: docs/design/job.md#stack_checks
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import posixpath
import re
from collections.abc import Collection, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.config import StackConfigError, read_stack_file
from infra.config.files import display_path
from infra.config.parse import validate_stack_config
from infra.config.stack import figures_possible
from infra.config.trainer_keys import stack_key_of, stack_value
from infra.estimates.run_plan import RunPlan, plan_run
from infra.facts.hub_models import HUB_MODELS
from infra.job.flags import RunPaths, trainer_argv
from infra.job.grafana import grafana_problems
from infra.job.manifest import (
    CONTAINER_NAME,
    HF_HOME,
    TRITON_CACHE_DIR,
    JobManifest,
    S3Bucket,
    container_env,
    render_job,
    s3_env,
)
from infra.job.staging_fit import staging_problems
from trainer.config import DEFAULT_TOKENIZER, flag_table, parse_args, shape_flag_names
from trainer.presets import get_preset

if TYPE_CHECKING:
    from infra.config import StackConfig

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
"""Kubernetes' own namespaces (the API server creates them); a job there shares RBAC and
quotas with the control plane's add-ons."""

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY)")
SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{30,}|(AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|sk-[A-Za-z0-9]{20,})$"
)
"""Hugging Face tokens, AWS access key ids, GitHub tokens, OpenAI-style keys."""
_ARGPARSE_FLAG = re.compile(r"--(\w+)")


def flag_origin(flag: str, config: StackConfig) -> str | None:
    """The stack key a rendered trainer flag comes from: its `training.extraArgs` entry, else
    its own key in the table of flags (`trainer.config.flag_table`)."""
    if flag in config.training.extra_args:
        return f"training.extraArgs.{flag}"
    return stack_key_of(flag)


def _refusal(message: str, plan: RunPlan) -> str:
    """The trainer's refusal of the rendered flags, as one line under the stack key of the
    first flag it names (`--flag` mentions of keyed flags are followed by their key)."""
    config = plan.config
    named = list(dict.fromkeys(_ARGPARSE_FLAG.findall(message)))
    origins = {flag: key for flag in named if (key := flag_origin(flag, config)) is not None}
    keys = list(origins)
    others = "; ".join(f"--{flag} is {origins[flag]}" for flag in keys[1:])
    explained = f"{message} ({others})" if others else message
    if not keys:
        return f"the job's trainer flags: the trainer refuses them: {explained}"
    flag, key = keys[0], origins[keys[0]]
    extra = config.training.extra_args
    value = extra[flag] if flag in extra else stack_value(config, key)
    return f"{key} {value!r}: the trainer refuses it: {explained}"


def trainer_problems(plan: RunPlan) -> list[str]:
    """The job's whole trainer argv (paths included) through the trainer's own parser and its
    own consistency checks (what every worker does at start), each refusal under the stack key
    it came from; then what extraArgs contradict of the stack: the model (shape flags that no
    stack key renders) and the device (`cpu` on the GPU nodes the stack pays for).

    argparse reports a bad value by printing to stderr and raising SystemExit(2) (Python's
    `argparse.ArgumentParser.error`); stderr is captured, so nothing is printed and nothing
    exits."""
    config = plan.config
    extra = config.training.extra_args
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = parse_args(_rendered_argv(plan))
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
        return [_refusal(message, plan)]
    problems = []
    shaping = [flag for flag in shape_flag_names() if flag in extra]
    if shaping and config.model.init_from is None:
        built, planned = parsed.model.shape(), config.model_shape()
        changed = [
            f"{field.name} {getattr(planned, field.name)!r} -> {getattr(built, field.name)!r}"
            for field in dataclasses.fields(planned)
            if field.name != "max_position_embeddings"  # the trainer stretches it to the context
            and getattr(built, field.name) != getattr(planned, field.name)
        ]
        if changed:
            keys = ", ".join(f"training.extraArgs.{flag}" for flag in shaping)
            problems.append(
                f"{keys} would make the trainer build another model than model.preset "
                f"{config.model.preset!r} that every estimate plans for ({'; '.join(changed)}); "
                "allowed: model.preset (and the model.* shape keys) to choose the model"
            )
    if parsed.parallel.device == "cpu":
        problems.append(
            f"training.extraArgs.device 'cpu' would train on the CPUs of the "
            f"{config.gpu_nodes.instance_type} nodes the stack pays for, their GPUs idle; "
            "allowed: auto (the default) or cuda"
        )
    return problems


def extra_env_problems(plan: RunPlan) -> list[str]:
    """`job.extraEnv` may add variables, not replace the stack's nor carry credentials."""
    config = plan.config
    extra = config.job.extra_env
    if not extra:
        return []
    bare = config.model_copy(update={"job": config.job.model_copy(update={"extra_env": {}})})
    bare_plan = dataclasses.replace(plan, config=bare)
    rendered = {e["name"]: e["value"] for e in container_env(bare_plan, hf_secret_name="x")}
    if not config.storage.fsx.enabled:  # the run in S3: its bucket and region (s3_env)
        placeholder = S3Bucket(name="<the stack's bucket>", region="<aws:region>")
        rendered.update({e["name"]: e["value"] for e in s3_env(placeholder)})
    problems = []
    for name, value in extra.items():
        if name in rendered:
            problems.append(
                f"job.extraEnv.{name} {value!r} would replace the {rendered[name]!r} the stack "
                f"sets; allowed: variables the stack does not set (it sets "
                f"{', '.join(sorted(rendered))}); change the stack key that controls it instead"
            )
        elif SECRET_NAME.search(name.upper()) or SECRET_VALUE.match(value):
            problems.append(
                f"job.extraEnv.{name} looks like a credential in plain text (it would sit in "
                "the stack file, the Pulumi state and the pod spec); allowed: the HF token as "
                "the Pulumi secret hfToken (`pulumi config set --secret hfToken ...`), other "
                "credentials from a Kubernetes Secret or the pod's IAM role"
            )
    return problems


def addon_problems(config: StackConfig) -> list[str]:
    """A cluster the stack creates has nothing it does not install: without the device
    plugins no node advertises GPUs or EFA, without the operator no PyTorchJob runs."""
    if config.cluster.mode != "create":
        return []
    addons = config.addons
    missing = []
    if not addons.nvidia_device_plugin.install:
        missing.append("addons.nvidiaDevicePlugin.install (no node would offer nvidia.com/gpu)")
    if config.gpu_nodes.efa_enabled and not addons.efa_device_plugin.install:
        missing.append(
            "addons.efaDevicePlugin.install (the EFA interfaces would stay unused: NCCL over TCP)"
        )
    if not addons.training_operator.install:
        missing.append("addons.trainingOperator.install (nothing would run the PyTorchJob)")
    return [
        f"{key} is false on a cluster the stack creates, which has nothing it does not "
        "install; allowed: true (false is for an existing cluster that runs it already)"
        for key in missing
    ]


def namespace_problems(config: StackConfig) -> list[str]:
    """The job's namespace is its own: not one of Kubernetes', not the operator's, and not
    `default` when the stack would create (and on destroy delete) it: it exists on every
    cluster, so creating it fails, and the NamespaceLifecycle admission plugin refuses to
    delete it (Kubernetes docs, Admission Controllers: NamespaceLifecycle)."""
    namespace = config.job.namespace
    if namespace == "default" and config.job.create_namespace:
        return [
            "job.namespace 'default' with job.createNamespace true: every cluster has it, so "
            "the stack cannot create it; allowed: a namespace of the job's own (the default "
            "'training'), or job.createNamespace false to run in the existing 'default'"
        ]
    if namespace in SYSTEM_NAMESPACES:
        return [
            f"job.namespace {namespace!r} is Kubernetes' own; allowed: a namespace for "
            "training jobs (the default 'training', or your team's)"
        ]
    operator = config.addons.training_operator
    if operator.install and namespace == operator.namespace:
        return [
            f"job.namespace {namespace!r} is the training operator's "
            "(addons.trainingOperator.namespace): the stack's network policies and a "
            "`pulumi destroy` of either would reach the other; allowed: any other namespace"
        ]
    return []


def vocabulary_problems(config: StackConfig) -> list[str]:
    """A model whose embedding has fewer rows than the tokenizer has tokens fails at start on
    every worker (`--tokenizer ... has N tokens but the model's vocab_size is M`). The model's
    vocabulary is the stack's, or with `model.initFrom` its weights' (`infra.job.hub_models`);
    the tokenizer is `data.tokenizer`, else the weights', else the trainer's default."""
    init_from = config.model.init_from
    tokenizer = config.data.tokenizer or init_from or DEFAULT_TOKENIZER
    known = HUB_MODELS.get(tokenizer)
    if known is None:
        return []
    size = known.tokenizer_size
    if init_from is None:
        vocab = config.model_shape().vocab_size
        owner = f"model.vocabSize {vocab} (of preset {config.model.preset!r} or the stack)"
        allowed = f"a vocabulary of at least {size} (model.vocabSize)"
    else:
        weights = HUB_MODELS.get(init_from)
        if weights is None or weights.preset is None:
            return []
        vocab = get_preset(weights.preset).vocab_size
        owner = f"model.initFrom {init_from!r} has a vocabulary of {vocab}, which"
        allowed = "the weights' own tokenizer (leave data.tokenizer unset)"
    if vocab >= size:
        return []
    return [
        f"{owner} is smaller than data.tokenizer {tokenizer!r}, which has {size} tokens; "
        f"allowed: {allowed}, or a tokenizer of the model's own family"
    ]


def init_from_problems(config: StackConfig) -> list[str]:
    """Weights decide the model the trainer builds: it reads their `config.json` and ignores
    every shape flag (`trainer.train`, `--init_from`), while every estimate of the plan is the
    preset's. Refused: shape overrides beside `model.initFrom`, and weights whose published
    architecture is another preset's. Weights the plan cannot read (a path on the volume, an
    unknown id) get a warning in the plan instead (`init_from_warnings`)."""
    model = config.model
    if model.init_from is None:
        return []
    problems = []
    overridden = [
        row.stack_key
        for row in flag_table()
        if row.shape
        and row.stack_key
        and row.stack_key != "model.preset"
        and stack_value(config, row.stack_key) is not None
    ]
    if overridden:
        problems.append(
            f"{', '.join(overridden)} with model.initFrom {model.init_from!r}: the trainer takes "
            "the architecture from the weights' config.json and ignores them, while the plan's "
            "estimates would use them; allowed: either model.initFrom or the shape keys"
        )
    known = HUB_MODELS.get(model.init_from)
    if known is not None and known.preset is not None and known.preset != model.preset:
        problems.append(
            f"model.initFrom {model.init_from!r} is a {known.preset} (its config.json), but "
            f"model.preset is {model.preset!r}: the trainer would build the weights' model while "
            "every estimate (memory, time, cost) is the preset's; allowed: model.preset: "
            f"{known.preset}, or weights of the preset's architecture"
        )
    return problems


DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile"
"""The trainer image's recipe: its last WORKDIR is where the image keeps the trainer code
(and what a relative path in a flag resolves against)."""

BASE_LIBRARY_DIRS = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/etc", "/var/lib",
    "/opt/conda", "/opt/nvidia",
)  # fmt: skip
"""Where a CUDA PyTorch base keeps its programs and libraries: the Filesystem Hierarchy
Standard's directories (FHS 3.0, sections 3 and 4), AWS Deep Learning Containers' Python
(/opt/conda) and NGC's entrypoint and tools (/opt/nvidia). The /opt directories the project's
own Dockerfile installs into (EFA, its NCCL plugin, the code) are read from the Dockerfile."""

LOCAL_CACHE_DIRS = (TRITON_CACHE_DIR, HF_HOME)
"""Caches the job keeps on the container's own disk on purpose (see job_manifest): a mount
over them puts every rank's cache writes back on the shared file system."""

INPUT_FLAGS = {
    "init_from": "model.initFrom",
    "dataset": "data.dataset",
    "tokenizer": "data.tokenizer",
}
"""Trainer flags that name something to read, and the stack key each is rendered from."""

OUTPUT_FLAGS = ("checkpoint_dir", "resume_from_checkpoint", "export_dir", "tensorboard_dir",
                "metrics_file")  # fmt: skip
"""Trainer flags that name where the run writes (the first four rendered from the volume's
mount path, `metrics_file` only through extraArgs)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
"""A Hub repository id, as the trainer tells one from a path (trainer/data/sources.py
`_HUB_ID`; not imported: that module imports `datasets`)."""


@cache
def image_code_dir() -> str:
    """Where the image keeps the trainer: the Dockerfile's last WORKDIR, which is also the
    container's working directory, so relative paths in trainer flags resolve against it."""
    return re.findall(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(), flags=re.MULTILINE)[-1]


@cache
def image_dirs() -> tuple[str, ...]:
    """The image's code directory and every /opt directory the Dockerfile installs into
    (EFA, its NCCL plugin), read from the Dockerfile itself so they cannot drift."""
    opt_dirs = set(re.findall(r"(/opt/[A-Za-z0-9_.-]+)", DOCKERFILE.read_text()))
    return tuple(sorted({image_code_dir(), *opt_dirs}))


def _rendered_job(plan: RunPlan) -> JobManifest:
    """The job as the program renders it, with placeholders for deploy-time values (the image
    digest, the claim's and the token Secret's names): the volumes and mounts depend only on
    whether there is a claim and a token."""
    config = plan.config
    return render_job(
        plan,
        image="image",
        pvc_name="claim" if config.storage.fsx.enabled else None,
        hf_secret_name="hf-token" if config.hf_token is not None else None,
    )


def _rendered_argv(plan: RunPlan) -> list[str]:
    """The trainer's argv exactly as the job runs it (`-m trainer ...`)."""
    return trainer_argv(plan, _rendered_job(plan).paths)


def _trainer_mounts(manifest: JobManifest) -> list[tuple[str, dict[str, Any]]]:
    """(mountPath, volume) of every volume the trainer container mounts."""
    pod = manifest.spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    [container] = [c for c in pod["containers"] if c["name"] == CONTAINER_NAME]
    return [(m["mountPath"], volumes[m["name"]]) for m in container["volumeMounts"]]


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _volume_kind(volume: dict[str, Any]) -> str:
    return next(key for key in volume if key != "name")


def _is_populated(volume: dict[str, Any]) -> bool:
    """Whether the volume can hold files before the pod starts: a claim can; an emptyDir is
    created empty for each pod (Kubernetes docs, Volumes: emptyDir) and a Secret holds only
    its keys."""
    return "persistentVolumeClaim" in volume


def _is_writable(volume: dict[str, Any]) -> bool:
    """A claim or a disk-backed emptyDir; not a Secret (read-only) nor the memory-backed
    /dev/shm, whose files count against the pod's memory limit (Kubernetes docs, Volumes:
    emptyDir, `medium: Memory`)."""
    if "persistentVolumeClaim" in volume:
        return True
    empty_dir = volume.get("emptyDir")
    return empty_dir is not None and empty_dir.get("medium") != "Memory"


def _flag_values(argv: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a rendered argv (`trainer.config.format_args` writes only
    pairs) as {flag: value}."""
    return {
        name.removeprefix("--"): value for name, value in zip(argv[::2], argv[1::2], strict=True)
    }


def _local_path(value: str) -> str | None:
    """The absolute path the trainer would open for `value`, or None for a Hub id.

    The trainer opens a value as a path when it exists and otherwise as a Hub id if it has
    that shape (trainer/data/sources.py `load_corpus`, trainer/models.py
    `resolve_pretrained_dir`): an absolute or explicitly relative value is a path, a relative
    one resolves against the container's working directory, the image's code directory."""
    if value.startswith(("/", "./", "../", "~")) or not _HUB_ID.match(value):
        return _resolve(value)
    return None


def _resolve(value: str) -> str:
    """`value` as an absolute path in the container (relative: from its working directory)."""
    return posixpath.normpath(posixpath.join(image_code_dir(), value))


def _input_problem(key: str, value: str, mounts: list[tuple[str, dict[str, Any]]]) -> str | None:
    populated = [path for path, volume in mounts if _is_populated(volume)]
    allowed = (
        f"a Hugging Face Hub id, or a path under {', '.join(populated)} (storage.fsx.mountPath)"
        if populated
        else "a Hugging Face Hub id, or a path under storage.fsx.mountPath with "
        "storage.fsx.enabled true (without it the pods mount no volume that exists before "
        "they start)"
    )
    if "://" in value:
        return (
            f"{key} {value!r} is a URI, which the trainer does not read (it takes a Hub id or "
            f"a local path); allowed: {allowed}; for S3 data, storage.fsx imports the bucket's "
            "prefix under storage.fsx.mountPath"
        )
    path = _local_path(value)
    if path is None:
        return None
    where = [(mount, volume) for mount, volume in mounts if _under(path, mount)]
    if not where:
        return (
            f"{key} {value!r} is not on any volume the pod mounts (the trainer would look "
            f"for {path} inside the image and stop at start); allowed: {allowed}"
        )
    mount, volume = max(where, key=lambda pair: len(pair[0]))
    if not _is_populated(volume):
        return (
            f"{key} {value!r} lies on {mount} (a {_volume_kind(volume)} volume), which is "
            f"empty when the pod starts; allowed: {allowed}"
        )
    return None


def _output_problem(
    flag: str,
    value: str,
    config: StackConfig,
    mounts: list[tuple[str, dict[str, Any]]],
    paths: RunPaths,
) -> str | None:
    key = (
        f"training.extraArgs.{flag}"
        if flag in config.training.extra_args
        else "storage.fsx.mountPath"
    )
    if value.startswith("s3://"):
        # Without FSx the run writes to S3, where its pods' role reaches its own prefix only
        # (infra.platform.run_access); with FSx its pods have no S3 role at all.
        if paths.in_s3 and _under(value, paths.run_dir):
            return None
        allowed = f"a path under {paths.run_dir}" if paths.in_s3 else "a path on the FSx mount"
        return f"{key} {value!r}: the job's pods may not write there; allowed: {allowed}"
    path = _resolve(value)
    writable = [mount for mount, volume in mounts if _is_writable(volume)]
    if any(_under(path, mount) for mount in writable):
        return None
    return (
        f"{key} {value!r}: --{flag} would write outside every writable volume the pod mounts "
        f"(lost with the container, or refused); allowed: a path under {', '.join(writable)}"
    )


def path_problems(plan: RunPlan) -> list[str]:
    """Every path the job's trainer reads or writes lies on a volume its pod mounts: what it
    reads on one that exists before the pod starts (the FSx claim), what it writes on one it
    can write (a claim or a disk-backed emptyDir). Checked on the rendered argv and mounts."""
    manifest = _rendered_job(plan)
    mounts = _trainer_mounts(manifest)
    flags = _flag_values(trainer_argv(plan, manifest.paths))
    problems = []
    for flag, key in INPUT_FLAGS.items():
        if flag in flags:
            problem = _input_problem(key, flags[flag], mounts)
            problems.extend([problem] if problem else [])
    for flag in OUTPUT_FLAGS:
        if flag in flags:
            problem = _output_problem(flag, flags[flag], plan.config, mounts, manifest.paths)
            problems.extend([problem] if problem else [])
    return problems


def mount_problems(plan: RunPlan) -> list[str]:
    """No volume the pod mounts hides the image's code, its libraries or its local caches.

    A volume mounted at a directory replaces what the image has there for the container
    (Kubernetes docs, Volumes: "volumes mount at specified paths within the image"); one at
    an ancestor hides the whole directory, one inside it the part below the mount. Only
    storage.fsx.mountPath is the stack's to choose; the other mounts are fixed by the job."""
    protected = [*image_dirs(), *BASE_LIBRARY_DIRS, *LOCAL_CACHE_DIRS]
    problems = []
    for mount, volume in _trainer_mounts(_rendered_job(plan)):
        hidden = [d for d in protected if _under(d, mount) or _under(mount, d)]
        if not hidden:
            continue
        key = "storage.fsx.mountPath" if "persistentVolumeClaim" in volume else "mount"
        problems.append(
            f"{key} {mount!r} would hide {', '.join(hidden)} of the trainer image (its code, "
            "libraries or local caches); allowed: a directory of its own outside "
            f"{', '.join(protected)}, e.g. /fsx"
        )
    return problems


def semantic_problems(plan: RunPlan) -> list[str]:
    """Every whole-stack problem of this module, one message each. The checks that render the
    job need its timeouts, which a run without a duration estimate lacks (its plan says why)."""
    config = plan.config
    problems = [
        *addon_problems(config),
        *namespace_problems(config),
        *vocabulary_problems(config),
        *init_from_problems(config),
        *staging_problems(config),
        *grafana_problems(plan),
    ]
    if plan.has_timeouts:
        problems = [
            *trainer_problems(plan),
            *extra_env_problems(plan),
            *problems,
            *path_problems(plan),
            *mount_problems(plan),
        ]
    return problems


def check_run(
    config: StackConfig,
    *,
    source: str,
    config_problems: Collection[str] = (),
    region: str | None = None,
) -> RunPlan:
    """`config`'s run plan when nothing stops the run; else StackConfigError listing every
    problem at once: the config's own (`config_problems`, the rules between its sections),
    the plan's (memory, deadline, cost) and this module's. Only a config whose figures cannot
    be computed at all (a GPU count the instance lacks, an impossible model shape) stops at
    its own problems."""
    problems = list(config_problems)
    if not figures_possible(config):
        raise StackConfigError(problems, source=source)
    plan = plan_run(config, region=region)
    problems += [*plan.problems, *semantic_problems(plan)]
    if problems:
        raise StackConfigError(problems, source=source)
    return plan


def checked_run_plan(
    values: Mapping[str, Any],
    *,
    stack_name: str,
    secret_keys: Collection[str] = (),
    source: str | None = None,
) -> RunPlan:
    """Raw stack-config values parsed (`infra.config.parse.validate_stack_config`) and their
    run checked (`check_run`), every problem of both listed at once: what the Pulumi program
    does before it registers anything."""
    validated = validate_stack_config(
        values, stack_name=stack_name, secret_keys=secret_keys, source=source
    )
    return check_run(
        validated.config,
        source=source or f"stack {stack_name!r}",
        config_problems=validated.problems,
        region=region if isinstance(region := values.get("aws:region"), str) else None,
    )


def plan_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> RunPlan:
    """A stack file read, parsed and checked as `pulumi up` would, without the engine."""
    stack_file = read_stack_file(stack, stacks_dir)
    return checked_run_plan(
        stack_file.config,
        stack_name=stack_file.stack_name,
        secret_keys=stack_file.secret_keys,
        source=display_path(stack_file.path),
    )
