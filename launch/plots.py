"""The loss curve PNG written at the end of every run (matplotlib, no display needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def read_metrics(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def plot_loss(metrics_path: Path, png_path: Path) -> Path | None:
    records = [r for r in read_metrics(metrics_path) if isinstance(r.get("loss"), int | float)]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    losses = [r["loss"] if math.isfinite(r["loss"]) else float("nan") for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, label="train loss")
    val = [r for r in read_metrics(metrics_path) if isinstance(r.get("val_loss"), int | float)]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(metrics_path.parent.name)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
