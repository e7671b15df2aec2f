"""The FSDP2 trainer (`torchrun ... -m trainer`).

Two kinds of upstream notice are filtered here, before anything imports torchao; both would
otherwise open every worker's log, on every run, about nothing the trainer uses:

- transformers imports torchao whenever it is installed (its torchao quantizer), and torchao
  then tries each of its optional prebuilt kernel libraries, warning for every one this build
  or machine cannot load (torchao 0.18.0 `torchao/__init__.py`: `Failed to load
  .../_C_mxfp8...`, `_C_cutlass_90a`: MX-format and SM90a CUTLASS kernels). The float8
  training the trainer uses (`trainer.float8`) calls none of them: its matmuls are torch's
  `_scaled_mm`.
- torchao registers its enums as pytree constants, which torch 2.13 deprecates with a warning
  per enum (`torch/utils/_pytree.py` `register_constant`); torchao's to change, not ours.

Other warnings of both loggers pass.
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
