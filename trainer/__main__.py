"""`python -m trainer` / `torchrun ... -m trainer`: parse flags, train, clean up."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from trainer.config import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    # Imported after parsing so that `--help` and flag errors answer without loading torch.
    from trainer.data import DataConfigError
    from trainer.preflight import PREFLIGHT_EXIT_CODE, PreflightError
    from trainer.train import Trainer

    try:
        trainer = Trainer(cfg)
    except PreflightError as error:
        # The node is not what the run was planned for: one line, and a retryable exit.
        from trainer.distributed import shutdown

        shutdown()
        print(f"trainer: {error}", file=sys.stderr)
        return PREFLIGHT_EXIT_CODE
    except DataConfigError as error:
        # A bad --dataset/--tokenizer is the user's to fix: one line naming the flag, no trace.
        from trainer.distributed import shutdown

        shutdown()
        print(f"trainer: error: {error}", file=sys.stderr)
        return 2
    except BaseException:
        # Leave the process group cleanly so the failure, not a teardown warning, is what
        # the log shows last.
        from trainer.distributed import shutdown

        shutdown()
        raise
    from trainer.preemption import PreemptedError

    try:
        trainer.train()
    except PreemptedError as stop:
        # Saved and recorded: the pod is going away (or the deadline came), not a crash.
        return stop.exit_code
    finally:
        trainer.close()
    return 0


def exit_without_finalization(code: int) -> None:
    """Leave the process without the interpreter's finalization, once the run is closed.

    The process group is destroyed and every file written and closed by then; what is left is
    CPython tearing down modules while C++ threads of torch.distributed (gloo's work threads,
    the store's) may still hold objects with Python references. Destroying those during
    finalization takes the GIL of a dying interpreter and aborts the process (SIGABRT,
    "terminate called without an active exception": pytorch/pytorch#190489, and the analysis
    in pytorch/pytorch#179291, abandoned upstream). A finished run seen to abort after its
    export makes the operator restart it, so skip what there is nothing left to do in.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalization(main())
