"""`python3 -m trainer.launch <torchrun arguments>`: torchrun that exits with its workers' code.

The training operator sees only the container's exit code (>= 128 restarts under
`restartPolicy: ExitCode`, training-operator v1.9.0 `pkg/util/train/train_util.go`), but
torchrun exits 1 for any failed worker or signal (`torch/distributed/run.py` `main`). This runs
torchrun's own `main` and maps `ChildFailedError` to the first failed worker's code (128 + N for
signal N) and `SignalException` to 128 + the signal; anything else stays torchrun's failure.
Why and sources: docs/design/trainer.md#launch
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def worker_exit_code(exitcode: int) -> int:
    """A worker's `ProcessFailure.exitcode` as a process exit code (signals as 128 + N)."""
    return 128 - exitcode if exitcode < 0 else exitcode


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(list(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        code = worker_exit_code(failure.exitcode)
        # torchrun's own report of every failed worker, which an uncaught error would print.
        sys.stderr.write(
            f"{failed}\ntrainer.launch: rank {rank} exited with {failure.exitcode}; "
            f"exiting with {code}\n"
        )
        return code
    except SignalException as stopped:
        code = 128 + int(stopped.sigval)
        sys.stderr.write(
            f"trainer.launch: {stopped.sigval.name} received and passed on to the workers; "
            f"exiting with {code}\n"
        )
        return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
