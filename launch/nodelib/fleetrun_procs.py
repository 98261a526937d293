#!/usr/bin/env python3
"""A run's processes on a node, read from ``/proc``: which they are, which are stopped, which
could still use a stop's grace.

The node agent finds a run's processes by the ``FLEETRUN_RUN_ID`` in their environment
(``run_pids``); it answers each poll with how many of the job's processes are stopped by a signal
(SIGSTOP, a debugger's trace stop): such a rank looks alive and never steps, and its peers'
collectives time out on it, so the watcher must blame its node, not theirs; and a stop does not
wait out the grace for processes that hold nothing of the job's state (``holds_nothing``).
Standard library only, Python 3.8 (shipped to the nodes beside the agent).
"""

from __future__ import annotations

import os


def _read_children(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return ""


MAX_TREE = 512
"""At most this many processes of the job's tree are looked at per poll."""


def _proc_state(pid: int) -> str:
    """The one-letter state of ``pid`` (``R``, ``S``, ``T``...), '' when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read(4096).rsplit(")", 1)[-1].split()
    except OSError:
        return ""
    return fields[0] if fields else ""


def _children(pid: int) -> list[int]:
    """``pid``'s children, from every thread's ``children`` list (a child may be forked by any)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks[:MAX_TREE]:
        data = _read_children(pid, tid)
        found.extend(int(c) for c in data.split() if c.isdigit())
    return found


def stopped_in_tree(root: int) -> int:
    """How many of ``root`` and its descendants are stopped by a signal (state ``T``; ``t`` for
    a debugger's trace stop). Read from ``/proc``, bounded by ``MAX_TREE``."""
    seen: set[int] = set()
    todo = [root]
    stopped = 0
    while todo and len(seen) < MAX_TREE:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if _proc_state(pid) in ("T", "t"):
            stopped += 1
        todo.extend(_children(pid))
    return stopped


def run_pids(run_id: str, watchdogs: bool | None = None) -> list[int]:
    """Live processes carrying ``FLEETRUN_RUN_ID=run_id``; ``watchdogs`` selects guards (True),
    job processes (False) or both (None)."""
    marker = f"FLEETRUN_RUN_ID={run_id}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker not in env or _proc_state(int(entry)) in ("", "Z", "X"):
            continue
        if watchdogs is None or (b"FLEETRUN_GUARD=1" in env) == watchdogs:
            pids.append(int(entry))
    return pids


LAUNCHERS = (
    b"torch.distributed.run",
    b"torchrun",
    b"horovodrun",
    b"mpirun",
    b"mpiexec",
    b"orted",
    b"prterun",
)
"""What starts ranks and holds nothing of the job's state: once every rank under it is gone, its
own shutdown (torchrun's rendezvous goodbye, an interpreter with torch loaded: about a second) is
not waited for."""


def holds_nothing(pid: int, wrapper: str) -> bool:
    """A launcher, fleetrun's own shells or the run's watchdog: nothing a grace could save. A
    process that cannot be read is gone. Any other process (a rank: a launcher's child, or a
    job's own process or script) may still write a checkpoint. ``wrapper``: the agent's wrapper
    command (``sh -c <wrapper>``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read(4096).split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return True
    if b"FLEETRUN_GUARD=1" in env:
        return True
    head = b" ".join(argv[:4])
    if any(mark in head for mark in LAUNCHERS):
        return True
    # fleetrun's own shells (the wrapper, ``sh ./launch.sh``); a job's own shell script may trap
    # SIGTERM to save or upload something: it keeps its grace
    return argv[:2] == [b"sh", b"./launch.sh"] or argv[:3] == [b"sh", b"-c", wrapper.encode()]
