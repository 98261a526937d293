#!/usr/bin/env python3
"""The playbook's ``before_stop:`` hook on a node, run by the watchdog. Standard library only.

When the on-node watchdog ends a run with the laptop gone (``fleetrun_guard.shut_down``), it runs
the hook first, so a job can flush or copy something before its processes are stopped, the run
directory is uploaded and the node powers off. The hook is the user's shell text: it may fail or
hang, and neither may keep the node running or change the run's outcome. So it runs in a session
of its own, bounded by its timeout (then its whole process group is killed), its output goes to
``before-stop.log``, and what happened goes to ``before-stop-result.json``, uploaded and pulled
with the run directory. It runs at most once per run on a node.

Files (in the run directory, sent by the laptop with ``launch.sh`` and ``guard.json``):
``before-stop.sh`` the commands; ``before-stop-timeout`` seconds, a number (default 60, at most 3600).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from typing import IO

SCRIPT = "before-stop.sh"
TIMEOUT_FILE = "before-stop-timeout"
RESULT = "before-stop-result.json"
LOG = "before-stop.log"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0


def hook_timeout(run_dir: str) -> float:
    """The hook's bound from ``before-stop-timeout``; anything unreadable is the default."""
    try:
        with open(os.path.join(run_dir, TIMEOUT_FILE), encoding="utf-8") as fh:
            value = float(fh.read(64).strip())
    except (OSError, ValueError):
        return DEFAULT_TIMEOUT_S
    if not value > 0:  # NaN too
        return DEFAULT_TIMEOUT_S
    return min(value, MAX_TIMEOUT_S)


def run_bounded(
    argv: list[str],
    cwd: str,
    stdin: int | IO[bytes],
    out: IO[bytes],
    env: dict[str, str] | None,
    timeout: float,
) -> tuple[int | None, bool]:
    """``argv`` in a session of its own, output to ``out``, bounded by ``timeout``; then its whole
    process group is killed, what it left running in the background too. (exit code, or None when
    killed at the timeout; whether it was). Shared with the laptop's ``on_end`` (``launch.run.hooks``)."""
    child = subprocess.Popen(
        argv, cwd=cwd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    timed_out = False
    try:
        rc: int | None = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out, rc = True, None
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    if timed_out:
        child.wait()
    return rc, timed_out


def _write_result(run_dir: str, result: dict[str, object]) -> None:
    tmp = os.path.join(run_dir, RESULT + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(run_dir, RESULT))


def run_before_stop(run_dir: str, env: dict[str, str] | None = None) -> dict[str, object] | None:
    """Run ``before-stop.sh`` once, bounded; its result (None when there is no hook or it already ran).

    ``rc`` is the exit code (None when killed at the timeout); ``timed_out`` says it was killed.
    """
    script = os.path.join(run_dir, SCRIPT)
    if not os.path.isfile(script) or os.path.exists(os.path.join(run_dir, RESULT)):
        return None
    timeout = hook_timeout(run_dir)
    started = time.time()
    _write_result(run_dir, {"hook": "before_stop", "started_at": started, "state": "running"})
    with open(os.path.join(run_dir, LOG), "ab") as log:
        rc, timed_out = run_bounded(["sh", script], run_dir, subprocess.DEVNULL, log, env, timeout)
    result: dict[str, object] = {
        "hook": "before_stop",
        "started_at": started,
        "seconds": round(time.time() - started, 3),
        "rc": rc,
        "timed_out": timed_out,
        "timeout_s": timeout,
        "ok": rc == 0,
        "log": LOG,
    }
    _write_result(run_dir, result)
    return result
