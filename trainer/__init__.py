"""The FSDP2 trainer (`torchrun ... -m trainer`).

Two upstream notices are filtered here, before anything imports torchao: torchao's failed loads
of optional kernel libraries (torchao 0.18.0 `torchao/__init__.py`) and torch's deprecation of
pytree constants (`torch/utils/_pytree.py` `register_constant`); the trainer uses neither.
Other warnings of both loggers pass. Why and sources: docs/design/trainer.md#trainer-package
"""

from __future__ import annotations

import logging

_KNOWN_NOTICES = {
    "torchao": ("Failed to load ", "/torchao/_C"),
    "torch.utils._pytree": ("<enum ", "is an Enum subclass and is now natively supported"),
}
"""Logger -> (how the message starts, what it contains)."""


class _KnownNotice(logging.Filter):
    def __init__(self, start: str, part: str) -> None:
        super().__init__()
        self.start, self.part = start, part

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.start) and self.part in message)


for _name, (_start, _part) in _KNOWN_NOTICES.items():
    logging.getLogger(_name).addFilter(_KnownNotice(_start, _part))
