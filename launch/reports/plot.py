"""The loss plot (PNG) written into the run folder at the end of a run."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.reports.safe_text import clean
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


MAX_OTHER_LOSSES = 4
"""Other loss curves drawn beside ``loss`` (``val_loss``, ``eval_loss``...): a few, named in the legend."""
MAX_OTHER_POINTS = 100_000


def other_losses(records: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The loss-like metrics besides ``loss`` that the job logged (a name holding ``loss``, such as
    ``val_loss``), as (step, value) points: a validation loss logged once an epoch is what tells
    over-fitting from learning, and the plot showed only the training loss. Finite numbers at
    integer steps only; the records came from a node."""
    curves: dict[str, list[tuple[int, float]]] = {}
    points = 0
    for record in records:
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for key, value in record.items():
            if key == "loss" or not isinstance(key, str) or "loss" not in key.lower():
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                continue
            if key not in curves and len(curves) >= MAX_OTHER_LOSSES:
                continue
            curves.setdefault(key, []).append((step, float(value)))
            points += 1
            if points >= MAX_OTHER_POINTS:
                return curves
    return curves


def plot_loss(
    history: Sequence[LossPoint],
    path: str | Path,
    *,
    title: str | None = None,
    resumes: Sequence[tuple[int, int]] = (),
    records: Iterable[Mapping[str, Any]] = (),
) -> Path:
    """Write a loss-vs-step PNG to ``path`` (atomically) and return the path.

    Non-finite losses cannot be drawn; the first one is marked with a red line so the blow-up is
    visible. ``resumes``: (attempt, first step) of each attempt after the first (``recovery:``),
    marked with a grey line, so steps computed twice show as the overlap before it. ``records``
    (the metrics records): other losses logged (``val_loss``...) are drawn too, with markers.
    """
    finite = [p for p in history if math.isfinite(p.loss)]
    bad = next((p for p in history if not math.isfinite(p.loss)), None)
    others = other_losses(records)
    fig, ax = loss_axes((8, 4.5))
    if finite:
        ax.plot(
            [p.step for p in finite], [p.loss for p in finite], linewidth=1.2, color="tab:blue", label="loss"
        )
    for name, points in others.items():
        # '$' would start matplotlib's mathtext; the name came from the job
        label = clean(name, 60).replace("$", r"\$")
        ax.plot(
            [s for s, _ in points],
            [v for _, v in points],
            linewidth=1.2,
            marker="o",
            markersize=3,
            label=label,
        )
    if not finite and not others:
        what = "no finite loss logged" if history else "no loss logged before the run ended"
        ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
    for attempt, step in resumes:
        ax.axvline(step, color="tab:gray", linestyle=":", label=f"attempt {attempt} resumes at step {step}")
    if bad is not None:
        ax.axvline(bad.step, color="tab:red", linestyle="--", label=f"loss {bad.loss} at step {bad.step}")
    if bad is not None or resumes or others:
        ax.legend(loc="upper right")
    drawn = [p.loss for p in finite] + [v for points in others.values() for _, v in points]
    return save_loss_plot(fig, ax, Path(path), title or "training loss", drawn)
