"""The field-management model (`tests/infra/ssa_model.py`) against the real rule's own tests.

Each case is a test table entry of kubernetes-sigs/structured-merge-diff v6.4.0 (the version
pulumi-kubernetes v4.32.0 and Kubernetes v0.36.1 use), played through the model with the same
operations, managers and objects, and checked against the table's expected object, managed
field sets and conflicts. One API version throughout (the PyTorchJob has one); where a case
uses an associative list, its item is written as a map entry keyed by the item's key (how the
library addresses it, `k:{"name":"a"}`), and where the expected set holds a map node an update
added (`_P("struct")`), that node is left out: the model tracks leaves (its docstring says so).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.ssa_model import APPLY, UPDATE, ApiServer, ConflictError, Manager, Path


def bare() -> ApiServer:
    """An API server holding one empty object, no defaults: the library's test fixture."""
    server = ApiServer(defaults={})
    server.obj = {}
    return server


def apply(server: ApiServer, manager: str, obj: dict[str, Any], force: bool = False) -> None:
    server.apply("", obj, manager, force=force)


def update(server: ApiServer, manager: str, obj: dict[str, Any]) -> None:
    server.update("", obj, manager)


def content(server: ApiServer) -> dict[str, Any]:
    assert server.obj is not None
    return {k: v for k, v in server.obj.items() if k != "metadata"}


def managed(server: ApiServer) -> dict[tuple[str, str], set[Path]]:
    return {(m.name, m.operation): s for m, s in server.managers.items()}


# --- merge/leaf_test.go TestUpdateLeaf ------------------------------------------------------


def test_leaf_apply_twice() -> None:
    server = bare()
    apply(server, "default", {"numeric": 1, "string": "string"})
    apply(server, "default", {"numeric": 2, "string": "string", "bool": False})
    assert content(server) == {"numeric": 2, "string": "string", "bool": False}
    assert managed(server) == {("default", APPLY): {("numeric",), ("string",), ("bool",)}}


def test_leaf_apply_update_apply_no_conflict() -> None:
    server = bare()
    apply(server, "default", {"numeric": 1, "string": "string"})
    update(server, "controller", {"numeric": 1, "string": "string", "bool": True})
    apply(server, "default", {"numeric": 2, "string": "string"})
    assert content(server) == {"numeric": 2, "string": "string", "bool": True}
    assert managed(server) == {
        ("default", APPLY): {("numeric",), ("string",)},
        ("controller", UPDATE): {("bool",)},
    }


def test_leaf_apply_update_apply_with_conflict() -> None:
    server = bare()
    apply(server, "default", {"numeric": 1, "string": "string"})
    update(server, "controller", {"numeric": 1, "string": "controller string", "bool": True})
    with pytest.raises(ConflictError) as refused:
        apply(server, "default", {"numeric": 2, "string": "user string"})
    assert refused.value.conflicts == {Manager("controller", UPDATE): {("string",)}}
    apply(server, "default", {"numeric": 2, "string": "user string"}, force=True)  # ForceApply
    assert content(server) == {"numeric": 2, "string": "user string", "bool": True}
    assert managed(server) == {
        ("default", APPLY): {("numeric",), ("string",)},
        ("controller", UPDATE): {("bool",)},
    }


def test_leaf_apply_twice_remove() -> None:
    server = bare()
    apply(server, "default", {"numeric": 1, "string": "string", "bool": False})
    apply(server, "default", {"string": "new string"})
    assert content(server) == {"string": "new string"}
    assert managed(server) == {("default", APPLY): {("string",)}}


def test_leaf_update_apply_omits() -> None:
    server = bare()
    apply(server, "default", {"numeric": 2})
    update(server, "controller", {"numeric": 1})
    apply(server, "default", {})
    assert content(server) == {"numeric": 1}
    assert managed(server) == {("controller", UPDATE): {("numeric",)}}


def test_leaf_update_remove_empty_set() -> None:
    server = bare()
    apply(server, "default", {"string": "string"})
    update(server, "controller", {"string": "new string"})
    assert content(server) == {"string": "new string"}
    assert managed(server) == {("controller", UPDATE): {("string",)}}


# --- merge/multiple_appliers_test.go ----------------------------------------------------------


def item(value: int) -> dict[str, Any]:
    """`list: [{name: a, value: V}]`, the associative list item addressed by its key."""
    return {"list": {"a": {"name": "a", "value": value}}}


ITEM_FIELDS = {("list", "a", "name"), ("list", "a", "value")}


def test_multiple_appliers_same_value_no_conflict() -> None:
    server = bare()
    apply(server, "apply-one", item(0))
    apply(server, "apply-two", item(0))
    assert content(server) == item(0)
    assert managed(server) == {("apply-one", APPLY): ITEM_FIELDS, ("apply-two", APPLY): ITEM_FIELDS}


def test_multiple_appliers_change_value_yes_conflict() -> None:
    server = bare()
    apply(server, "apply-one", item(0))
    with pytest.raises(ConflictError) as refused:
        apply(server, "apply-two", item(1))
    assert refused.value.conflicts == {Manager("apply-one", APPLY): {("list", "a", "value")}}
    assert content(server) == item(0)
    assert managed(server) == {("apply-one", APPLY): ITEM_FIELDS}


def test_field_unsetting_unset_scalar_sole_owner() -> None:
    server = bare()
    apply(server, "apply-one", {"struct": {"name": "a", "scalarField_v1": "a"}})
    apply(server, "apply-one", {"struct": {"name": "a"}})
    assert content(server) == {"struct": {"name": "a"}}
    assert managed(server) == {("apply-one", APPLY): {("struct", "name")}}


def test_field_unsetting_unset_scalar_shared_with_applier() -> None:
    server = bare()
    apply(server, "apply-one", {"struct": {"name": "a", "scalarField_v1": "a"}})
    apply(server, "apply-two", {"struct": {"scalarField_v1": "a"}})
    apply(server, "apply-one", {"struct": {"name": "a"}})
    assert content(server) == {"struct": {"name": "a", "scalarField_v1": "a"}}
    assert managed(server) == {
        ("apply-one", APPLY): {("struct", "name")},
        ("apply-two", APPLY): {("struct", "scalarField_v1")},
    }


def test_field_unsetting_unset_scalar_shared_with_updater() -> None:
    server = bare()
    update(server, "updater", {"struct": {"name": "a", "scalarField_v1": "a"}})
    apply(server, "applier", {"struct": {"name": "a", "scalarField_v1": "a"}})
    apply(server, "applier", {"struct": {"name": "a"}})
    assert content(server) == {"struct": {"name": "a", "scalarField_v1": "a"}}
    assert managed(server) == {
        ("updater", UPDATE): {("struct", "name"), ("struct", "scalarField_v1")},
        ("applier", APPLY): {("struct", "name")},
    }


def test_field_unsetting_updater_claims_field() -> None:
    server = bare()
    apply(server, "applier", {"struct": {"name": "a", "scalarField_v1": "a"}})
    update(server, "updater", {"struct": {"name": "a", "scalarField_v1": "b"}})
    assert content(server) == {"struct": {"name": "a", "scalarField_v1": "b"}}
    assert managed(server) == {
        ("updater", UPDATE): {("struct", "scalarField_v1")},
        ("applier", APPLY): {("struct", "name")},
    }


# --- the API server layer around the library --------------------------------------------------


def test_conflicts_are_reported_in_the_api_servers_words() -> None:
    """apimachinery v0.36.1 `internal/conflict.go` `NewConflictError` / `printManager`, and
    `pkg/api/errors` `NewApplyConflict`: 409, reason Conflict, one FieldManagerConflict cause
    per field; an updater is named with its API version."""
    server = ApiServer()
    server.create(
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "exp"},
         "spec": {"runPolicy": {}}},
        "pulumi-kubernetes",
    )  # fmt: skip
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "exp"},
            "spec": {"runPolicy": {"suspend": True}}}  # fmt: skip
    with pytest.raises(ConflictError) as refused:
        server.apply("exp", body, "fsdp-eks")
    status = refused.value.status()
    assert status["code"] == 409 and status["reason"] == "Conflict"
    assert status["message"] == (
        'Apply failed with 1 conflict: conflict with "pulumi-kubernetes" using kubeflow.org/v1: '
        ".spec.runPolicy.suspend"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "pulumi-kubernetes" using kubeflow.org/v1',
            "field": ".spec.runPolicy.suspend",
        }
    ]


def test_identity_fields_are_never_owned_and_the_creator_owns_the_crd_default() -> None:
    """stripmeta.go: apiVersion, kind, metadata.name/namespace belong to nobody; the CRD's
    default is decoded into the create, so its manager owns it (create.go `UpdateNoErrors`
    on the decoded, defaulted object)."""
    server = ApiServer()
    server.create(
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
         "metadata": {"name": "exp", "namespace": "training", "labels": {"a": "b"}},
         "spec": {"runPolicy": {"backoffLimit": 3}}},
        "pulumi-kubernetes",
    )  # fmt: skip
    assert managed(server) == {
        ("pulumi-kubernetes", UPDATE): {
            ("metadata", "labels", "a"),
            ("spec", "runPolicy", "backoffLimit"),
            ("spec", "runPolicy", "suspend"),
        }
    }
    [entry] = server.get("exp")["metadata"]["managedFields"]
    assert entry["fieldsType"] == "FieldsV1"
    assert entry["fieldsV1"]["f:spec"] == {"f:runPolicy": {"f:backoffLimit": {}, "f:suspend": {}}}
