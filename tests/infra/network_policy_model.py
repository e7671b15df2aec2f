"""What Kubernetes NetworkPolicy lets through, as the API defines it and EKS enforces it.

A pure model for "may this pod reach that port?": `networking.k8s.io/v1` semantics
(Kubernetes docs, "Network Policies") plus the VPC CNI agent's exceptions
(aws/aws-network-policy-agent v1.4.1); `enforced=False` allows everything.
The rules, with sources: docs/design/tests.md#network_policy_model
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod, or something outside the pod network (a node, the API
    server's ENI, S3, the Pod Identity agent's link-local address)."""

    name: str
    ip: str
    namespace: str | None = None
    """None: not a pod."""
    labels: Mapping[str, str] = field(default_factory=dict)
    host_network: bool = False
    node_ip: str | None = None
    """The node a pod runs on."""
    ports: Mapping[str, int] = field(default_factory=dict)
    """Named container ports (a policy port may name one)."""

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


@dataclass(frozen=True)
class Cluster:
    policies: Sequence[Mapping[str, Any]]
    """NetworkPolicy objects (`metadata`, `spec` as the API takes them)."""
    namespace_labels: Mapping[str, Mapping[str, str]]
    enforced: bool = True


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector over `labels`: `{}` selects everything."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def policy_types(spec: Mapping[str, Any]) -> list[str]:
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def _port_matches(
    ports: Sequence[Mapping[str, Any]] | None, target: Endpoint, port: int, protocol: str
) -> bool:
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):
            wanted = target.ports.get(wanted)
        if wanted == port or (wanted is not None and wanted <= port <= entry.get("endPort", -1)):
            return True
    return False


def _peer_matches(
    peer: Mapping[str, Any], other: Endpoint, policy_namespace: str, cluster: Cluster
) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", [])
        )
    if not other.is_pod:
        return False  # selectors name pods only
    assert other.namespace is not None
    if "namespaceSelector" in peer:
        namespace_ok = selects(
            peer["namespaceSelector"], cluster.namespace_labels.get(other.namespace, {})
        )
    else:
        namespace_ok = other.namespace == policy_namespace
    return namespace_ok and selects(peer.get("podSelector"), other.labels)


def _rule_allows(
    rule: Mapping[str, Any],
    peers_key: str,
    other: Endpoint,
    target: Endpoint,
    port: int,
    protocol: str,
    policy_namespace: str,
    cluster: Cluster,
) -> bool:
    peers = rule.get(peers_key)
    peer_ok = not peers or any(
        _peer_matches(peer, other, policy_namespace, cluster) for peer in peers
    )
    return peer_ok and _port_matches(rule.get("ports"), target, port, protocol)


def _isolating(cluster: Cluster, pod: Endpoint, direction: str) -> list[Mapping[str, Any]]:
    return [
        policy
        for policy in cluster.policies
        if policy["metadata"]["namespace"] == pod.namespace
        and selects(policy["spec"].get("podSelector"), pod.labels)
        and direction in policy_types(policy["spec"])
    ]


def _policies_allow(
    cluster: Cluster,
    direction: str,
    pod: Endpoint,
    other: Endpoint,
    target: Endpoint,
    port: int,
    protocol: str,
) -> bool:
    """One direction of `pod`'s traffic with `other`: open unless a policy isolates the pod in
    that direction, then admitted by any rule of those policies (its peers, and its ports as
    `target` names them)."""
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    policies = _isolating(cluster, pod, direction)
    return not policies or any(
        _rule_allows(rule, peers_key, other, target, port, protocol,
                     policy["metadata"]["namespace"], cluster)
        for policy in policies
        for rule in policy["spec"].get(rules_key) or []
    )  # fmt: skip


def ingress_allowed(
    cluster: Cluster, source: Endpoint, target: Endpoint, port: int, protocol: str
) -> bool:
    if not target.is_pod or target.host_network:
        return True
    if source.ip == target.node_ip:
        return True  # the agent always admits the local node (kubelet's probes)
    return _policies_allow(cluster, "Ingress", target, source, target, port, protocol)


def egress_allowed(
    cluster: Cluster, source: Endpoint, target: Endpoint, port: int, protocol: str
) -> bool:
    if not source.is_pod or source.host_network:
        return True
    return _policies_allow(cluster, "Egress", source, target, target, port, protocol)


def allowed(
    cluster: Cluster, source: Endpoint, target: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether `source` may open a connection to `target`:`port`."""
    if not cluster.enforced:
        return True
    return egress_allowed(cluster, source, target, port, protocol) and ingress_allowed(
        cluster, source, target, port, protocol
    )
