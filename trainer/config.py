"""The trainer's command line: typed config sections, one flag per field.

The Pulumi program imports this module to check that the arguments it renders into a
PyTorchJob parse here, so it must not import torch / transformers / datasets.

Every field of every section is one `--flag` with the field's name (the flag names of the
awsome-distributed-training FSDP sample are kept, with their meanings, so its users' scripts
and habits carry over); the parser is generated from the dataclasses so the help text,
type, default and allowed values live in exactly one place. Switches take 0/1/true/false (or
no value, meaning true). An unknown or malformed flag is an error that names it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from trainer.presets import PRESETS, ModelShape, get_preset
from trainer.telemetry_names import DEFAULT_METRICS_PORT

# The FSDP sample's names for model families (`--model_type`), mapped to the preset that
# stands for them when no --model is given.
MODEL_TYPE_BASE_PRESET: dict[str, str] = {
    "llama": "llama3.1-8b",
    "llama_v3": "llama3.1-8b",
    "llama_v2": "llama2-7b",
    "mistral": "mistral-7b",
    "mixtral": "mixtral-8x7b",
}
DEFAULT_PRESET = "llama3.1-8b"
# The FSDP sample's default tokenizer: ungated, so a first run needs no Hugging Face token.
DEFAULT_TOKENIZER = "hf-internal-testing/llama-tokenizer"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
AC_SWITCHES: dict[str, str] = {**dict.fromkeys(_TRUE, "full"), **dict.fromkeys(_FALSE, "off")}
"""`--activation_checkpointing` given as a switch, as the awsome-distributed-training FSDP
sample takes it: on means every layer (full), off none."""


def _flag(
    default: Any,
    help: str,
    *aliases: str,
    synonyms: Mapping[str, str] | None = None,
    stack_key: str | None = None,
    rendered_from: str | None = None,
    shape: bool = False,
) -> Any:
    """A config field that is also a command-line flag: one row of the table of trainer flags
    (`flag_table`). Aliases are extra spellings of the flag; synonyms, for a choice, extra
    spellings of a value. `stack_key`: the stack-file key (camelCase, `section.key`) the Pulumi
    program renders this flag from; `rendered_from`: what the program renders it from when no
    key of its own holds it; `shape`: the flag changes the model's architecture."""
    return field(
        default=default,
        metadata={
            "help": help,
            "aliases": aliases,
            "synonyms": dict(synonyms or {}),
            "stack_key": stack_key,
            "rendered_from": rendered_from,
            "shape": shape,
        },
    )


@dataclass
class ModelConfig:
    """Which model to train: a preset, shape overrides, and where the weights come from."""

    model: str | None = _flag(
        None,
        "Model preset (published shapes): "
        + ", ".join(PRESETS)
        + f". Default: the family of --model_type, else {DEFAULT_PRESET}.",
        stack_key="model.preset",
        shape=True,
    )
    model_type: str | None = _flag(
        None,
        "Model family, overriding the preset's: llama (or llama_v2, llama_v3), mistral, mixtral.",
        shape=True,
    )
    num_layers: int | None = _flag(
        None,
        "Number of decoder layers (overrides the preset).",
        stack_key="model.numLayers",
        shape=True,
    )
    hidden_width: int | None = _flag(
        None, "Hidden size (overrides the preset).", stack_key="model.hiddenSize", shape=True
    )
    num_heads: int | None = _flag(
        None,
        "Number of attention heads (overrides the preset).",
        stack_key="model.numHeads",
        shape=True,
    )
    num_key_value_heads: int | None = _flag(
        None,
        "Key/value heads for grouped-query attention (overrides the preset).",
        stack_key="model.numKeyValueHeads",
        shape=True,
    )
    intermediate_size: int | None = _flag(
        None,
        "MLP inner size (overrides the preset).",
        "--llama_intermediate_size",
        stack_key="model.intermediateSize",
        shape=True,
    )
    vocab_size: int | None = _flag(
        None, "Vocabulary size (overrides the preset).", stack_key="model.vocabSize", shape=True
    )
    num_local_experts: int | None = _flag(None, "Experts per MoE layer (mixtral only).", shape=True)
    num_experts_per_tok: int | None = _flag(
        None, "Experts each token is routed to (mixtral).", shape=True
    )
    rope_theta: float | None = _flag(
        None, "Rotary embedding base (overrides the preset).", shape=True
    )
    tie_word_embeddings: bool | None = _flag(
        None, "Share input embedding and LM head weights (overrides the preset).", shape=True
    )
    max_context_width: int = _flag(
        2048,
        "Training sequence length in tokens; every sequence is packed to exactly this.",
        stack_key="training.contextWidth",
    )
    init_from: str | None = _flag(
        None,
        "Hugging Face hub id or local directory with pretrained weights; "
        "default: random initialisation from the config.",
        stack_key="model.initFrom",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = _flag(
        "sdpa", "Attention kernel.", stack_key="model.attnImplementation"
    )

    def __post_init__(self) -> None:
        if self.model is not None and self.model not in PRESETS:
            raise ValueError(
                f"--model {self.model!r} is not a preset; allowed: {', '.join(PRESETS)}"
            )
        if self.model_type is not None and self.model_type not in MODEL_TYPE_BASE_PRESET:
            raise ValueError(
                f"--model_type {self.model_type!r} is not supported; "
                f"allowed: {', '.join(MODEL_TYPE_BASE_PRESET)}"
            )
        _require_positive(self, "max_context_width")
        # Every count of the shape is positive, except experts (0: a dense model).
        for row in flag_table():
            value = getattr(self, row.name, None)
            if not row.shape or not isinstance(value, int) or isinstance(value, bool):
                continue
            if row.name == "num_local_experts" and value < 0:
                raise ValueError(f"--num_local_experts must be >= 0, got {value}")
            if row.name != "num_local_experts":
                _require_positive(self, row.name)
        # Fail at parse time (not after minutes of setup) on an inconsistent shape.
        self.shape()

    @property
    def preset_name(self) -> str:
        if self.model is not None:
            return self.model
        if self.model_type is not None:
            return MODEL_TYPE_BASE_PRESET[self.model_type]
        return DEFAULT_PRESET

    def shape(self) -> ModelShape:
        """The preset's published shape with every explicit flag applied on top."""
        base = get_preset(self.preset_name)
        family = None
        if self.model_type is not None:
            family = "llama" if self.model_type.startswith("llama") else self.model_type
        overrides: dict[str, Any] = {
            "model_type": family,
            "hidden_size": self.hidden_width,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_local_experts": self.num_local_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            # A context longer than the preset's is allowed; rope extends.
            "max_position_embeddings": max(base.max_position_embeddings, self.max_context_width),
        }
        if family is not None and family != base.model_type:
            # Switching family drops the other family's MoE fields unless given explicitly.
            if family != "mixtral" and self.num_local_experts is None:
                overrides["num_local_experts"] = 0
                overrides["num_experts_per_tok"] = 0
            if family == "mixtral" and self.num_local_experts is None:
                overrides["num_local_experts"] = 8
                overrides["num_experts_per_tok"] = self.num_experts_per_tok or 2
        try:
            return base.with_overrides(**overrides)
        except ValueError as err:
            raise ValueError(f"model shape for preset {self.preset_name!r}: {err}") from None


@dataclass
class DataConfig:
    """Where tokens come from and how many per batch."""

    dataset: str = _flag(
        "allenai/c4",
        "Hub dataset id (streamed) or local path (save_to_disk dir, or a folder of "
        "json/jsonl/parquet/txt files).",
        "--dataset_path",
        stack_key="data.dataset",
    )
    dataset_config_name: str | None = _flag(
        "en",
        "Dataset configuration (subset) name; an empty value means none.",
        stack_key="data.datasetConfigName",
    )
    tokenizer: str | None = _flag(
        None,
        "Tokenizer: hub id or local directory. Default: --init_from when given, else "
        f"{DEFAULT_TOKENIZER}.",
        stack_key="data.tokenizer",
    )
    text_column: str = _flag(
        "text", "Column of the dataset that holds the raw text.", stack_key="data.textColumn"
    )
    num_workers: int = _flag(
        0,
        "Batches each rank reads and tokenises ahead in a background thread (0: inline).",
        stack_key="data.numWorkers",
    )
    train_batch_size: int = _flag(
        2, "Sequences per rank per micro-batch.", stack_key="training.microBatchSize"
    )
    val_batch_size: int = _flag(4, "Sequences per rank per validation batch.")

    def __post_init__(self) -> None:
        # Stack files render `datasetConfigName: null` as an empty flag value; `datasets`
        # wants None for "no configuration", and "" would be looked up as a name.
        if self.dataset_config_name == "":
            self.dataset_config_name = None
        _require_positive(self, "train_batch_size")
        _require_positive(self, "val_batch_size")
        if self.num_workers < 0:
            raise ValueError(f"--num_workers must be >= 0, got {self.num_workers}")


@dataclass
class ParallelConfig:
    """How the model is spread over devices, and the memory/speed trade-offs."""

    sharding_strategy: Literal["full", "hybrid", "shard_grad_op", "no_shard"] = _flag(
        "full",
        "full: shard params, grads and optimizer state over all ranks (ZeRO-3); "
        "hybrid: shard within a node, replicate across nodes (HSDP); "
        "shard_grad_op: keep params gathered between forward and backward (ZeRO-2); "
        "no_shard: replicate everything (DDP-equivalent).",
        stack_key="training.shardingStrategy",
    )
    hsdp_shard_size: int = _flag(
        0,
        "Ranks per shard group for hybrid sharding; 0 means LOCAL_WORLD_SIZE (one node).",
        stack_key="training.hsdpShardSize",
    )
    bf16: bool = _flag(
        True,
        "bf16 mixed precision: bf16 compute and all-gather, fp32 master weights and reduce.",
        stack_key="training.bf16",
    )
    activation_checkpointing: Literal["off", "full", "op", "selective"] = _flag(
        "full",
        "Recompute activations in backward to save memory. full: every decoder layer's "
        "forward again; op: keep each layer's attention and every second matmul output, "
        "recompute the rest (torchtitan's op-level selective checkpointing); selective: "
        "every --ac_every-th layer; off: keep everything. 1/true and 0/false mean full and "
        "off, as in the awsome-distributed-training FSDP sample.",
        synonyms=AC_SWITCHES,
        stack_key="training.activationCheckpointing",
    )
    ac_every: int = _flag(
        2, "With --activation_checkpointing selective, checkpoint one layer in every N."
    )
    cpu_offload: bool = _flag(
        False,
        "Keep sharded params, grads and optimizer state in CPU RAM.",
        stack_key="training.cpuOffload",
    )
    compile: bool | None = _flag(
        None,
        "torch.compile each decoder layer. Unset: on with CUDA (fused kernels for the norms, "
        "rotary and SiLU), off on CPU (minutes of C++ compilation for a short local run).",
        stack_key="training.compile",
    )
    precision: Literal["bf16", "fp8"] = _flag(
        "bf16",
        "Matmul precision of the decoder's linear layers. bf16: as --bf16 says; fp8: torchao's "
        "float8 training for the layers large enough to gain (not the LM head), needs --bf16 1, "
        "--compile on and a GPU with FP8 tensor cores (compute capability >= 8.9: L4, L40S, "
        "H100, H200, B200). Weights, optimizer state and checkpoints stay those of a bf16 run.",
        stack_key="training.precision",
    )
    fp8_recipe: Literal["rowwise", "tensorwise"] | None = _flag(
        None,
        "With --precision fp8, torchao's scaling recipe (unset: rowwise): rowwise (per-row "
        "scales, more "
        "accurate) or tensorwise (one scale per tensor, faster; weights are all-gathered in "
        "float8 when a shard group has more than one rank).",
        stack_key="training.fp8Recipe",
    )
    fp8_emulate: bool = _flag(
        False,
        "Testing: run --precision fp8's float8 matmuls emulated in fp32 (torchao's emulate), "
        "so fp8 numerics can be checked on a CPU and without compile; no speed-up.",
    )
    loss_chunk_tokens: int = _flag(
        1024,
        "Compute the loss this many token positions at a time, each slice's logits recomputed "
        "in backward, so the whole vocabulary's fp32 logits never exist at once "
        "(trainer/loss.py); 0: Hugging Face's loss over the full logits tensor.",
    )
    device: Literal["auto", "cuda", "cpu"] = _flag(
        "auto", "auto: cuda with nccl if available, else cpu with gloo."
    )
    gc_every: int = _flag(
        50,
        "Run Python's cycle collector, a full pass, every N steps of the loop, at the same "
        "steps on every rank, rather than whenever one rank's allocations trigger it (the "
        "others then wait for it at the next collective); what the imports and setup built is "
        "frozen, out of those passes (trainer/garbage.py). 0: Python's automatic collection.",
    )

    def __post_init__(self) -> None:
        _require_positive(self, "ac_every")
        if self.gc_every < 0:
            raise ValueError(f"--gc_every must be >= 0 (0: automatic), got {self.gc_every}")
        if self.precision == "fp8" and not self.bf16:
            raise ValueError(
                "--precision fp8 needs --bf16 1: the layers it leaves out (LM head, norms, "
                "small projections) compute in bf16"
            )
        if self.precision == "fp8" and self.compile is False and not self.fp8_emulate:
            raise ValueError(
                "--precision fp8 needs --compile 1: without it the float8 scale and cast "
                "kernels run unfused and fp8 is slower than bf16"
            )
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(
                f"--fp8_recipe {self.fp8_recipe} applies only to --precision fp8, "
                f"not {self.precision}"
            )
        if self.precision == "fp8" and self.fp8_recipe is None:
            self.fp8_recipe = "rowwise"
        if self.fp8_emulate and self.precision != "fp8":
            raise ValueError("--fp8_emulate applies only to --precision fp8")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"--loss_chunk_tokens must be >= 0, got {self.loss_chunk_tokens}")
        if self.hsdp_shard_size < 0:
            raise ValueError(f"--hsdp_shard_size must be >= 0, got {self.hsdp_shard_size}")


@dataclass
class OptimConfig:
    """AdamW, the learning-rate schedule and the length of the run."""

    max_steps: int = _flag(
        5000,
        "Optimizer steps; training stops exactly here.",
        "--max_training_steps",
        stack_key="training.maxSteps",
    )
    lr: float = _flag(1e-4, "Peak learning rate.", stack_key="training.lr")
    min_lr: float = _flag(
        1e-5, "Learning rate at the end of the decay.", stack_key="training.minLr"
    )
    warmup: float = _flag(
        0.0032,
        "Linear warmup: a fraction of --max_steps when below 1 (the FSDP sample's meaning), "
        "else a number of steps.",
        stack_key="training.warmup",
    )
    lr_decay_style: Literal["cosine", "linear", "constant"] = _flag(
        "cosine", "Decay after warmup, down to --min_lr.", stack_key="training.lrDecayStyle"
    )
    weight_decay: float = _flag(
        0.2,
        "AdamW weight decay (not applied to norms and biases).",
        stack_key="training.weightDecay",
    )
    beta1: float = _flag(0.9, "AdamW beta1.", stack_key="training.beta1")
    beta2: float = _flag(0.95, "AdamW beta2.", stack_key="training.beta2")
    grad_clip: float = _flag(
        1.0,
        "Clip the global gradient norm to this; 0 disables clipping.",
        stack_key="training.gradClip",
    )
    gradient_accumulation_steps: int = _flag(
        1,
        "Micro-batches per optimizer step.",
        "--grad_accum_steps",
        stack_key="training.gradientAccumulationSteps",
    )
    seed: int = _flag(
        12345, "Seed for initialisation, data order and dropout.", stack_key="training.seed"
    )

    def __post_init__(self) -> None:
        _require_positive(self, "max_steps")
        _require_positive(self, "gradient_accumulation_steps")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min_lr must be in [0, --lr={self.lr}], got {self.min_lr}")
        if self.warmup < 0 or (self.warmup >= 1 and not float(self.warmup).is_integer()):
            raise ValueError(
                "--warmup must be a fraction in [0, 1) or a whole number of steps, "
                f"got {self.warmup}"
            )
        if self.warmup >= 1 and self.warmup > self.max_steps:
            raise ValueError(
                f"--warmup {int(self.warmup)} steps exceeds --max_steps {self.max_steps}; "
                "allowed: at most --max_steps, or a fraction below 1"
            )
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("--weight_decay and --grad_clip must be >= 0")

    @property
    def warmup_steps(self) -> int:
        """Warmup in steps, whichever way --warmup was given."""
        if self.warmup < 1:
            return int(self.warmup * self.max_steps)
        return min(int(self.warmup), self.max_steps)


@dataclass
class CheckpointConfig:
    """Saving, resuming and exporting."""

    checkpoint_dir: str | None = _flag(
        None,
        "Directory, or s3://bucket/prefix, for step-N checkpoints (DCP); default: none.",
        rendered_from="the run's directory, on storage.fsx.mountPath or in the stack's bucket",
    )
    resume_from_checkpoint: str | None = _flag(
        None,
        "Directory to resume from (may equal --checkpoint_dir): the latest complete step-N "
        "in it, or a step-N directory itself. Empty or missing: start fresh.",
        rendered_from="the run's directory, on storage.fsx.mountPath or in the stack's bucket",
    )
    allow_world_size_change: bool = _flag(
        False,
        "Resume from a checkpoint written by a different number of ranks: weights, optimizer "
        "and schedule reshard to this run, but each rank's data position cannot, so the data "
        "starts again from its beginning.",
    )
    checkpoint_freq: int = _flag(
        1000, "Save every N steps (0: only the final save).", stack_key="training.checkpointEvery"
    )
    async_checkpoint: bool = _flag(
        True,
        "Write periodic checkpoints in the background: a step waits only while the state is "
        "copied to host memory (the final and the stop-signal saves are always synchronous).",
    )
    keep_last_checkpoints: int = _flag(
        3,
        "Keep the newest K checkpoints and delete older ones (0: keep all).",
        stack_key="training.keepLastCheckpoints",
    )
    export_dir: str | None = _flag(
        None,
        "At the end, write a Hugging Face safetensors model here (bf16 weights when --bf16).",
        rendered_from="training.exportModel: the run directory's export folder",
    )
    staging_dir: str | None = _flag(
        None,
        "Local directory where rank 0 writes the outputs given as s3:// URIs (metrics file, "
        "TensorBoard events, export) before copying them to S3; default: under the temp dir.",
        rendered_from="the pod's local volume when the run lives in the stack's bucket",
    )

    def __post_init__(self) -> None:
        if self.checkpoint_freq < 0:
            raise ValueError(f"--checkpoint_freq must be >= 0, got {self.checkpoint_freq}")
        if self.keep_last_checkpoints < 0:
            raise ValueError(
                f"--keep_last_checkpoints must be >= 0, got {self.keep_last_checkpoints}"
            )


@dataclass
class LoggingConfig:
    """What gets reported, how often, and where."""

    logging_freq: int = _flag(
        10,
        "Log (and all-reduce the loss: the one host-device sync of a step) every N steps; "
        "the steps in between run without any.",
        stack_key="training.loggingEvery",
    )
    digest_freq: int = _flag(
        100,
        "Record every rank's batch fingerprint (an all_gather_object) on logging steps that "
        "are a multiple of N, and on the first one: evidence that ranks read different data.",
    )
    validation_freq: int = _flag(
        0, "Validate every N steps (0: never).", stack_key="training.validationEvery"
    )
    validation_batches: int = _flag(
        10, "Batches per validation pass.", stack_key="training.validationBatches"
    )
    metrics_file: str | None = _flag(
        None, "JSONL metrics file; default: metrics.jsonl in --checkpoint_dir if set."
    )
    tensorboard_dir: str | None = _flag(
        None,
        "Also write TensorBoard scalars here.",
        rendered_from="the run's directory: its tensorboard folder",
    )
    progress_bar: bool | None = _flag(
        None, "tqdm progress bar; default: on when stderr is a terminal."
    )
    metrics_port: int = _flag(
        DEFAULT_METRICS_PORT,
        "Serve Prometheus metrics for every rank of this node on this port, from local rank 0 "
        "(trainer/telemetry.py); 0: none. A port in use is a warning, not an error.",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics_port must be in [0, 65535], got {self.metrics_port}")
        _require_positive(self, "logging_freq")
        _require_positive(self, "digest_freq")
        _require_positive(self, "validation_batches")
        if self.validation_freq < 0:
            raise ValueError(f"--validation_freq must be >= 0, got {self.validation_freq}")


@dataclass
class SafetyConfig:
    """What the run does on its own about hangs, divergence and broken nodes."""

    watchdog_factor: float = _flag(
        10.0,
        "Exit (code 142, after dumping every thread's stack and the flight recorder) when no "
        "step finished for this many times the recent median step time (0: no watchdog).",
    )
    watchdog_floor_s: float = _flag(
        600.0,
        "The watchdog never fires sooner than this: it must cover a checkpoint save or a "
        "validation pass between two steps.",
        rendered_from="the plan's estimate of one checkpoint save",
    )
    rollback_after_nonfinite: int = _flag(
        3,
        "Roll back to the last checkpoint (and skip the data read since) after this many "
        "consecutive non-finite steps, each of which is skipped (0: never roll back).",
    )
    loss_spike_factor: float = _flag(
        0.0,
        "Roll back when the logged loss exceeds this many times its recent average (0: off).",
    )
    max_rollbacks: int = _flag(5, "Stop the run (an error) after this many rollbacks.")
    preflight: Literal["enforce", "warn", "off"] = _flag(
        "enforce",
        "Before step 1, check each node's GPUs and EFA devices against the --expect_* flags "
        "and the all-reduce bandwidth against --allreduce_floor_gbps; enforce: a failure "
        "exits (code 140) with one line naming the node and the check; warn: it is logged.",
        stack_key="job.preflight",
    )
    expect_gpu: str | None = _flag(
        None,
        "Preflight: the GPU model each rank must see (e.g. H100).",
        rendered_from="gpuNodes.instanceType: its GPU model",
    )
    expect_gpu_memory_gib: int | None = _flag(
        None,
        "Preflight: memory each GPU must have.",
        rendered_from="gpuNodes.instanceType: its GPU memory",
    )
    expect_efa_devices: int = _flag(
        0,
        "Preflight: EFA devices each node must have (0: none).",
        rendered_from="gpuNodes.instanceType: its EFA interfaces when EFA is on",
    )
    allreduce_floor_gbps: float = _flag(
        0.0,
        "Preflight: all-reduce bus bandwidth in GB/s below which the network is broken.",
        rendered_from="gpuNodes.instanceType: its all-reduce bandwidth floor",
    )

    def __post_init__(self) -> None:
        for name in ("rollback_after_nonfinite", "max_rollbacks"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.watchdog_factor and self.watchdog_factor <= 1:
            raise ValueError(
                f"--watchdog_factor must be 0 (off) or > 1, got {self.watchdog_factor}"
            )
        if self.loss_spike_factor and self.loss_spike_factor <= 1:
            raise ValueError(
                f"--loss_spike_factor must be 0 (off) or > 1, got {self.loss_spike_factor}"
            )
        if self.watchdog_floor_s <= 0:
            raise ValueError(f"--watchdog_floor_s must be > 0, got {self.watchdog_floor_s}")


def parse_batch_ranges(text: str) -> frozenset[int]:
    """``"11-12,16"`` -> {11, 12, 16}; the empty string is the empty set."""
    batches: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(
                f"--nan_batches {text!r}: {part!r} is not a batch number or a range N-M"
            ) from None
        if not 1 <= low <= high:
            raise ValueError(f"--nan_batches {text!r}: {part!r} must be N-M with 1 <= N <= M")
        batches.update(range(low, high + 1))
    return frozenset(batches)


@dataclass
class InjectedFaultConfig:
    """Testing only: faults injected on purpose, to prove the run survives them.

    Step faults fire in a run's first attempt only (not after a resume or a rollback), so that
    rerunning the same command resumes and finishes; ``--nan_batches`` follows the data.
    """

    fail_at_step: int = _flag(
        0,
        "Exit abruptly (code 17) right after step N, once a save in flight is durable, "
        "unless this run resumed from a checkpoint, so that rerunning the same command "
        "resumes and finishes (0: off).",
    )
    crash_in_save_at_step: int = _flag(
        0,
        "The last rank dies (code 17) inside the save of the step-N checkpoint, after its "
        "train_state and before its shards, unless this run resumed (0: off).",
    )
    disk_full_at_step: int = _flag(
        0,
        "The last rank's checkpoint writer fails with ENOSPC (errno 28, no space left on "
        "device) when it writes the shards of the step-N checkpoint (0: off).",
    )
    signal_at_step: int = _flag(
        0,
        "The last rank sends itself SIGTERM right after step N, as when one node is "
        "interrupted, unless this run resumed from a checkpoint (0: off). Every rank then "
        "saves step N+1 and exits with code 143.",
    )
    stop_in_upload_at_step: int = _flag(
        0,
        "Under torchrun: the last rank's upload of the step-N checkpoint is held until its "
        "upload process is sent SIGTERM, and right after step N that rank sends SIGTERM to "
        "torchrun, which signals every worker's process group, as a pod deletion does, "
        "unless this run resumed from a checkpoint (0: off).",
    )
    stall_at_step: int = _flag(
        0,
        "The last rank stops making progress right after step N (as on a stuck GPU or read), "
        "unless this run resumed from a checkpoint (0: off).",
    )
    nan_at_step: int = _flag(
        0,
        "The last rank's loss at step N is NaN (as after an overflow), unless this run "
        "resumed from a checkpoint (0: off). Every rank skips that update.",
    )
    nan_steps: int = _flag(1, "How many consecutive steps --nan_at_step poisons.")
    nan_batches: str = _flag(
        "",
        "The last rank's loss is NaN on these batches of its data stream, counted from 1 "
        "across resumes and rollbacks (e.g. 11-12,16-17), as on a corrupt patch of data.",
    )
    preflight_fail_check: Literal["gpus", "efa"] | None = _flag(
        None, "The last rank reports this preflight check as failed."
    )

    def __post_init__(self) -> None:
        for name in (
            "fail_at_step",
            "crash_in_save_at_step",
            "disk_full_at_step",
            "signal_at_step",
            "stop_in_upload_at_step",
            "stall_at_step",
            "nan_at_step",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.nan_steps < 1:
            raise ValueError(f"--nan_steps must be >= 1, got {self.nan_steps}")
        parse_batch_ranges(self.nan_batches)


@dataclass
class TrainConfig:
    """The whole run. Sections keep related flags together; flag names are unique across them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    faults: InjectedFaultConfig = field(default_factory=InjectedFaultConfig)

    def __post_init__(self) -> None:
        if self.parallel.sharding_strategy != "hybrid" and self.parallel.hsdp_shard_size:
            raise ValueError("--hsdp_shard_size applies only to --sharding_strategy hybrid")

    @property
    def tokenizer_name(self) -> str:
        """`--tokenizer`, else the pretrained model's own, else the default."""
        return self.data.tokenizer or self.model.init_from or DEFAULT_TOKENIZER

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_SECTION_TYPES: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "parallel": ParallelConfig,
    "optim": OptimConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "safety": SafetyConfig,
    "faults": InjectedFaultConfig,
}


def parse_switch(text: str) -> bool:
    """0/1/true/false (and yes/no, on/off), case-insensitive."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected 0/1/true/false, got {text!r}")


def _choice(synonyms: Mapping[str, str]) -> Any:
    """A choice's text, with its synonyms (case-insensitive) mapped to the canonical value."""

    def convert(text: str) -> str:
        return synonyms.get(text.strip().lower(), text)

    return convert


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field[Any], hint: Any) -> None:
    inner, optional = _strip_optional(hint)
    names = [f"--{f.name}", *f.metadata.get("aliases", ())]
    help_text = f.metadata["help"]
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
    if inner is bool:
        kwargs.update(type=parse_switch, nargs="?", const=True, metavar="0|1")
    elif get_origin(inner) is Literal:
        synonyms = f.metadata.get("synonyms", {})
        kwargs.update(type=_choice(synonyms), choices=list(get_args(inner)))
    elif inner in (int, float, str):
        kwargs.update(type=inner, metavar=inner.__name__.upper())
    else:  # pragma: no cover - a new field type needs a rule here
        raise TypeError(f"config field {f.name} has unsupported type {hint!r}")
    default = f.default
    shown = "unset" if default is None and optional else repr(default)
    group.add_argument(*names, help=f"{help_text} (default: {shown})", **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The parser for `python -m trainer`, generated from the config sections."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="FSDP2 trainer for Hugging Face causal LMs (run under torchrun).",
        allow_abbrev=False,
    )
    annotations = {row.name: row.annotation for row in flag_table()}
    for section_name, section_type in _SECTION_TYPES.items():
        group = parser.add_argument_group(section_name, section_type.__doc__)
        for f in dataclasses.fields(section_type):
            _add_field(group, f, annotations[f.name])
    return parser


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """Parse and validate; any problem exits with status 2 and a message naming the flag."""
    parser = build_parser()
    namespace = vars(parser.parse_args(list(argv)))
    try:
        return _build_config(namespace)
    except ValueError as err:
        parser.error(str(err))


def _build_config(values: Mapping[str, Any]) -> TrainConfig:
    sections: dict[str, Any] = {}
    for section_name, section_type in _SECTION_TYPES.items():
        names = {f.name for f in dataclasses.fields(section_type)}
        sections[section_name] = section_type(**{k: v for k, v in values.items() if k in names})
    return TrainConfig(**sections)


@dataclass(frozen=True)
class FlagRow:
    """One row of the table of trainer flags: a config field, read from its `_flag` metadata."""

    name: str
    section: str
    annotation: Any
    """The field's type (`int | None`, a `Literal[...]`, ...)."""
    default: Any
    help: str
    stack_key: str | None
    """The stack key the Pulumi program renders the flag from (camelCase `section.key`)."""
    rendered_from: str | None
    """What the program renders the flag from when no stack key of its own holds it."""
    shape: bool
    """Whether the flag changes the model's architecture."""

    @property
    def rendered(self) -> bool:
        """Whether the program renders the flag itself (`training.extraArgs` may not set it)."""
        return self.stack_key is not None or self.rendered_from is not None


def flag_table() -> tuple[FlagRow, ...]:
    """Every trainer flag, in the order of the sections and their fields: the one table from
    which the parser, the program's rendering, its stack keys and their docs are derived."""
    return _flag_table(tuple(_SECTION_TYPES.items()))


@functools.cache
def _flag_table(sections: tuple[tuple[str, type], ...]) -> tuple[FlagRow, ...]:
    """Kept per set of section types: every config's checks read the table, and resolving the
    annotations each time was 20 s of the infra tests (a section swapped in is a new key)."""
    rows = []
    for section_name, section_type in sections:
        hints = get_type_hints(section_type)
        for f in dataclasses.fields(section_type):
            rows.append(
                FlagRow(
                    name=f.name,
                    section=section_name,
                    annotation=hints[f.name],
                    default=f.default,
                    help=f.metadata["help"],
                    stack_key=f.metadata.get("stack_key"),
                    rendered_from=f.metadata.get("rendered_from"),
                    shape=f.metadata.get("shape", False),
                )
            )
    return tuple(rows)


def shape_flag_names() -> tuple[str, ...]:
    """The flags that describe the architecture (a pretrained model brings its own)."""
    return tuple(row.name for row in flag_table() if row.shape)


def flag_names() -> frozenset[str]:
    """Every accepted flag name without dashes (canonical names, not aliases)."""
    return frozenset(f.name for t in _SECTION_TYPES.values() for f in dataclasses.fields(t))


def test_only_flag_names() -> frozenset[str]:
    """Flags for tests and the local rehearsal, never for a real run: the injected faults
    (`InjectedFaultConfig`) and fp8 emulation (fp32 matmuls of float8-rounded values, no
    speed-up, and it lifts the FP8-GPU and compile checks)."""
    return frozenset(f.name for f in dataclasses.fields(InjectedFaultConfig)) | {"fp8_emulate"}


def format_args(values: Mapping[str, Any]) -> list[str]:
    """Render `{flag: value}` as trainer arguments (`--flag value`), switches as 1/0.

    For callers that build a command line (the Pulumi program, local runs); `None` values are
    left out. Unknown names raise a ValueError, so a typo never reaches a running job.
    """
    known = flag_names()
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown trainer flag(s): {', '.join(unknown)}")
    argv: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        argv += [f"--{name}", str(value)]
    return argv


def _require_positive(section: object, name: str) -> None:
    value = getattr(section, name)
    if value <= 0:
        raise ValueError(f"--{name} must be > 0, got {value}")
