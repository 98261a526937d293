"""``fab compare``'s plot: every run's loss curve on one set of axes (PNG), a line per run.

Same approach as the run's own ``loss.png`` (``launch.reports.plot``): matplotlib's object API on
the Agg canvas, no pyplot, written atomically. The legend names each run and the hyperparameters
that differ between the runs, so the plot answers "which variant learnt fastest" on its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from launch.reports.compare import ComparedRun, curve_label, differing_hyperparameters


def plot_compare(runs: Sequence[ComparedRun], path: str | Path, *, title: str | None = None) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    differing = differing_hyperparameters(runs)
    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn = 0
    low, high = math.inf, -math.inf
    for run in runs:
        points = [(s, v) for s, v in run.metrics.loss_curve if math.isfinite(v)]
        if not points:
            continue
        # '$' would start matplotlib's mathtext (and a malformed formula fails the savefig)
        label = curve_label(run, differing).replace("$", r"\$")
        ax.plot([s for s, _ in points], [v for _, v in points], linewidth=1.2, label=label)
        low, high = min(low, *(v for _, v in points)), max(high, *(v for _, v in points))
        drawn += 1
    if drawn:
        if low > 0 and high / low > 100:
            ax.set_yscale("log")
        ax.legend(loc="upper right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no run logged a finite loss", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or f"loss of {len(runs)} run(s)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
