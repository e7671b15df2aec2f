"""Fixtures shared by the infra tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crd_schemas import openapi_schema

CRD_PATH = (
    Path(__file__).resolve().parents[2].parent
    / "shared/schemas/kubeflow.org_pytorchjobs.v1.9.0.yaml"
)
"""The training operator's published PyTorchJob CRD. It lives in shared/ beside the checkout
(reference data, not ours to copy into the repository)."""


@pytest.fixture(scope="session")
def crd_schema() -> dict[str, Any]:
    """The v1 `openAPIV3Schema` of the PyTorchJob CRD, parsed once per test session."""
    if not CRD_PATH.exists():
        pytest.skip(f"{CRD_PATH} is not present (shared/ lives outside the repository)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is ~600 KB
    crd = yaml.load(CRD_PATH.read_text(), Loader=loader)
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="session")
def trainjob_schema() -> dict[str, Any]:
    """Kubeflow Trainer v2.3.0's TrainJob CRD schema (v1alpha1; tests/schemas/SOURCES.md)."""
    return openapi_schema("trainer.kubeflow.org_trainjobs.v2.3.0.yaml", "v1alpha1")


@pytest.fixture(scope="session")
def trainingruntime_schema() -> dict[str, Any]:
    """Kubeflow Trainer v2.3.0's TrainingRuntime CRD schema (v1alpha1)."""
    return openapi_schema("trainer.kubeflow.org_trainingruntimes.v2.3.0.yaml", "v1alpha1")
