"""Validation: the mean loss over a fixed set of held-out batches, on its own cadence."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from trainer.cadence import Every
from trainer.distributed import all_reduce_mean
from trainer.log import get_logger
from trainer.metrics import MetricSink

logger = get_logger("train")


class Validator:
    """Runs every `--validation_freq` steps (`should_validate`); `validate` is collective."""

    def __init__(
        self,
        loader: Iterable[dict[str, torch.Tensor]],
        *,
        every: int,
        max_batches: int,
        device: torch.device,
        sinks: MetricSink,
    ) -> None:
        self.loader = loader  # built once: the same batches on every pass
        self.should_validate = Every(every)
        self.max_batches = max_batches
        self.device = device
        self.sinks = sinks

    @torch.no_grad()
    def validate(self, model: nn.Module, step: int) -> float:
        """Mean loss over up to `max_batches` batches per rank, averaged over ranks."""
        model.eval()
        total = torch.zeros((), device=self.device)
        count = 0
        iterator = iter(self.loader)
        for _ in range(self.max_batches):
            batch = next(iterator, None)
            # Every rank must run the same number of sharded forwards (each is collective):
            # stop as soon as any rank runs out.
            have = torch.tensor(0.0 if batch is None else 1.0, device=self.device)
            dist.all_reduce(have, op=dist.ReduceOp.MIN)
            if batch is None or have.item() == 0:
                break
            outputs = model(
                input_ids=batch["input_ids"].to(self.device),
                labels=batch["labels"].to(self.device),
            )
            total += outputs.loss.float()
            count += 1
        model.train()
        if count == 0:
            logger.warning("validation at step %d: no batches", step)
            return math.nan
        val_loss = float(all_reduce_mean(total / count).item())
        perplexity = math.exp(min(val_loss, 50.0))
        # Worded so that monitors matching the training line (`.*Loss:.*`) do not pick it up.
        logger.info(
            "Validation at batch %d: loss %.5f, perplexity %.3f", step, val_loss, perplexity
        )
        self.sinks.write(
            {
                "kind": "validation",
                "step": step,
                "val_loss": val_loss,
                "val_perplexity": perplexity,
                "batches": count,
            }
        )
        return val_loss
