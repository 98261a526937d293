"""A local fleet's helper process (the power daemon, the S3 server, the spot notice daemon), by
its pid file.

Each runs as the fleet's own process in a session of its own (a Ctrl-C in the terminal that ran
``fab local.up`` does not reach it), logs to a file in the fleet's state directory, and leaves its
pid there; ``down`` finds it by that file and its command line, so a pid reused by an unrelated
process after a crash is never taken for it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from launch.errors import LocalFleetError
from launch.processes import pid_alive


def start(
    state_dir: Path,
    argv: Sequence[str],
    pid_file: str,
    log_file: str,
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached, its pid in ``state_dir / pid_file``; returns once ``ready()``, or
    raises ``LocalFleetError`` naming ``what`` and its log when it ended or ``timeout`` passed
    (a helper with nothing to wait for passes a ``ready`` that is always true). ``env``: its whole
    environment (default: this process's)."""
    log_path = state_dir / log_file
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    (state_dir / pid_file).write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LocalFleetError(f"{what} did not start; see {log_path}")
        time.sleep(0.05)
    return proc


def pids(state_dir: Path, pid_file: str, module: str, args: Sequence[str] = ()) -> list[int]:
    """The helper whose pid ``pid_file`` holds, when that live process runs ``python -m module``
    followed by ``args`` (a fleet's prefix: another fleet's helper that took the pid is not it)."""
    try:
        pid = int((state_dir / pid_file).read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return []
    expected = [b"-m", module.encode(), *(a.encode() for a in args)]
    return [pid] if pid_alive(pid) and argv[1 : 1 + len(expected)] == expected else []
