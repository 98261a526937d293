"""The loss plot (PNG) written into the run folder at the end of a run."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from launch.rules.metrics_stream import LossPoint


def plot_loss(
    history: Sequence[LossPoint],
    path: str | Path,
    *,
    title: str | None = None,
    resumes: Sequence[tuple[int, int]] = (),
) -> Path:
    """Write a loss-vs-step PNG to ``path`` (atomically) and return the path.

    Uses matplotlib's object API with the Agg canvas, never pyplot, so it needs no display
    and leaves no global figure state behind in the long-lived watcher. Non-finite losses
    cannot be drawn; the first one is marked with a red line so the blow-up is visible.
    ``resumes``: (attempt, first step) of each attempt after the first (``recovery:``), marked
    with a grey line, so steps computed twice show as the overlap before it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    finite = [p for p in history if math.isfinite(p.loss)]
    bad = next((p for p in history if not math.isfinite(p.loss)), None)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if finite:
        ax.plot([p.step for p in finite], [p.loss for p in finite], linewidth=1.2, color="tab:blue")
        low, high = min(p.loss for p in finite), max(p.loss for p in finite)
        if low > 0 and high / low > 100:
            ax.set_yscale("log")
    else:
        what = "no finite loss logged" if history else "no loss logged before the run ended"
        ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
    for attempt, step in resumes:
        ax.axvline(step, color="tab:gray", linestyle=":", label=f"attempt {attempt} resumes at step {step}")
    if bad is not None:
        ax.axvline(bad.step, color="tab:red", linestyle="--", label=f"loss {bad.loss} at step {bad.step}")
    if bad is not None or resumes:
        ax.legend(loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or "training loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
