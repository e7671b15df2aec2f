"""`job.api` and what a TrainJob needs: refused at plan time, one line naming the key, with
nothing registered (the real program under the mock runtime, as tests/infra/test_config.py)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfigError, parse_stack_config
from infra.offline import evaluate, runtime
from infra.program import main as program

G5: dict[str, Any] = {
    "cluster": {"publicAccessCidrs": ["0.0.0.0/0"]},
    "gpuNodes": {"instanceType": "g5.8xlarge", "count": 2},
    "job": {"maxRunHours": 1},
    "model": {"preset": "llama3.2-1b"},
    "training": {"maxSteps": 50},
    "storage": {"fsx": {"storageCapacityGiB": 1200, "perUnitStorageThroughput": 125}},
    "cost": {"maxUsdPerRun": 100},
}
EXISTING: dict[str, Any] = {
    **G5,
    "cluster": {"mode": "existing", "name": "ml-team-cluster"},
    "storage": {
        "fsx": {"existingClaimName": "fsx-claim"},
        "bucket": {"create": False, "name": "ml-team-data"},
    },
    "job": {"maxRunHours": 1, "api": "trainjob", "namespace": "team-ml", "createNamespace": False},
}


def _with(base: dict[str, Any], section: str, **keys: Any) -> dict[str, Any]:
    return {**base, section: {**base.get(section, {}), **keys}}


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown api",
        _with(G5, "job", api="mpijob"),
        "job.api",
    ),
    (
        "trainjob on an existing cluster that does not declare Trainer v2",
        EXISTING,
        "job.api 'trainjob' on an existing cluster needs Kubeflow Trainer v2 there (the stack "
        "installs nothing on it): check with `kubectl get crd trainjobs.trainer.kubeflow.org`",
    ),
    (
        "trainerV2 declared false",
        _with(EXISTING, "cluster", trainerV2=False),
        "then set cluster.trainerV2: true",
    ),
    (
        "trainerV2 in create mode",
        _with(_with(G5, "job", api="trainjob"), "cluster", trainerV2=True),
        "cluster.trainerV2 is only read in cluster.mode 'existing'",
    ),
    (
        "trainerV2 with a PyTorchJob",
        _with(_with(EXISTING, "job", api="pytorchjob"), "cluster", trainerV2=True),
        "cluster.trainerV2 is only read with job.api 'trainjob' (here 'pytorchjob')",
    ),
    (
        "cleanPodPolicy without a TrainJob counterpart",
        _with(G5, "job", api="trainjob", cleanPodPolicy="All"),
        "job.cleanPodPolicy 'All' has no TrainJob counterpart",
    ),
    (
        "a JobSet TTL, which Trainer v2.3.0 answers by starting a failed run again",
        _with(G5, "job", api="trainjob", ttlHoursAfterFinished=2),
        "job.ttlHoursAfterFinished is not used with job.api 'trainjob'",
    ),
    (
        "a job name JobSet's pod names cannot hold at 11 nodes",
        _with(_with(G5, "job", api="trainjob", name="a" * 48), "gpuNodes", count=11),
        "job.name '" + "a" * 48 + "' (48 characters) is too long for a TrainJob of 11 nodes",
    ),
    (
        "training operator settings with a TrainJob",
        {**_with(G5, "job", api="trainjob"), "addons": {"trainingOperator": {"namespace": "kf"}}},
        "addons.trainingOperator is not used with job.api 'trainjob'",
    ),
]


@pytest.fixture
def registrations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    recorded: list[str] = []
    original = runtime._RecordingMonitor.RegisterResource

    def spy(self: Any, request: Any) -> Any:
        if request.type != "pulumi:pulumi:Stack":
            recorded.append(request.type)
        return original(self, request)

    monkeypatch.setattr(runtime._RecordingMonitor, "RegisterResource", spy)
    return recorded


@pytest.mark.parametrize(("values", "message"), [pytest.param(v, m, id=c) for c, v, m in REFUSED])
def test_what_cannot_work_is_refused_before_any_resource(
    values: dict[str, Any], message: str, registrations: list[str]
) -> None:
    with pytest.raises(StackConfigError) as caught:
        evaluate(program, config=values, stack="exp")
    assert message in str(caught.value), str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems
    assert "\n" not in caught.value.problems[0]
    assert registrations == []


def test_an_unknown_api_names_the_allowed_ones() -> None:
    with pytest.raises(StackConfigError) as caught:
        parse_stack_config(_with(G5, "job", api="mpijob"), stack_name="exp")
    [line] = caught.value.problems
    assert "job.api" in line and "'mpijob'" in line and "pytorchjob" in line and "trainjob" in line


def test_the_default_api_is_the_pytorchjob() -> None:
    assert parse_stack_config(G5, stack_name="exp").job.api == "pytorchjob"


def test_an_existing_cluster_that_declares_trainer_v2_plans() -> None:
    config = parse_stack_config(_with(EXISTING, "cluster", trainerV2=True), stack_name="exp")
    assert config.job.api == "trainjob" and config.cluster.trainer_v2 is True
