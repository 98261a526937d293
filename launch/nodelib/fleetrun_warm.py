#!/usr/bin/env python3
"""Keep a node warm for a while after a run, then power it off unless a new run claimed it.

Standard library only; started detached on each node by the laptop (``launch.run.warm``) when a
playbook's ``keep_warm_s`` replaces the teardown. It needs no laptop: with the laptop gone, it
still runs ``~/.fleetrun/poweroff`` (cloud: shut down, which terminates; local fleet: the power
daemon stops the node) when the time is up, so a warm fleet never bills for longer than asked.

A new run claims the node by creating its run directory under ``~/.fleetrun/runs`` (that folder's
mtime moves past the arming time); a later ``keep warm`` re-arms it (``warm.json`` names the
newest timer, and an older one steps aside). Usage: ``fleetrun_warm.py SECONDS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.expanduser("~/.fleetrun")
STATE = os.path.join(ROOT, "warm.json")
MAX_S = 7 * 24 * 3600.0


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} fleetrun-warm: {message}", flush=True)


def claimed_since(armed: float) -> bool:
    try:
        return os.stat(os.path.join(ROOT, "runs")).st_mtime > armed
    except OSError:
        return False


def newest_timer() -> float | None:
    try:
        with open(STATE, encoding="utf-8") as fh:
            return float(json.loads(fh.read(4096))["armed_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str]) -> int:
    try:
        seconds = min(max(float(argv[1]), 1.0), MAX_S)
    except (IndexError, ValueError):
        log("usage: fleetrun_warm.py SECONDS")
        return 2
    armed = time.time()
    tmp = STATE + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"armed_at": armed, "until": armed + seconds, "pid": os.getpid()}, fh)
    os.replace(tmp, STATE)
    log(f"kept warm for {seconds:g} s; powering off then unless a new run claims this node")
    while time.time() < armed + seconds:
        time.sleep(1.0)
        if claimed_since(armed):
            log("a new run claimed this node: staying up")
            return 0
        newest = newest_timer()
        if newest is not None and newest > armed:
            log("re-armed by a later run: this timer steps aside")
            return 0
    hook = os.path.join(ROOT, "poweroff")
    if not os.path.exists(hook):
        log("no power-off hook (lab machine): nothing to power off")
        return 0
    log("no new run in time: powering this node off")
    try:
        subprocess.run(["sh", hook], check=False, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"the power-off hook failed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
