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

Every rank's ``log`` also keeps its pace (``pace/<rank>.json`` in the run dir, rewritten at most
every ``PACE_WRITE_S``): its own steps/s, the time of a fixed tiny CPU probe (timed at most once a
second, about 1 ms), how long since its previous record (``every_s``: a rank whose record is
much older than that no longer steps, and a recovery's stop kills it without a grace it cannot
use, ``fleetrun_stepping``) and the share of wall time the rank was ready to run but not given a CPU
(``run_delay`` of ``/proc/self/schedstat``: a CPU quota, an overcommitted or starved machine).
Ranks of synchronous data-parallel training run in lockstep, so steps/s alone cannot say which
node is slow; the probe time divided by the share of time the rank actually ran can. (A probe
alone is not enough: a throttled rank wakes with a fresh CPU quota after each all-reduce and
runs the probe at once, unthrottled.) The node agent reports the slowest of its ranks; the
``straggler`` rule compares nodes.

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


PACE_PROBE_EVERY_S = 1.0
PACE_WRITE_S = 2.0
"""Often enough that a throttled rank shows within a few seconds (the straggler rule's window
starts at its first slow report); the watcher's median over the window smooths the noise."""
PACE_PROBE_LOOPS = 20000


def run_delay_s() -> float | None:
    """Seconds this thread has been runnable but waiting for a CPU (``/proc/self/schedstat``)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as fh:
            return int(fh.read(200).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def pace_probe() -> float:
    """Seconds a fixed pure-Python loop takes here now (about 1 ms on an idle core)."""
    started = time.perf_counter()
    total = 0
    for i in range(PACE_PROBE_LOOPS):
        total += i
    return time.perf_counter() - started


class Pace:
    """One rank's pace, written for the node agent: steps/s and the probe's mean time since the
    last write. Rate-limited (a probe a second, a small file every few seconds); never raises."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.folder = os.path.join(run_dir, "pace")
        self.rank = rank
        self.probes: list[float] = []
        self.last_probe = 0.0
        self.window_start: tuple[int, float] | None = None
        self.delay_start = run_delay_s()
        self.last_write = time.monotonic()

    def tick(self, step: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.window_start is None:
            self.window_start = (step, now)
        if now - self.last_probe >= PACE_PROBE_EVERY_S:
            self.probes.append(pace_probe())
            self.last_probe = now
        if now - self.last_write < PACE_WRITE_S or not self.probes:
            return
        first_step, first_at = self.window_start
        rate = (step - first_step) / (now - first_at) if now > first_at and step > first_step else None
        delay = run_delay_s()
        stall = 0.0
        if delay is not None and self.delay_start is not None and now > first_at:
            stall = min(0.95, max(0.0, (delay - self.delay_start) / (now - first_at)))
        probe_ms = 1000.0 * sum(self.probes) / len(self.probes)
        record = {
            "rank": self.rank,
            "step": step,
            "time": time.time(),
            "steps_per_s": rate,
            "probe_ms": probe_ms / (1.0 - stall),
            "probe_raw_ms": probe_ms,
            "stall": round(stall, 4),
            "every_s": round(now - first_at, 3),
        }
        self.delay_start = delay
        try:
            os.makedirs(self.folder, exist_ok=True)
            path = os.path.join(self.folder, f"{self.rank}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # pace is a hint for the watcher; training goes on without it
        self.probes, self.window_start, self.last_write = [], (step, now), now


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
        # pace (stragglers): every rank under fleetrun
        self._pace = Pace(self.run_dir, self.rank) if os.environ.get("FLEETRUN_RUN_DIR") else None

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
        if self._pace is not None:
            self._pace.tick(int(step))
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
