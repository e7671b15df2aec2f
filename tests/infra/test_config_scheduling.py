"""The `scheduling` section: Kueue created or the cluster's queue, refused where it cannot work,
one line naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.errors import StackConfigError
from infra.config.parse import parse_stack_config
from infra.config.scheduling import DEFAULT_LOCAL_QUEUE, SchedulingConfig

BASE: dict[str, Any] = {
    "gpuNodes": {"instanceType": "p4d.24xlarge", "count": 2},
    "cost": {"maxRunHours": 1},
    "storage": {"fsx": {"enabled": False}},
}
EXISTING = {"mode": "existing", "name": "team"}
EXISTING_OBS = {"enabled": False}


def _parse(**sections: Any) -> Any:
    return parse_stack_config({**BASE, **sections}, stack_name="dev")


def _error(**sections: Any) -> str:
    with pytest.raises(StackConfigError) as raised:
        _parse(**sections)
    return str(raised.value)


def test_every_field_has_a_description() -> None:
    assert [n for n, f in SchedulingConfig.model_fields.items() if not f.description] == []


def test_default_submits_directly() -> None:
    scheduling = _parse().scheduling
    assert (scheduling.kueue, scheduling.queue, scheduling.priority_class) == (False, None, None)
    assert not scheduling.queued and scheduling.local_queue is None


def test_created_kueue_has_its_own_queue_named_or_defaulted() -> None:
    assert _parse(scheduling={"kueue": True}).scheduling.local_queue == DEFAULT_LOCAL_QUEUE
    named = _parse(scheduling={"kueue": True, "queue": "runs"}).scheduling
    assert named.queued and named.local_queue == "runs"


def test_existing_cluster_queue_and_priority() -> None:
    scheduling = _parse(
        cluster=EXISTING,
        observability=EXISTING_OBS,
        scheduling={"queue": "hyperpod-ns-team-a-localqueue", "priorityClass": "training-priority"},
    ).scheduling
    assert scheduling.local_queue == "hyperpod-ns-team-a-localqueue"
    assert scheduling.priority_class == "training-priority"


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        # A queue in create mode without Kueue: nothing would admit the job.
        ({"scheduling": {"queue": "runs"}}, ("scheduling.queue", "scheduling.kueue")),
        # Kueue installed on a cluster the stack does not own.
        (
            {"cluster": EXISTING, "observability": EXISTING_OBS, "scheduling": {"kueue": True}},
            ("scheduling.kueue", "cluster.mode existing"),
        ),
        # A priority class with no queue: Kueue never sees the job.
        (
            {
                "cluster": EXISTING,
                "observability": EXISTING_OBS,
                "scheduling": {"priorityClass": "high"},
            },
            ("scheduling.priorityClass", "scheduling.queue"),
        ),
        (
            {"scheduling": {"kueue": True, "priorityClass": "high"}},
            ("scheduling.priorityClass", "cluster.mode"),
        ),
        # The admission check needs the autoscaler that serves ProvisioningRequests.
        (
            {
                "scheduling": {"kueue": True},
                "addons": {"clusterAutoscaler": {"install": False}},
            },
            ("scheduling.kueue", "addons.clusterAutoscaler.install"),
        ),
        ({"scheduling": {"kueue": True, "queue": "Runs_1"}}, ("scheduling.queue", "'Runs_1'")),
        (
            {"scheduling": {"kueue": True, "queue": "q" * 64}},
            ("scheduling.queue", "63 characters"),
        ),
        (
            {
                "cluster": EXISTING,
                "observability": EXISTING_OBS,
                "scheduling": {"queue": "q", "priorityClass": "-high"},
            },
            ("scheduling.priorityClass", "'-high'"),
        ),
        # The cluster's LocalQueue cannot be in a namespace the stack creates.
        (
            {
                "cluster": EXISTING,
                "observability": EXISTING_OBS,
                "job": {"createNamespace": True},
                "scheduling": {"queue": "team-q"},
            },
            ("scheduling.queue", "job.createNamespace"),
        ),
        ({"scheduling": {"kueu": True}}, ("kueu",)),
        ({"scheduling": {"kueue": "sometimes"}}, ("scheduling.kueue",)),
    ],
)
def test_refused_with_one_line_naming_the_key(sections: dict[str, Any], names: tuple[str]) -> None:
    message = _error(**sections)
    lines = [line for line in message.splitlines() if "scheduling" in line or "kueu" in line]
    assert len(lines) == 1, message
    for name in names:
        assert name in lines[0], message
