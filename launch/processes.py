"""Whether a process on this machine is alive: one answer for every laptop-side caller.

A zombie counts as dead: it holds no resources and only its parent can reap it, so a killed
watcher or power daemon that lingers as a zombie must not read as running. (Nodes have their own
copy in ``launch/nodelib``, which ships standard-library code only.)
"""

from __future__ import annotations

import os
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
