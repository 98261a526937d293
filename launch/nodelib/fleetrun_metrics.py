"""Metrics helper for training code run by fleetrun. Standard library only.

Usage in a training script::

    from fleetrun_metrics import Metrics
    metrics = Metrics()                # writes only on global rank 0 (elsewhere: one marker file)
    metrics = Metrics(total_steps=500) # ... and logs progress (step / total_steps) for the ETA
    metrics.log(step=10, loss=0.42, lr=0.01)
    metrics.event("world", world_size=4, ranks=[...])
    metrics.finish("succeeded")        # or "failed", with a message

Records are JSON lines appended to ``$FLEETRUN_RUN_DIR/metrics.jsonl`` (each flushed, so the
watcher reads them while training runs); the final record goes to ``status.json``, written
atomically. Outside fleetrun (no ``FLEETRUN_RUN_DIR``), files go to ``./fleetrun-metrics``.
A metric record: ``{"step": 12, "time": <unix>, "elapsed": <s>, "loss": 0.52, ...}``. When the
job's total steps are known (``total_steps=`` here, or the playbook's ``total_steps:``, exported as
``FLEETRUN_TOTAL_STEPS``), each record also holds ``progress``: step / total, from 0 to 1, which
the live table and ``fab runs`` turn into a percentage and an ETA.

Every rank's ``log`` also drives the playbook's ``profile:`` (``fleetrun_profile``): the steps it
sees are the ones torch.profiler records, so an unchanged training loop is profiled.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launch.nodelib import fleetrun_profile
else:
    try:  # imported as launch.nodelib.fleetrun_metrics (tests, the laptop)
        from . import fleetrun_profile
    except ImportError:  # beside this file in ~/.fleetrun/lib, on the job's PYTHONPATH
        import fleetrun_profile


def _rank() -> int:
    for name in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            try:
                return int(os.environ[name])
            except ValueError:
                continue
    return 0


def _total_steps_from_env() -> int | None:
    """``FLEETRUN_TOTAL_STEPS`` (the playbook's ``total_steps:``) when it is a positive integer."""
    try:
        value = int(os.environ.get("FLEETRUN_TOTAL_STEPS", ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _scalar(name: str, value: Any) -> float | int:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a tuple: nodes may run 3.8
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}")
    return value


class Metrics:
    """Append-only metrics log for one run; only global rank 0 writes."""

    def __init__(
        self, run_dir: str | None = None, rank: int | None = None, total_steps: int | None = None
    ) -> None:
        self.rank = _rank() if rank is None else rank
        self.total_steps = total_steps if total_steps is not None else _total_steps_from_env()
        self.enabled = self.rank == 0
        self.run_dir = run_dir or os.environ.get("FLEETRUN_RUN_DIR") or os.path.abspath("fleetrun-metrics")
        self.path = os.path.join(self.run_dir, "metrics.jsonl")
        self.status_path = os.path.join(self.run_dir, "status.json")
        self.started = time.time()
        self.last_step: int | None = None
        self._file = None
        if self.enabled:
            os.makedirs(self.run_dir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the run
        elif os.environ.get("FLEETRUN_RUN_DIR") and run_dir is None:
            self._mark_elsewhere()
        # profiler hook: every rank, enabled or not (profile.ranks picks them)
        self._profiler = fleetrun_profile.for_rank(self.rank, self.run_dir)

    def _mark_elsewhere(self) -> None:
        """Tell this node's watchdog that rank 0 (and so the metrics) runs on another node.

        The watchdog's startup rule ("no metrics N s after launch") must only fire where metrics
        are expected; which node gets rank 0 is decided by the rendezvous, not known beforehand.
        """
        try:
            with open(os.path.join(self.run_dir, "metrics-elsewhere"), "a", encoding="utf-8"):
                pass
        except OSError:
            pass  # only a hint to the watchdog; training goes on without it

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def log(self, step: int, **scalars: Any) -> None:
        """One metric record. NaN and Inf are kept (the watcher's NaN rule needs to see them)."""
        if self._profiler is not None:  # profiler hook, on every rank
            self._profiler.on_step(int(step))
        if not self.enabled:
            return
        now = time.time()
        record: dict[str, Any] = {"step": int(step), "time": now, "elapsed": round(now - self.started, 4)}
        for name, value in scalars.items():
            record[name] = _scalar(name, value)
        if self.total_steps:
            record["progress"] = round(min(max(int(step), 0) / self.total_steps, 1.0), 6)
        self.last_step = int(step)
        self._write(record)

    def event(self, name: str, **fields: Any) -> None:
        if self.enabled:
            self._write({"event": name, "time": time.time(), **fields})

    def finish(self, status: str = "succeeded", message: str = "", **fields: Any) -> None:
        """The final status record; written atomically so a reader never sees half of it."""
        if self._profiler is not None:  # profiler hook: a run ended inside the range keeps its trace
            self._profiler.stop()
        if not self.enabled:
            return
        record = {"status": status, "time": time.time(), "step": self.last_step, "message": message, **fields}
        tmp = self.status_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, allow_nan=True)
        os.replace(tmp, self.status_path)
        if self._file is not None:
            self._file.close()
            self._file = None


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
