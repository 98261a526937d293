"""Whether a process on this machine is alive: one answer for every laptop-side caller; and this
process's open-files limit, raised for a fan-out (``ensure_open_files``).

A zombie counts as dead: it holds no resources and only its parent can reap it, so a killed
watcher or power daemon that lingers as a zombie must not read as running. (Nodes have their own
copy in ``launch/nodelib``, which ships standard-library code only.)
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live process on this machine (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def ensure_open_files(needed: int) -> int:
    """Raise this process's soft open-files limit toward ``needed`` (never above the hard limit).

    Each connection is a socket and each rsync a process with pipes: at 256 nodes the common
    default of 1024 runs out ("Too many open files"). Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft
