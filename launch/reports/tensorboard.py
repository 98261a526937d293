"""TensorBoard event files for a run: ``tensorboard --logdir <run folder>`` shows its curves.

Written with tensorboardX's ``SummaryWriter`` (a maintained writer that needs neither TensorFlow
nor the ``tensorboard`` package), so the files are exactly what TensorBoard's own readers expect:
one scalar series per metric, and the run's hyperparameters as an HParams session (TensorBoard's
HPARAMS tab) whose metrics are the final values of the run's scalars. fleetrun's files carry the
suffix ``.fleetrun``, so an export can replace its own earlier files and never touches others
(a job's own ``SummaryWriter`` output pulled into the same folder is left alone).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from launch.rules.metrics_stream import RESERVED_KEYS

FILE_SUFFIX = ".fleetrun"
MAX_TAGS = 256
"""Scalar names written per run: a job logging a new name every step must not make one file per name."""


def metric_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The plottable scalars of a metric record (not step/time/elapsed, not bools or text)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in RESERVED_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[str(key)] = float(value)
    return out


def record_step(record: Mapping[str, Any]) -> int | None:
    """A metric record's step, or None for events and step-less lines (12.0 counts as 12)."""
    step = record.get("step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if "event" in record or isinstance(step, bool) or not isinstance(step, int):
        return None
    return step


def hparam_value(value: Any) -> bool | str | float | int:
    """What the HParams plugin can hold: a bool, a number or a string (anything else as text)."""
    if isinstance(value, bool | str | int | float):
        return value
    return str(value)


def write_tensorboard(
    records: Iterable[Mapping[str, Any]],
    logdir: str | Path,
    *,
    replace: bool = True,
    hyperparameters: Mapping[str, Any] | None = None,
) -> Path:
    """Export metric records (and the run's hyperparameters, if any) to a fresh event file.

    With ``replace`` (the default) earlier files written by fleetrun (``*.fleetrun``) in
    ``logdir`` are removed first, so exporting twice does not double every curve. Returns the
    event file's path.
    """
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams

    logdir = Path(logdir)
    if replace and logdir.is_dir():
        for old in logdir.glob(f"events.out.tfevents.*{FILE_SUFFIX}"):
            old.unlink()
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.glob(f"events.out.tfevents.*{FILE_SUFFIX}"))
    final: dict[str, float] = {}
    writer = SummaryWriter(logdir=str(logdir), filename_suffix=FILE_SUFFIX, max_queue=1000, flush_secs=3600)
    try:
        for record in records:
            step = record_step(record)
            if step is None:
                continue
            wall = record.get("time")
            wall_time = float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None
            for tag, value in metric_scalars(record).items():
                if tag not in final and len(final) >= MAX_TAGS:
                    continue
                writer.add_scalar(tag, value, global_step=step, walltime=wall_time)
                final[tag] = value
        if hyperparameters:
            # The session's metrics are the scalar series above (HParams reads their last values);
            # only finite ones, since the plugin's table cannot order NaN.
            metrics = {tag: value for tag, value in final.items() if math.isfinite(value)}
            hp = {str(k): hparam_value(v) for k, v in hyperparameters.items()}
            for summary in hparams(hp, metrics):
                writer.file_writer.add_summary(summary)
    finally:
        writer.close()
    written = set(logdir.glob(f"events.out.tfevents.*{FILE_SUFFIX}")) - before
    return max(written, key=lambda p: p.stat().st_mtime)
