"""Deployed stacks hold the start watch's dynamic provider pickled (by dill, by reference) at
this module path; the engine unpickles it for every later diff, update and delete. The
provider lives in `infra.launch.start_watch`; this name must stay importable."""

from infra.launch.start_watch import JobStartWatchProvider

__all__ = ["JobStartWatchProvider"]
