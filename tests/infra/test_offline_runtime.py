"""The offline runtime must evaluate programs with cross-resource references reliably.

The brief's known trap: resources passed as inputs (pulumi-eks node groups' `cluster=`) can make
the mock path await a future from another event loop. Evaluate such a program repeatedly in one
process; a single hang or error fails the test.
"""

import json
import logging
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s
import pytest

from infra.offline import evaluate


def referencing_program() -> None:
    config = pulumi.Config()
    role = aws.iam.Role(
        "nodes",
        assume_role_policy=aws.iam.get_policy_document_output(
            statements=[
                {
                    "actions": ["sts:AssumeRole"],
                    "principals": [{"type": "Service", "identifiers": ["ec2.amazonaws.com"]}],
                }
            ]
        ).json,
    )
    cluster = eks.Cluster(
        "cluster",
        name=config.require("clusterName"),
        skip_default_node_group=True,
        instance_roles=[role],
    )
    eks.ManagedNodeGroup("gpu", cluster=cluster, node_role=role, instance_types=["p5.48xlarge"])
    provider = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig_json)
    namespace = k8s.core.v1.Namespace(
        "ns", metadata={"name": "training"}, opts=pulumi.ResourceOptions(provider=provider)
    )
    pulumi.export("namespace", namespace.metadata.apply(lambda m: m["name"]))
    pulumi.export(
        "kubeconfig_server",
        cluster.kubeconfig_json.apply(
            lambda text: json.loads(text)["clusters"][0]["cluster"]["server"]
        ),
    )


@pytest.mark.parametrize("attempt", range(15))
def test_references_between_resources_evaluate_reliably(attempt: int) -> None:
    result = evaluate(referencing_program, config={"clusterName": f"c{attempt}"})
    node_group = result.one("eks:index:ManagedNodeGroup")
    cluster = result.one("eks:index:Cluster")
    assert node_group.inputs["cluster"] == cluster.urn
    assert node_group.inputs["instanceTypes"] == ["p5.48xlarge"]
    assert result.stack_outputs["namespace"] == "training"
    assert result.stack_outputs["kubeconfig_server"].endswith(".eks.amazonaws.com")
    namespace = result.one("kubernetes:core/v1:Namespace")
    assert namespace.provider.startswith(result.one("pulumi:providers:kubernetes").urn)


def test_policy_document_renders_iam_json() -> None:
    result = evaluate(referencing_program, config={"clusterName": "c"})
    policy = json.loads(result.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    assert policy["Statement"] == [
        {
            "Effect": "Allow",
            "Action": "sts:AssumeRole",
            "Principal": {"Service": "ec2.amazonaws.com"},
        }
    ]


def test_program_error_propagates_after_registrations_settle() -> None:
    def failing() -> None:
        aws.s3.Bucket("data")
        raise ValueError("config key 'gpuNodes.count' must be >= 1")

    with pytest.raises(ValueError, match=r"gpuNodes\.count"):
        evaluate(failing, config={})


def test_dependencies_are_recorded() -> None:
    def program() -> None:
        first = aws.s3.Bucket("first")
        aws.s3.Bucket("second", opts=pulumi.ResourceOptions(depends_on=[first]))

    result = evaluate(program, config={})
    assert result.depends_on(
        result.one("aws:s3/bucket:Bucket", "second"), result.one("aws:s3/bucket:Bucket", "first")
    )
    assert not result.depends_on(
        result.one("aws:s3/bucket:Bucket", "first"), result.one("aws:s3/bucket:Bucket", "second")
    )


def test_evaluation_after_a_failed_one_starts_clean() -> None:
    def failing_with_pending_outputs() -> None:
        bucket = aws.s3.Bucket("pending")
        bucket.arn.apply(lambda value: value.upper())
        raise ValueError("stop")

    with pytest.raises(ValueError, match="stop"):
        evaluate(failing_with_pending_outputs, config={})
    result = evaluate(referencing_program, config={"clusterName": "after"})
    assert result.stack_outputs["namespace"] == "training"


def test_instance_type_invoke_matches_the_sdk_result_shape() -> None:
    def program() -> None:
        found = aws.ec2.get_instance_type_output(instance_type="p5en.48xlarge")
        pulumi.export("gpus", found.gpuses.apply(lambda gpus: gpus[0].count))
        pulumi.export("efa", found.efa_maximum_interfaces)

    result = evaluate(program, config={})
    assert result.stack_outputs == {"gpus": 8, "efa": 16}


def test_offerings_invoke_answers_each_location_type_in_the_sdk_result_shape() -> None:
    def program() -> None:
        for location_type in ("availability-zone", "availability-zone-id", "region"):
            found = aws.ec2.get_instance_type_offerings_output(
                filters=[{"name": "instance-type", "values": ["p5.48xlarge"]}],
                location_type=location_type,
            )
            pulumi.export(location_type, found.locations)
        cpu = aws.ec2.get_instance_type_offerings_output(
            filters=[{"name": "instance-type", "values": ["m6i.xlarge"]}],
            location_type="availability-zone",
        )
        pulumi.export("cpu", cpu.locations)

    outputs = evaluate(program, config={}).stack_outputs
    # The mock region's one dated fact: usw2-az4 (us-west-2d here) offers no GPU type.
    assert outputs["availability-zone"] == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert outputs["availability-zone-id"] == ["usw2-az1", "usw2-az2", "usw2-az3"]
    assert outputs["region"] == ["us-west-2"]
    assert outputs["cpu"] == ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]


def test_each_evaluation_keeps_its_own_warnings_and_no_logger_outlives_it() -> None:
    """A logger per evaluation stayed in logging's registry for good, and pytest attaches its
    handler to every non-propagating logger there before each test phase."""

    def warning(text: str) -> Any:
        def program() -> None:
            pulumi.log.warn(text)

        return program

    registry = logging.Logger.manager.loggerDict
    first = evaluate(warning("first"), config={})
    loggers = len(registry)
    second = evaluate(warning("second"), config={})
    assert (first.warnings, second.warnings) == (["first"], ["second"])
    assert len(registry) == loggers
    assert logging.getLogger("fsdp-eks.offline").handlers == []
