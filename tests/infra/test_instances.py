"""The instance facts table drives EFA counts, GPU requests and cost: pin the published values."""

import pytest

from infra.facts.instances import INSTANCE_FACTS, instance_facts


@pytest.mark.parametrize(
    ("instance_type", "gpus", "efa"),
    [
        ("p4d.24xlarge", 8, 4),
        ("p5.48xlarge", 8, 32),
        ("p5e.48xlarge", 8, 32),
        ("p5en.48xlarge", 8, 16),
        ("p6-b200.48xlarge", 8, 8),
        ("g5.8xlarge", 1, 1),
        ("g5.12xlarge", 4, 1),
        ("g5.48xlarge", 8, 1),
        ("g6e.48xlarge", 8, 4),
        ("g5.xlarge", 1, 0),
    ],
)
def test_published_gpu_and_efa_counts(instance_type: str, gpus: int, efa: int) -> None:
    facts = instance_facts(instance_type)
    assert (facts.gpus, facts.efa_interfaces) == (gpus, efa)


def test_gpudirect_rdma_only_on_p_family() -> None:
    for name, facts in INSTANCE_FACTS.items():
        assert facts.gpudirect_rdma == name.startswith("p"), name


def test_unknown_type_error_lists_known_types() -> None:
    with pytest.raises(KeyError, match=r"unknown GPU instance type 'm5\.large'.*p5\.48xlarge"):
        instance_facts("m5.large")
