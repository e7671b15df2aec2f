"""Whole-stack checks that need what the stack renders, not only what it says.

Each finds, before anything is created, a mistake that today surfaces only once the nodes are
up: a trainer flag in `training.extraArgs` that the trainer refuses on every worker (checked by
the trainer's own parser on the exact flags the job renders), an extra environment variable
that silently replaces one the stack sets (the EFA and NCCL settings, the HF token path, the
shutdown timeout) or that puts a credential in plain text into the stack file and the pod
spec, a created cluster without an add-on the job cannot run without, and a job namespace
that belongs to the system or to the training operator.

They run on a config the model has accepted (they need what it renders, and the renderers
depend on the model, not the other way round): the program, the offline plan and the local
run call `require_semantics` right after parsing, before any resource is registered, and a
problem is the same one-line-per-problem "stack is invalid" error.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import TYPE_CHECKING

from infra.config.stack import StackConfigError
from infra.job_args import trainer_flags
from infra.job_manifest import container_env
from trainer.config import DEFAULT_TOKENIZER, format_args, parse_args

if TYPE_CHECKING:
    from infra.config.stack import StackConfig

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
"""Kubernetes' own namespaces (the API server creates them); a job there shares RBAC and
quotas with the control plane's add-ons."""

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY)")
SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{30,}|(AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|sk-[A-Za-z0-9]{20,})$"
)
"""Hugging Face tokens, AWS access key ids, GitHub tokens, OpenAI-style keys."""
_ARGPARSE_FLAG = re.compile(r"--(\w+)")

KNOWN_TOKENIZER_SIZES = {
    "hf-internal-testing/llama-tokenizer": 32000,
    "meta-llama/Llama-2-7b-hf": 32000,
    "meta-llama/Llama-3.1-8B": 128256,
    "meta-llama/Llama-3.2-1B": 128256,
    "meta-llama/Llama-3.2-3B": 128256,
    "mistralai/Mistral-7B-v0.1": 32000,
    "mistralai/Mixtral-8x7B-v0.1": 32000,
}
"""`len(tokenizer)` of Hub tokenizers the presets are used with (their `tokenizer.json`:
Llama 3's 128,000 tokens plus 256 reserved special ones; Llama 2's and Mistral's 32,000).
The trainer checks the real tokenizer at start (`trainer.train`); this catches the known
ones at plan time."""


def extra_args_problems(config: StackConfig) -> list[str]:
    """The rendered trainer flags, extraArgs included, through the trainer's own parser and
    its own consistency checks (what every worker would do at start)."""
    extra = config.training.extra_args
    if not extra:
        return []
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_args(format_args(trainer_flags(config)))
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
        named = _ARGPARSE_FLAG.findall(message)
        flag = next((name for name in named if name in extra), None)
        if flag is None:
            return [f"training.extraArgs: the trainer refuses the job's flags: {message}"]
        return [f"training.extraArgs.{flag} {extra[flag]!r}: the trainer refuses it: {message}"]
    return []


def extra_env_problems(config: StackConfig) -> list[str]:
    """`job.extraEnv` may add variables, not replace the stack's nor carry credentials."""
    extra = config.job.extra_env
    if not extra:
        return []
    bare = config.model_copy(update={"job": config.job.model_copy(update={"extra_env": {}})})
    rendered = {e["name"]: e["value"] for e in container_env(bare, hf_secret_name="x")}
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
    namespace = config.job.namespace
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
    every worker (`--tokenizer ... has N tokens but the model's vocab_size is M`)."""
    tokenizer = config.data.tokenizer or config.model.init_from or DEFAULT_TOKENIZER
    size = KNOWN_TOKENIZER_SIZES.get(tokenizer)
    if size is None or config.model.init_from is not None:
        return []
    vocab = config.model_shape().vocab_size
    if vocab >= size:
        return []
    return [
        f"model.vocabSize {vocab} (of preset {config.model.preset!r} or the stack) is smaller "
        f"than data.tokenizer {tokenizer!r}, which has {size} tokens; allowed: a vocabulary of "
        f"at least {size} (model.vocabSize), or a tokenizer of the model's own family"
    ]


def semantic_problems(config: StackConfig) -> list[str]:
    """Every whole-stack problem of this module, one message each."""
    return [
        *extra_args_problems(config),
        *extra_env_problems(config),
        *addon_problems(config),
        *namespace_problems(config),
        *vocabulary_problems(config),
    ]


def require_semantics(config: StackConfig, *, source: str) -> StackConfig:
    """`config` when it passes every check here; else StackConfigError listing the problems."""
    problems = semantic_problems(config)
    if problems:
        raise StackConfigError(problems, source=source)
    return config
