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
    b"fleetrun_torchrun",
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


TORCHRUN_MODULES = (b"torch.distributed.run", b"fleetrun_torchrun")
"""torchrun run as a module: torch's, or fleetrun's that forks its ranks (``fleetrun_torchrun``;
a forked rank's command line is the rank's own, ``python -u script.py``, never these)."""


def _argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read(65536).split(b"\0")
    except OSError:
        return []


def _option(argv: list[bytes], names: tuple[bytes, ...]) -> bytes | None:
    """The value of the first ``--name=value`` or ``--name value`` of ``names`` in ``argv``."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + b"="):
                return arg[len(name) + 1 :]
    return None


def fails_on_rank_exit(argv: list[bytes]) -> bool:
    """True for a torchrun whose every failed rank fails the node: it restarts nothing
    (``--max-restarts=0``, which fleetrun always passes) and its node count is fixed (an elastic
    ``MIN:MAX`` torchrun restarts its ranks when the membership changes, and such a restart ends
    them with SIGTERM). Any other launcher, or a torchrun started otherwise, is not watched."""
    head = argv[:3]
    launcher = any(head[i] == b"-m" and head[i + 1] in TORCHRUN_MODULES for i in range(len(head) - 1)) or any(
        os.path.basename(a) == b"torchrun" for a in argv[:2]
    )
    if not launcher:
        return False
    restarts = _option(argv, (b"--max-restarts", b"--max_restarts"))
    nodes = _option(argv, (b"--nnodes",))
    return restarts is not None and restarts.strip() == b"0" and nodes is not None and b":" not in nodes


def torchrun_ranks(root: int) -> list[int]:
    """The ranks started by a torchrun in ``root``'s tree whose rank failure fails the node
    (``fails_on_rank_exit``): its children. Zombies count (a rank that just ended and that
    torchrun has not reaped yet: its exit status is still readable). Bounded by ``MAX_TREE``."""
    seen: set[int] = set()
    todo = [root]
    ranks: list[int] = []
    while todo and len(seen) < MAX_TREE:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        children = _children(pid)
        if children and fails_on_rank_exit(_argv(pid)):
            ranks.extend(children)
            continue  # below a rank is the job's own: not looked at
        todo.extend(children)
    return ranks


def zombie_exit_code(pid: int) -> int | None:
    """The exit code of ``pid`` if it has ended and is not reaped yet (a zombie: its parent has
    not waited for it), as a shell shows it (``128 + signal`` for a death by a signal); None
    while it runs or once it is gone. The kernel's ``exit_code`` field of ``/proc/PID/stat``
    (field 52, Linux 3.5+): the status itself, never anything the process printed."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read(4096).rsplit(")", 1)[-1].split()
    except OSError:
        return None
    if len(fields) < 50 or fields[0] != "Z" or not fields[49].isdigit():
        return None
    status = int(fields[49])
    return 128 + (status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def alive(pid: int) -> bool:
    """True while ``pid`` runs (not a zombie: a dead rank its parent has not reaped yet)."""
    return _proc_state(pid) not in ("", "Z", "X")
