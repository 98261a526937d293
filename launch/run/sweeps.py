"""A sweep's variants share one fleet, and each ends the way a ``fab train`` run ends.

``fab sweep`` (``launch.cli.sweep``) runs its variants as ordinary runs through the one life
cycle, with the playbook's own teardown and ``keep_warm_s``. What a sweep adds is that the fleet
is shared: a variant whose policy says "tear down" (or "keep warm") while the sweep has variants
still to start, or others still running on the fleet, keeps it for them instead
(``TeardownOutcome`` skipped, "kept for sweep ..."), and the variant that ends last takes its
own decision, exactly as the last of several ``fab train`` runs would. Before, every variant was
forced to ``teardown: never`` and the sweep decided once at its end, in its own code, so the
command that ended a run decided how, and a variant re-attached with ``fab watch`` or pulled with
``fab pull`` knew nothing of its sweep.

Who is still using the fleet is read from the sweep's own file (``sweep.json``, written by the
sweep's process as it goes: each variant's state and process id, and the sweep's own) under a
lock every variant takes to end, and each variant leaves its process id in ``ended/`` there, so
two variants ending at once cannot both keep the fleet for the other. A sweep process that is
gone starts nothing more (its pending variants do not count), and a variant process that is gone
does not hold the fleet.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.paths import fleetrun_home
from launch.reports.safe_text import clean
from launch.run.records import RunRecords, pid_alive

__all__ = ["SWEEP_FILE", "Sweep", "Variant", "fleet_end", "leave", "sweep_folder"]

SWEEP_FILE = "sweep.json"
ENDED = "ended"
LOCK = ".fleet.lock"
MAX_SWEEP_BYTES = 16 << 20
SWEEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a sweep id may be to name a folder (``fab train --sweep ID`` is text a user can type)."""


@dataclass
class Variant:
    """One combination of the grid: its ``--set`` items, and what became of it."""

    index: int
    sets: list[str]
    slot: int | None = None
    state: str = "pending"
    """pending, running, not started, or its run's: succeeded, failed, stopped, interrupted."""
    exit_code: int | None = None
    log: str = ""
    pid: int | None = None
    """The process running the variant (its ``fab train``), while it runs."""


@dataclass
class Sweep:
    """What a sweep ran, written to ``$FLEETRUN_HOME/sweeps/<id>/sweep.json`` as it goes.

    ``state``: running; stopping (Ctrl-C or ``--max-failures``: no new variant starts); then
    finished, stopped or interrupted. ``pid``: the sweep's own process."""

    sweep_id: str
    playbook: str
    variants: list[Variant]
    slots: list[list[str]]
    state: str = "running"
    started_at: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "playbook": self.playbook,
            "state": self.state,
            "started_at": self.started_at,
            "pid": self.pid,
            "slots": self.slots,
            "variants": [v.__dict__ for v in self.variants],
        }

    def save(self, folder: Path) -> None:
        tmp = folder / f".{SWEEP_FILE}.tmp"
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        tmp.replace(folder / SWEEP_FILE)


def sweep_folder(sweep_id: str) -> Path | None:
    """The sweep's folder under ``FLEETRUN_HOME``; None for an id that cannot name one."""
    if not SWEEP_ID.fullmatch(sweep_id):
        return None
    return fleetrun_home() / "sweeps" / sweep_id


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _users(data: dict[str, Any], ended: set[int], me: int) -> tuple[int, int]:
    """(variants still to start, variants still running on the fleet) by the sweep's file."""
    sweep_pid = _number(data.get("pid"))
    sweep_alive = data.get("state") == "running" and sweep_pid is not None and pid_alive(sweep_pid)
    to_start = running = 0
    variants = data.get("variants")
    for variant in variants if isinstance(variants, list) else []:
        if not isinstance(variant, dict):
            continue
        state, pid = variant.get("state"), _number(variant.get("pid"))
        if state == "pending" and sweep_alive:
            to_start += 1
        elif state == "running" and pid is None and sweep_alive:
            running += 1  # about to start: its process is not there yet
        elif state == "running" and pid is not None and pid != me and pid not in ended and pid_alive(pid):
            running += 1
    return to_start, running


def leave(sweep_id: str | None, run_id: str) -> str | None:
    """This run, a variant of ``sweep_id``, is done with the fleet: why the sweep still needs the
    fleet (the outcome's words), or None when no variant will use it after this one (or the run
    is no sweep's: no sweep file), so that this run's own teardown decision stands. Called once
    at the end of every variant's run, whatever its decision, under the sweep's lock."""
    folder = sweep_folder(sweep_id) if sweep_id else None
    if folder is None or not (folder / SWEEP_FILE).is_file():
        return None
    me = os.getpid()
    with open(folder / LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (folder / ENDED).mkdir(exist_ok=True)
        (folder / ENDED / str(me)).write_text(run_id)
        ended = {int(p.name) for p in (folder / ENDED).iterdir() if p.name.isdigit()}
        try:
            with (folder / SWEEP_FILE).open("rb") as fh:
                data = json.loads(fh.read(MAX_SWEEP_BYTES + 1))
        except (OSError, ValueError):
            return None  # not a sweep file fleetrun wrote: nothing holds the fleet
        if not isinstance(data, dict):
            return None
        to_start, running = _users(data, ended, me)
    if not to_start and not running:
        return None
    parts = [
        f"{n} variant(s) {what}" for n, what in ((to_start, "to start"), (running, "still running")) if n
    ]
    return (
        f"kept for sweep {clean(sweep_id, 128)} ({', '.join(parts)} on the fleet): the variant "
        "that ends last decides as the playbook says"
    )


def fleet_end(sweep_id: str, records: RunRecords) -> str | None:
    """How the sweep's fleet ended, in the words of the variant that ended last (its run's
    ``summary.json`` teardown): what ``fab sweep`` says when it is over. None when no variant's
    run got that far."""
    ended = [r for r in records.of_sweep(sweep_id) if r.ended_at is not None and r.run_dir]
    for record in sorted(ended, key=lambda r: r.ended_at or 0.0, reverse=True):
        try:
            with (Path(record.run_dir or "") / "summary.json").open("rb") as fh:
                summary = json.loads(fh.read(MAX_SWEEP_BYTES + 1))
            message = summary["teardown"]["message"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(message, str):
            return f"{clean(message, 600)} (run {clean(record.id, 100)}, the last variant to end)"
    return None
