"""The loss plot (PNG) written into the run folder at the end of a run."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launch.rules.metrics_stream import LossPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def loss_axes(size: tuple[float, float]) -> tuple[Figure, Axes]:
    """A figure on the Agg canvas and its one set of axes: matplotlib's object API, never pyplot,
    so no display is needed and no global figure state is left behind in the long-lived watcher."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def save_loss_plot(fig: Figure, ax: Axes, path: Path, title: str, losses: Sequence[float]) -> Path:
    """Label the loss axes (log scale when the finite ``losses`` span more than 100x) and write
    the PNG atomically: a reader never sees half a file."""
    if losses and min(losses) > 0 and max(losses) / min(losses) > 100:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def plot_loss(
    history: Sequence[LossPoint],
    path: str | Path,
    *,
    title: str | None = None,
    resumes: Sequence[tuple[int, int]] = (),
) -> Path:
    """Write a loss-vs-step PNG to ``path`` (atomically) and return the path.

    Non-finite losses cannot be drawn; the first one is marked with a red line so the blow-up is
    visible. ``resumes``: (attempt, first step) of each attempt after the first (``recovery:``),
    marked with a grey line, so steps computed twice show as the overlap before it.
    """
    finite = [p for p in history if math.isfinite(p.loss)]
    bad = next((p for p in history if not math.isfinite(p.loss)), None)
    fig, ax = loss_axes((8, 4.5))
    if finite:
        ax.plot([p.step for p in finite], [p.loss for p in finite], linewidth=1.2, color="tab:blue")
    else:
        what = "no finite loss logged" if history else "no loss logged before the run ended"
        ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
    for attempt, step in resumes:
        ax.axvline(step, color="tab:gray", linestyle=":", label=f"attempt {attempt} resumes at step {step}")
    if bad is not None:
        ax.axvline(bad.step, color="tab:red", linestyle="--", label=f"loss {bad.loss} at step {bad.step}")
    if bad is not None or resumes:
        ax.legend(loc="upper right")
    return save_loss_plot(fig, ax, Path(path), title or "training loss", [p.loss for p in finite])
