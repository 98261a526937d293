#!/usr/bin/env python3
"""Which ranks of a job on this node still step: the stop's grace is only worth giving to them.

A recovery stops the survivors of a lost node with SIGTERM and a grace to write a checkpoint. A
survivor's ranks are usually blocked in a collective with the dead peer: the SIGTERM handler
only sets a flag, the rank never reaches its next step to save, and the grace is waited out for
nothing (6-7 s of every recovery, issue 33). Every rank under fleetrun rewrites its pace record
(``pace/<rank>.json``, ``fleetrun_metrics.Pace``) as it steps, at least every ``every_s`` (its
write interval, in the record): a rank whose record is much older than that has not stepped
since; one whose record keeps coming is still stepping and can use its grace.

The records are the job's files: read bounded, parsed defensively, and a record that says
nothing usable counts as no evidence (the rank keeps its grace). Standard library only, Python
3.8 (shipped to the nodes beside the agent).
"""

from __future__ import annotations

import json
import math
import os
import stat

PACE_WRITE_S = 2.0
"""``fleetrun_metrics.PACE_WRITE_S``: a stepping rank's record is at most this old, plus a step."""
STALE_FACTOR = 2.0
STALE_MARGIN_S = 2.0
"""A rank is not stepping once its record is older than ``STALE_FACTOR`` write intervals plus
this: a loaded machine may delay a healthy rank's next write by a whole interval."""
MAX_RANKS = 64
MAX_EVERY_S = 3600.0


def _records(run_dir: str, launched: float) -> dict[int, tuple[float, float]]:
    """rank -> (time of its last pace record, its write interval), for records of this launch."""
    folder = os.path.join(run_dir, "pace")
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:MAX_RANKS]
    except OSError:
        return {}
    found: dict[int, tuple[float, float]] = {}
    for name in names:
        stem = name[: -len(".json")]
        if not stem.isdigit() or len(stem) > 9:
            continue
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would block the stop
                continue
            data = os.read(fd, 1025)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(data) > 1024:
            continue
        try:
            record = json.loads(data.decode("utf-8", errors="replace"))
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        at, every = record.get("time"), record.get("every_s", PACE_WRITE_S)
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < launched:
            continue
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every):
            every = PACE_WRITE_S
        found[int(stem)] = (float(at), min(max(float(every), PACE_WRITE_S), MAX_EVERY_S))
    return found


def launched_at(run_dir: str) -> float:
    """When this launch of the job began (its ``pid`` file, one second early); older pace
    records are an earlier attempt's. 0 when unknown."""
    try:
        return os.stat(os.path.join(run_dir, "pid")).st_mtime - 1.0
    except OSError:
        return 0.0


def stale_after(every_s: float) -> float:
    """Seconds without a new record after which a rank writing every ``every_s`` is not stepping."""
    return STALE_FACTOR * every_s + STALE_MARGIN_S


class Ranks:
    """The ranks of this launch with a pace record, split by what they are doing at ``now``."""

    def __init__(self, stepping: list[int], blocked: list[int]) -> None:
        self.stepping = stepping
        self.blocked = blocked

    @property
    def none_stepping(self) -> bool:
        """Evidence that no rank here can use a grace: at least one record, none fresh."""
        return bool(self.blocked) and not self.stepping


def read_ranks(run_dir: str, now: float, launched: float | None = None) -> Ranks:
    """Each rank with a record of this launch: stepping (its record is fresh) or blocked (no new
    record for ``stale_after`` its interval: stuck in a collective, or stopped)."""
    records = _records(run_dir, launched_at(run_dir) if launched is None else launched)
    stepping: list[int] = []
    blocked: list[int] = []
    for rank, (at, every) in sorted(records.items()):
        (blocked if now - at > stale_after(every) else stepping).append(rank)
    return Ranks(stepping, blocked)
