#!/usr/bin/env python3
"""A job's process tree on a node, read from ``/proc``: which of its processes are stopped.

The node agent answers each poll with how many of the job's processes are stopped by a signal
(SIGSTOP, a debugger's trace stop): such a rank looks alive and never steps, and its peers'
collectives time out on it, so the watcher must blame its node, not theirs. Standard library
only, Python 3.8 (shipped to the nodes beside the agent).
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
