"""The trainer's one logger, filtered by rank at setup rather than at every call site."""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "trainer"
# The awsome-distributed-training FSDP sample's layout
# (`2025-06-20 14:17:10 I [train.py:103] Batch ...`), kept so that log monitors and habits
# built on it keep working.
_FORMAT = "%(asctime)s %(levelname).1s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def get_logger(name: str | None = None) -> logging.Logger:
    """The project logger, or a child of it (`trainer.<name>`)."""
    return logging.getLogger(LOGGER_NAME if name is None else f"{LOGGER_NAME}.{name}")


def setup_logging(rank: int, *, level: int = logging.INFO) -> logging.Logger:
    """Rank 0 logs at `level`; other ranks only warnings and errors, tagged with their rank.

    Every module logs through `trainer.*` loggers, so this one handler decides what a
    multi-process run prints; libraries keep their own loggers untouched.
    """
    logger = get_logger()
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    prefix = "" if rank == 0 else f"[rank{rank}] "
    handler.setFormatter(logging.Formatter(prefix + _FORMAT, datefmt=_DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger
