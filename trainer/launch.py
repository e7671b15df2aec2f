"""`python3 -m trainer.launch <torchrun arguments>`: torchrun that exits with its workers' code.

The container's main process is torchrun's elastic agent, and its exit code is all the
training operator sees: under `restartPolicy: ExitCode` a code >= 128 restarts the pod and
anything else fails the job (training-operator v1.9.0 `pkg/util/train/train_util.go`). The
workers say why they ended (143: stopped on SIGTERM with a checkpoint saved; 142: the hang
watchdog; 140: the node failed its preflight), but torchrun exits 1 whenever a worker failed
or the agent itself was signalled: `torch/distributed/run.py` `main` lets the agent's
`ChildFailedError` or `SignalException` escape (`torch/distributed/launcher/api.py`
`launch_agent`), and Python ends with 1.

This module runs torchrun's own `main` (every flag and `PET_*` variable means what it means
to torchrun) and maps those two endings to exit codes:

* `ChildFailedError`: the exit code of the first worker that failed, the root cause torchrun
  itself reports (`ChildFailedError.get_first_failure`); a worker killed by signal N (a
  negative `ProcessFailure.exitcode`) becomes 128 + N, as a shell reports it.
* `SignalException`: the agent got SIGTERM (the kubelet stopping the pod: a spot
  interruption, a drain, the job's deadline); it has forwarded the signal to the workers and
  waited for them, up to its shutdown timeout, to save and exit (the agent's `_shutdown`,
  `torch/distributed/elastic/agent/server/api.py`). It exits 128 + the signal: 143 for
  SIGTERM, as the workers do after their stop checkpoint.

Anything else (a rendezvous that timed out, a bad flag) stays torchrun's own failure.
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
