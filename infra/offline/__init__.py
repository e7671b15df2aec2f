"""Offline evaluation of the Pulumi program: the SDK's mock runtime with AWS-shaped answers."""

from infra.offline.outputs import FakeCloud
from infra.offline.runtime import Evaluation, RecordedResource, evaluate

__all__ = ["Evaluation", "FakeCloud", "RecordedResource", "evaluate"]
