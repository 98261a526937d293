#!/usr/bin/env python3
"""A failed rank of this node's torchrun, known the moment it dies instead of when torchrun ends.

After ``kill -9`` of a rank, torchrun reaps it within its 0.1 s monitor interval but takes 1.5 s
more to end (its rendezvous goodbye, an interpreter with torch to tear down), and the node's exit
was known only once it had. The node agent's event channel (``fleetrun_node.wait_for_change``)
watches the ranks themselves (``RankWatch``) and records the first failure in ``rank-rc``, which
every answer then reports as the node's exit (``rank_failure``). Standard library only, shipped
beside the agent.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if not __package__:  # on a node, beside the other files in ~/.fleetrun/lib (not as launch.nodelib)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING or __package__:
    from launch.nodelib import fleetrun_procs
    from launch.nodelib import fleetrun_protocol as protocol
else:
    import fleetrun_procs  # noqa: E402 - beside this file in ~/.fleetrun/lib
    import fleetrun_protocol as protocol  # noqa: E402 - beside this file in ~/.fleetrun/lib

Reader = Callable[[str], "str | None"]
"""A bounded read of a small file of the run directory (``fleetrun_node._read``)."""
Writer = Callable[[str, str], None]
"""A private, atomic write (``fleetrun_node.write_private``)."""

RANK_RC = "rank-rc"
"""A rank's failure seen by the event channel before its torchrun ended (``RankWatch.record``):
``CODE WRAPPER_PID``; it counts only while ``pid`` still names that wrapper (this start's)."""
RANK_SCAN_S = 0.25
"""How often the event channel looks for ranks until it found them: they start seconds after the
wrapper (torchrun imports torch first); then it waits on their pidfds alone."""


def pidfd(pid: int | None) -> int | None:
    """A descriptor that becomes readable when ``pid`` ends (``os.pidfd_open``), or None."""
    opener = getattr(os, "pidfd_open", None)
    if pid is None or opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


class RankWatch:
    """The ranks of this node's torchrun, each watched through a pidfd, so that a rank's failure
    is known the moment it dies: its exit status is read from ``/proc`` while it is a zombie
    (``fleetrun_procs.zombie_exit_code``), before torchrun reaps it (every 0.1 s) and long
    before torchrun's own shutdown ends (its rendezvous goodbye, an interpreter with torch
    loaded: 1.5 s measured). A status read too late (already reaped) is simply not known: the
    wrapper's ``rc`` still comes. Only a torchrun that fails on any rank's failure is watched
    (``fleetrun_procs.fails_on_rank_exit``); the exit status is the kernel's, never job output."""

    def __init__(self, run_dir: str, wrapper: int, read: Reader, write: Writer) -> None:
        self.run_dir = run_dir
        self.wrapper = wrapper
        self.read = read
        self.write = write
        self.fds: dict[int, int | None] = {}
        """Rank pid -> its pidfd (None without pidfds: read at every tick)."""
        self.next_scan = 0.0
        self.last_found: set[int] = set()

    def scan(self, now: float) -> None:
        """Find ranks not yet watched (and record one already dead): every ``RANK_SCAN_S``."""
        if now < self.next_scan:
            return
        self.next_scan = now + RANK_SCAN_S
        found = fleetrun_procs.torchrun_ranks(self.wrapper)
        if found and set(found) == self.last_found:
            # the same ranks twice, RANK_SCAN_S apart: all started (a watched torchrun restarts
            # nothing, --max-restarts=0), so from here the wait is on their pidfds alone
            self.next_scan = math.inf
        self.last_found = set(found)
        for pid in found:
            if pid not in self.fds:
                self.fds[pid] = pidfd(pid)
                self.check(pid)

    def ready(self, fds: Sequence[int]) -> None:
        """After a wait: the ranks whose pidfd fired (or every rank, without pidfds) checked."""
        for pid, fd in list(self.fds.items()):
            if fd is None or fd in fds:
                self.check(pid)

    def check(self, pid: int) -> None:
        """A rank that ended: recorded when it failed, dropped either way once it is gone."""
        code = fleetrun_procs.zombie_exit_code(pid)
        if code is None and fleetrun_procs.alive(pid):
            return
        fd = self.fds.pop(pid, None)
        if fd is not None:
            os.close(fd)
        if code:
            self.record(code)

    def record(self, code: int) -> None:
        """``rank-rc``: only for this start (its wrapper still the run's) and the first failure."""
        if os.path.exists(os.path.join(self.run_dir, RANK_RC)):
            return
        if protocol.parse_pid(self.read(os.path.join(self.run_dir, "pid"))) != self.wrapper:
            return
        with contextlib.suppress(OSError):
            self.write(os.path.join(self.run_dir, RANK_RC), f"{code} {self.wrapper}\n")

    @property
    def descriptors(self) -> list[int]:
        return [fd for fd in self.fds.values() if fd is not None]

    @property
    def polled(self) -> bool:
        """Some rank is watched without a pidfd: the wait must tick."""
        return any(fd is None for fd in self.fds.values())

    def close(self) -> None:
        for fd in self.fds.values():
            if fd is not None:
                os.close(fd)
        self.fds.clear()


def rank_failure(run_dir: str, read: Reader, notes: list[str]) -> tuple[int, float | None] | None:
    """(exit code, when) of this start's failed rank (``rank-rc``, ``RankWatch.record``), or None.

    A record of an earlier start (another wrapper pid than ``pid`` names) is no exit of this one."""
    path = os.path.join(run_dir, RANK_RC)
    text = read(path)
    if text is None or not text.strip():
        return None
    words = text.split()
    code = protocol.parse_exit_code(words[0]) if len(words) == 2 else None
    wrapper = protocol.parse_pid(words[1]) if len(words) == 2 else None
    if code is None or wrapper is None:
        notes.append(f"{RANK_RC}: {repr(text[:40])} is not an exit code and a process id")
        return None
    if wrapper != protocol.parse_pid(read(os.path.join(run_dir, "pid"))):
        return None
    try:
        return code, os.stat(path).st_mtime
    except OSError:
        return code, None
