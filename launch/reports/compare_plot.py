"""``fab compare``'s plot: every run's loss curve on one set of axes (PNG), a line per run.

Same approach as the run's own ``loss.png`` (``launch.reports.plot``): matplotlib's object API on
the Agg canvas, no pyplot, written atomically. The legend names each run and the hyperparameters
that differ between the runs, so the plot answers "which variant learnt fastest" on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from launch.reports.compare import ComparedRun, curve_label, differing_hyperparameters
from launch.reports.plot import loss_axes, save_loss_plot


def plot_compare(runs: Sequence[ComparedRun], path: str | Path, *, title: str | None = None) -> Path:
    differing = differing_hyperparameters(runs)
    fig, ax = loss_axes((9, 5))
    drawn: list[float] = []
    for run in runs:
        points = [(s, v) for s, v in run.metrics.loss_curve if math.isfinite(v)]
        if not points:
            continue
        # '$' would start matplotlib's mathtext (and a malformed formula fails the savefig)
        label = curve_label(run, differing).replace("$", r"\$")
        ax.plot([s for s, _ in points], [v for _, v in points], linewidth=1.2, label=label)
        drawn += [v for _, v in points]
    if drawn:
        ax.legend(loc="upper right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no run logged a finite loss", ha="center", va="center", transform=ax.transAxes)
    return save_loss_plot(fig, ax, Path(path), title or f"loss of {len(runs)} run(s)", drawn)
