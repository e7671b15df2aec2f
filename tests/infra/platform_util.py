"""The real platform components, wired as `infra.program` wires them, for component tests."""

from __future__ import annotations

from typing import Any

from infra.config import StackConfig, parse_stack_config
from infra.platform.cluster import Cluster, ClusterArgs
from infra.platform.network import Network, NetworkArgs


def real_platform(gpu_nodes: dict[str, Any]) -> tuple[StackConfig, Cluster]:
    """A stack's config and its real Network + Cluster, as `infra.program` wires them.

    For component tests that check wiring against the real cluster's outputs; call inside a
    program evaluated with `infra.offline.evaluate`.
    """
    stack = parse_stack_config(
        {"gpuNodes": gpu_nodes, "cost": {"maxUsdPerRun": None}}, stack_name="dev"
    )
    network = Network(
        "network",
        NetworkArgs(
            config=stack.cluster.network,
            gpu_availability_zone=None,
            gpu_instance_type=stack.gpu_nodes.instance_type,
            tags={},
        ),
    )
    cluster = Cluster(
        "platform",
        ClusterArgs(cluster=stack.cluster, gpu_nodes=stack.gpu_nodes, network=network, tags={}),
    )
    return stack, cluster
