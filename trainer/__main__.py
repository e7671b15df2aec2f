"""`python -m trainer` / `torchrun ... -m trainer`: parse flags, train, clean up."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trainer.config import parse_args

CHECKPOINT_ERROR_EXIT_CODE = 1
"""A checkpoint the run cannot write or read: a plain failure, which the training operator's
`ExitCode` policy does not retry (a full disk or a denied bucket needs a person)."""


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    from trainer.garbage import collector_held

    with collector_held(cfg.parallel.gc_every):
        # Before prometheus_client is imported: the local ranks share one metrics directory.
        from trainer.telemetry import prepare_process

        prepare_process(cfg.logging.metrics_port)
        # Imported after parsing so that `--help` and flag errors answer without loading torch.
        from trainer.checkpoint import CheckpointError
        from trainer.data import DataConfigError
        from trainer.float8 import Float8Error
        from trainer.preflight import PREFLIGHT_EXIT_CODE, PreflightError
        from trainer.train import Trainer

    try:
        trainer = Trainer(cfg)
    except PreflightError as error:
        # The node is not what the run was planned for: one line, and a retryable exit.
        from trainer.distributed import shutdown

        shutdown()
        # One write: ranks share the log, and print's separate newline write can interleave.
        sys.stderr.write(f"trainer: {error}\n")
        return PREFLIGHT_EXIT_CODE
    except (DataConfigError, Float8Error) as error:
        # A bad --dataset/--tokenizer, or fp8 asked of a machine without it, is the user's to
        # fix: one line naming the flag, no trace.
        from trainer.distributed import shutdown

        shutdown()
        sys.stderr.write(f"trainer: error: {error}\n")
        return 2
    except CheckpointError as error:
        # A checkpoint that cannot be loaded (nor the one before it), or was written by
        # another world size: one line naming it.
        from trainer.distributed import shutdown

        shutdown()
        sys.stderr.write(f"trainer: {type(error).__name__}: {error}\n")
        return CHECKPOINT_ERROR_EXIT_CODE
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
    except CheckpointError as error:
        # A save that failed (a full disk, an S3 error): the location, the rank and the cause
        # in one line, rather than every rank's traceback from DCP's upload process.
        sys.stderr.write(f"trainer: {type(error).__name__}: {error}\n")
        return CHECKPOINT_ERROR_EXIT_CODE
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    from trainer.distributed import exit_without_finalization

    exit_without_finalization(main())
