"""`fsdp-eks plot`: a run's loss curve from the trainer's JSONL metrics file.

The trainer (trainer.metrics.JsonlSink) writes one JSON object per line: `kind: "train"` with
`step` and `loss` (plus throughput figures), and `kind: "validation"` with `step` and
`val_loss`. A resumed run appends to the same file, so a step can appear twice; the later
record wins, as it is the one the resumed run continued from. Each restart (a `run` line whose
`start.attempt` is above 1) is marked on the plot where the run resumed, with how the attempt
before it ended.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import click

from scripts.cli.support.errors import CliError
from scripts.cli.support.s3 import fetch_object
from scripts.cli.support.stacks import complete_stacks, resolve
from scripts.cli.support.target import resolve_target

logger = logging.getLogger("fsdp_eks.plot_loss")
METRICS_FILE = "metrics.jsonl"


@dataclass
class LossCurves:
    train: dict[int, float] = field(default_factory=dict)
    validation: dict[int, float] = field(default_factory=dict)
    restarts: list[tuple[int, str]] = field(default_factory=list)
    """(step resumed at, how the previous attempt ended) per restart (`trainer.restarts`)."""
    skipped_lines: int = 0

    def summary(self) -> str:
        if not self.train:
            return "no training records"
        steps = sorted(self.train)
        text = (
            f"{len(steps)} logged steps ({steps[0]}..{steps[-1]}), loss "
            f"{self.train[steps[0]]:.4f} -> {self.train[steps[-1]]:.4f}"
        )
        if self.validation:
            best = min(self.validation, key=lambda s: self.validation[s])
            text += f", best val_loss {self.validation[best]:.4f} at step {best}"
        if self.restarts:
            text += f", {len(self.restarts)} restart(s)"
        return text


def read_curves(lines: Iterable[str]) -> LossCurves:
    """Train and validation losses by step; lines that are not metric records are counted."""
    curves = LossCurves()
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind, step = record.get("kind", "train"), int(record["step"])
            if kind == "train":
                curves.train[step] = float(record["loss"])
            elif kind == "validation":
                curves.validation[step] = float(record["val_loss"])
            elif kind == "run" and record.get("start", {}).get("attempt", 1) > 1:
                curves.restarts.append((step, str(record["start"].get("after", "restart"))))
        except (ValueError, KeyError, TypeError, AttributeError):
            curves.skipped_lines += 1
    if curves.skipped_lines:
        logger.warning("skipped %d lines that are not metric records", curves.skipped_lines)
    return curves


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average (TensorBoard's smoothing); weight 0 returns the values."""
    if not 0 <= weight < 1:
        raise ValueError(f"--smooth must be in [0, 1), got {weight}")
    smoothed, last = [], values[0] if values else 0.0
    for value in values:
        last = weight * last + (1 - weight) * value
        smoothed.append(last)
    return smoothed


def plot_curves(curves: LossCurves, out: Path, *, title: str, smooth: float = 0.0) -> Path:
    """Write the loss curve(s) to `out` (PNG) and return it."""
    if not curves.train and not curves.validation:
        raise ValueError("no loss records to plot")
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    if curves.train:
        steps = sorted(curves.train)
        losses = [curves.train[s] for s in steps]
        if smooth:
            axes.plot(steps, losses, color="tab:blue", alpha=0.25, label="train (raw)")
            axes.plot(steps, ema(losses, smooth), color="tab:blue", label=f"train (EMA {smooth})")
        else:
            axes.plot(steps, losses, color="tab:blue", label="train")
    if curves.validation:
        steps = sorted(curves.validation)
        axes.plot(
            steps, [curves.validation[s] for s in steps], "o-", color="tab:orange", label="val"
        )
    for index, (step, after) in enumerate(curves.restarts):
        axes.axvline(
            step,
            color="tab:red",
            linestyle="--",
            alpha=0.6,
            label="restart (resumed here)" if index == 0 else None,
        )
        axes.annotate(after, (step, 1), xycoords=("data", "axes fraction"), fontsize=7,
                      rotation=90, va="top", ha="right", color="tab:red")  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def names_a_file(source: str) -> bool:
    """A path to a metrics file, not a stack: a folder in it or a file suffix other than a stack
    file's (`Pulumi.dev.yaml` and `stacks/Pulumi.dev.yaml` name the stack `dev`)."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml"):
        return False
    return "/" in source or bool(path.suffix)


@click.command()
@click.argument("source", required=False, metavar="[STACK|FILE]", shell_complete=complete_stacks)
@click.option("-s", "--stack", help="A deployed stack: its run's metrics file in S3.",
              shell_complete=complete_stacks)  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="The PNG (default: the metrics file's name with .png, beside a local "
                   "file, else here; never the local rehearsal's loss.png).")  # fmt: skip
@click.option("--smooth", type=click.FloatRange(0, 1, max_open=True), default=0.0,
              show_default=True, help="EMA weight of the smoothed curve.")  # fmt: skip
def plot(source: str | None, stack: str | None, out: Path | None, smooth: float) -> int:
    """Plot a run's loss curve (PNG) from its metrics file: a deployed stack's run (read from
    S3), a local file, or an s3:// URI.

    \b
        fsdp-eks plot llama31-8b-p5 --out loss.png     # the deployed run
        fsdp-eks plot .local-run/dev/metrics.jsonl     # writes .local-run/dev/metrics.png
        fsdp-eks plot s3://bucket/checkpoints/run-1/metrics.jsonl --smooth 0.9
    """
    metrics = None
    stack_file = source is not None and Path(source).suffix in (".yaml", ".yml")
    if source is not None and (
        source.startswith("s3://") or (Path(source).is_file() and not stack_file)
    ):
        metrics = source
    elif source is not None and names_a_file(source):
        raise CliError(
            f"no metrics file {source}: no such file (`fsdp-eks local <stack>` writes "
            ".local-run/<stack>/metrics.jsonl; a deployed run: fsdp-eks plot -s STACK)"
        )
    elif source is not None:
        stack = resolve([source, *([stack] if stack else [])], all_stacks=False, many=False,
                        default=None)[0]  # fmt: skip
    elif stack is None:
        stack = resolve([], all_stacks=False, many=False, default=None)[0]
    if metrics is None and stack is None:
        raise CliError("name a metrics file (e.g. .local-run/dev/metrics.jsonl) or -s STACK")
    with tempfile.TemporaryDirectory() as scratch:
        source = metrics or f"{resolve_target(stack).require_checkpoint_uri()}/{METRICS_FILE}"
        if source.startswith("s3://"):
            path = fetch_object(source, Path(scratch))
            out = out or Path(path.name).with_suffix(".png")
        else:
            path = Path(source)
            if not path.is_file():
                raise CliError(f"no metrics file {source}")
            out = out or path.with_suffix(".png")
        with path.open(encoding="utf-8") as lines:
            curves = read_curves(lines)
        try:
            plot_curves(curves, out, title=source, smooth=smooth)
        except ValueError as error:  # nothing to plot: a file without loss records
            raise CliError(f"{source}: {error}") from None
    click.echo(f"{curves.summary()}\nwrote {out}")
    return 0
