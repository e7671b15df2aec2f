"""Kubeflow Trainer v2 under the mock runtime: the pinned chart (CRDs and JobSet with it) for a
TrainJob on a created cluster, instead of the v1 training operator; nothing on an existing one."""

from __future__ import annotations

from collections.abc import Callable

import pulumi
import pulumi_kubernetes as k8s

from infra.config.addons import AddonsConfig
from infra.job.placement import Placement
from infra.offline import Evaluation, evaluate
from infra.offline.runtime import RecordedResource
from infra.platform.addons import Addons, AddonsArgs

RELEASE = "kubernetes:helm.sh/v3:Release"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
TRAINER_CHART = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
SYSTEM = {"fsdp-eks/node-role": "system"}


def addons_program(job_api: str, *, owns_cluster: bool) -> Callable[[], None]:
    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="{}")
        nodes = k8s.core.v1.ConfigMap(
            "node-group-stand-in", opts=pulumi.ResourceOptions(provider=provider)
        )
        addons = Addons(
            "addons",
            AddonsArgs(
                config=AddonsConfig(),
                k8s_provider=provider,
                gpu_placement=Placement({"fsdp-eks/node-role": "gpu"}, []),
                efa_enabled=False,
                cluster_ready=[nodes],
                operator_node_selector=SYSTEM,
                job_api=job_api,
                owns_cluster=owns_cluster,
            ),
        )
        pulumi.export("ready", [resource.urn for resource in addons.ready])

    return program


def run(job_api: str, *, owns_cluster: bool = True) -> Evaluation:
    return evaluate(addons_program(job_api, owns_cluster=owns_cluster), config={})


def trainer_releases(result: Evaluation) -> list[RecordedResource]:
    return [r for r in result.of_type(RELEASE) if r.inputs["chart"] == TRAINER_CHART]


def test_a_trainjob_gets_the_pinned_trainer_chart_and_no_v1_operator() -> None:
    result = run("trainjob")
    [chart] = trainer_releases(result)
    assert chart.inputs["version"] == "2.3.0"  # kubeflow/trainer v2.3.0 charts/.../Chart.yaml
    assert chart.inputs["namespace"] == "kubeflow-system"
    assert chart.inputs["createNamespace"] is True
    values = chart.inputs["values"]
    # CRDs and JobSet as the release ships them (chart values `crds.enabled`, `jobset.install`).
    assert values["crds"] == {"enabled": True}
    assert values["jobset"]["install"] is True
    assert values["jobset"]["controller"]["nodeSelector"] == SYSTEM
    assert values["manager"]["nodeSelector"] == SYSTEM
    assert values["runtimes"] == {"defaultEnabled": False}
    assert not [d for d in result.of_type(DEPLOYMENT) if "training-operator" in d.name]
    assert chart.urn in result.stack_outputs["ready"]
    stand_in = result.one("kubernetes:core/v1:ConfigMap")
    assert stand_in.urn in chart.dependencies


def test_an_existing_cluster_gets_nothing_for_a_trainjob() -> None:
    result = run("trainjob", owns_cluster=False)
    assert trainer_releases(result) == []
    assert not [d for d in result.of_type(DEPLOYMENT) if "training-operator" in d.name]


def test_a_pytorchjob_still_gets_the_training_operator_only() -> None:
    result = run("pytorchjob")
    assert trainer_releases(result) == []
    assert [d for d in result.of_type(DEPLOYMENT) if "training-operator" in d.name]
