"""Plot a run's loss curve from the trainer's JSONL metrics file.

    python scripts/cli/plot.py runs/dev/metrics.jsonl                 # -> runs/dev/loss.png
    python scripts/cli/plot.py --stack llama31-8b-p5 --out loss.png    # from S3, after `up`
    python scripts/cli/plot.py s3://bucket/checkpoints/run-1/metrics.jsonl --smooth 0.9

The trainer (trainer.metrics.JsonlSink) writes one JSON object per line: `kind: "train"` with
`step` and `loss` (plus throughput figures), and `kind: "validation"` with `step` and
`val_loss`. A resumed run appends to the same file, so a step can appear twice; the later
record wins, as it is the one the resumed run continued from. Each restart (a `run` line whose
`start.attempt` is above 1) is marked on the plot where the run resumed, with how the attempt
before it ended.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `scripts.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cli.run_target import TargetError, add_target_arguments, resolve, split_s3_uri

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


def plot(curves: LossCurves, out: Path, *, title: str, smooth: float = 0.0) -> Path:
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


def fetch_s3(uri: str, directory: Path) -> Path:
    """Download one S3 object to `directory` (boto3; AWS_ENDPOINT_URL works for tests)."""
    import boto3

    bucket, key = split_s3_uri(uri)
    local = directory / Path(key).name
    boto3.session.Session().client("s3").download_file(bucket, key, str(local))
    return local


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("metrics", nargs="?", help="metrics.jsonl path or s3:// URI")
    add_target_arguments(parser)
    parser.add_argument("--out", type=Path, help="PNG path (default: loss.png beside the input)")
    parser.add_argument("--smooth", type=float, default=0.0, help="EMA weight in [0, 1)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            source = options.metrics
            if source is None:
                source = f"{resolve(options).require_checkpoint_uri()}/{METRICS_FILE}"
            if source.startswith("s3://"):
                path = fetch_s3(source, Path(scratch))
                out = options.out or Path("loss.png")
            else:
                path = Path(source)
                out = options.out or path.with_name("loss.png")
            with path.open(encoding="utf-8") as lines:
                curves = read_curves(lines)
            plot(curves, out, title=source, smooth=options.smooth)
        except (TargetError, ValueError, OSError) as error:
            print(f"plot_loss: {error}", file=sys.stderr)
            return 2
    print(f"{curves.summary()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
