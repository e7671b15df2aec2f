"""Facts about the GPU instance types a stack may ask for.

Config validation needs these offline, and the node group, the job's requests and the cost
estimate must agree, so they live in one table (EFA counts: AWS EC2 user guide, "EFA supported
instance types"). An `ml.` (SageMaker HyperPod) type has its family's facts, existing clusters
only. Why and sources: docs/design/facts.md#instances
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceFacts:
    """Published shape of one EC2 instance type."""

    gpus: int
    """GPUs per instance."""
    gpu_model: str
    """Accelerator name as the trainer's MFU table knows it (e.g. "H100")."""
    gpu_memory_gib: int
    """Memory per GPU."""
    efa_interfaces: int
    """Maximum EFA interfaces (0: no EFA support)."""
    gpudirect_rdma: bool
    """Whether NCCL can use GPUDirect RDMA over EFA on this type."""
    vcpus: int
    memory_gib: int


INSTANCE_FACTS: dict[str, InstanceFacts] = {
    "p4d.24xlarge": InstanceFacts(8, "A100", 40, 4, True, 96, 1152),
    "p4de.24xlarge": InstanceFacts(8, "A100", 80, 4, True, 96, 1152),
    "p5.48xlarge": InstanceFacts(8, "H100", 80, 32, True, 192, 2048),
    "p5e.48xlarge": InstanceFacts(8, "H200", 141, 32, True, 192, 2048),
    "p5en.48xlarge": InstanceFacts(8, "H200", 141, 16, True, 192, 2048),
    "p6-b200.48xlarge": InstanceFacts(8, "B200", 179, 8, True, 192, 2048),
    "g5.xlarge": InstanceFacts(1, "A10G", 24, 0, False, 4, 16),
    "g5.2xlarge": InstanceFacts(1, "A10G", 24, 0, False, 8, 32),
    "g5.4xlarge": InstanceFacts(1, "A10G", 24, 0, False, 16, 64),
    "g5.8xlarge": InstanceFacts(1, "A10G", 24, 1, False, 32, 128),
    "g5.12xlarge": InstanceFacts(4, "A10G", 24, 1, False, 48, 192),
    "g5.16xlarge": InstanceFacts(1, "A10G", 24, 1, False, 64, 256),
    "g5.24xlarge": InstanceFacts(4, "A10G", 24, 1, False, 96, 384),
    "g5.48xlarge": InstanceFacts(8, "A10G", 24, 1, False, 192, 768),
    "g6e.xlarge": InstanceFacts(1, "L40S", 48, 0, False, 4, 32),
    "g6e.2xlarge": InstanceFacts(1, "L40S", 48, 0, False, 8, 64),
    "g6e.4xlarge": InstanceFacts(1, "L40S", 48, 0, False, 16, 128),
    "g6e.8xlarge": InstanceFacts(1, "L40S", 48, 1, False, 32, 256),
    "g6e.12xlarge": InstanceFacts(4, "L40S", 48, 1, False, 48, 384),
    "g6e.16xlarge": InstanceFacts(1, "L40S", 48, 1, False, 64, 512),
    "g6e.24xlarge": InstanceFacts(4, "L40S", 48, 2, False, 96, 768),
    "g6e.48xlarge": InstanceFacts(8, "L40S", 48, 4, False, 192, 1536),
}


ACCELERATOR_LABEL_VALUES: dict[str, str] = {
    "A100": "nvidia-tesla-a100",
    "A10G": "nvidia-a10g",
    "L40S": "nvidia-l40s",
    "H100": "nvidia-h100",
    "H200": "nvidia-h200",
    "B200": "nvidia-b200",
}
"""The `k8s.amazonaws.com/accelerator` node label's value per GPU model: Cluster Autoscaler's
own names where it has one (kubernetes/autoscaler cluster-autoscaler-1.35.0
`cloudprovider/aws/aws_cloud_provider.go` `availableGPUTypes`: nvidia-tesla-a100, nvidia-a10g,
nvidia-l40s), the same form otherwise (its metrics then say "not-listed"; nothing else reads
the value)."""


def accelerator_label_value(gpu_model: str) -> str:
    return ACCELERATOR_LABEL_VALUES.get(gpu_model, f"nvidia-{gpu_model.lower()}")


GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "A10G": (8, 6),
    "A100": (8, 0),
    "L40S": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
}
"""CUDA compute capability of each `gpu_model` above (NVIDIA, "CUDA GPUs - Compute
Capability", developer.nvidia.com/cuda-gpus: A10 and A10G 8.6, A100 8.0, L40S 8.9, H100 and
H200 9.0, B200 10.0). What the GPU can run, e.g. FP8 tensor cores from 8.9
(`trainer.flops.MIN_FP8_CAPABILITY`)."""


GPU_PEAK_FP32_FLOPS: dict[str, float] = {
    "A10G": 31.2e12,
    "A100": 19.5e12,
    "L40S": 91.6e12,
    "H100": 67.0e12,
    "H200": 67.0e12,
    "B200": 75.0e12,
}
"""Peak plain FP32 FLOP/s per GPU (CUDA cores, no tensor cores), from NVIDIA's data sheets: A100
19.5 (A100 Tensor Core GPU data sheet), H100 SXM and H200 SXM 67 (H100 and H200 data sheets),
L40S 91.6 (L40S data sheet), B200 75 (HGX B200: 600 TFLOPS FP32 over 8 GPUs), A10G 31.2 (the
A10 data sheet's figure for the same GA102 part; AWS publishes none for the A10G). What a
`training.bf16: false` run's matmuls run at: the trainer leaves torch's TF32 switch
(`torch.backends.cuda.matmul.allow_tf32`) at its default, off since torch 1.12 (pytorch
`docs/source/notes/cuda.rst`, "TensorFloat-32 (TF32) on Ampere (and later) devices"), so fp32
matmuls skip the tensor cores."""


ALLREDUCE_BUSBW_FLOOR_GBPS: dict[str, float] = {
    "p4d.24xlarge": 20.0,
    "p4de.24xlarge": 20.0,
    "p5.48xlarge": 100.0,
    "p5e.48xlarge": 100.0,
    "p5en.48xlarge": 100.0,
    "p6-b200.48xlarge": 150.0,
}
"""All-reduce bus bandwidth (GB/s, nccl-tests' busbw) below which a job's preflight calls the
network broken. Assumed, not measured: about 40% of a p4d's 400 Gbps of EFA (50 GB/s) and 25%
of a p5's or p6's 3,200 Gbps (400 GB/s), far below what nccl-tests reach over EFA and far above
what NCCL gets over TCP sockets on the same nodes. Replace with measured figures from
`scripts/cli/validate.py` (its nccl check prints the bus bandwidth). Types without an
entry (PCIe-only g5/g6e, EFA optional) get no floor."""

CAPACITY_BLOCK_TYPES = frozenset(
    {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
    }
)
"""Types of the table above that EC2 Capacity Blocks for ML sell (EC2 user guide, "Capacity
Blocks for ML", supported instance types; SageMaker's `ReservedCapacityInstanceType` enum
lists the same families under `ml.` names). A block for any other type cannot exist, so a
stack naming one has the wrong instance type or the wrong capacity type."""

HYPERPOD_PREFIX = "ml."
"""SageMaker's prefix on instance types (HyperPod node groups, and their nodes' labels)."""

HYPERPOD_HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
"""HyperPod's node health label: `Schedulable` once a node passed its health checks; during
deep health checks or pending reboot/replacement it says so (SageMaker developer guide,
"Resilience-related Kubernetes labels by SageMaker HyperPod", which has it used as a node
selector for healthy nodes; the HyperPod CLI requires it of every job it submits:
aws/sagemaker-hyperpod-cli `src/sagemaker/hyperpod/cli/constants/command_constants.py`
`NODE_AFFINITY_DICT`)."""


def is_hyperpod_type(instance_type: str) -> bool:
    """Whether this is a SageMaker (HyperPod) instance type name, e.g. ml.p5.48xlarge."""
    return instance_type.startswith(HYPERPOD_PREFIX)


def known_facts(instance_type: str) -> InstanceFacts | None:
    """Facts for an EC2 type or its HyperPod `ml.` name; None when neither is known."""
    return INSTANCE_FACTS.get(instance_type.removeprefix(HYPERPOD_PREFIX))


def instance_facts(instance_type: str) -> InstanceFacts:
    """Facts for `instance_type`; a KeyError's message lists the types that are known."""
    facts = known_facts(instance_type)
    if facts is None:
        known = ", ".join(sorted(INSTANCE_FACTS))
        raise KeyError(
            f"unknown GPU instance type {instance_type!r}; known: {known} (on SageMaker "
            f"HyperPod: the same with {HYPERPOD_PREFIX!r} in front)"
        )
    return facts


def scheduling_labels(instance_type: str) -> dict[str, str]:
    """Node labels, beyond the instance type, that the job's pods must select on nodes of this
    type: on HyperPod only nodes whose health checks passed, as HyperPod's own tooling does."""
    return {HYPERPOD_HEALTH_LABEL: "Schedulable"} if is_hyperpod_type(instance_type) else {}
