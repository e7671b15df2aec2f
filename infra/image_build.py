"""Deployed stacks hold the image build's dynamic provider pickled (by dill, by reference) at
this module path; the engine unpickles it for every later diff, update and delete. The
provider lives in `infra.image.build`; this name must stay importable."""

from infra.image.build import ImageBuildProvider

__all__ = ["ImageBuildProvider"]
