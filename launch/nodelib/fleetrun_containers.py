#!/usr/bin/env python3
"""A run's containers on a node: found by the run's label, stopped with a grace, removed.

A run with ``container:`` starts its ranks through a container runtime (``launch.planning.
container``), and its launch script records which one in the run folder. A stop finds the ranks
by ``FLEETRUN_RUN_ID`` in their environment as always (the container gets it), but that is not
enough: docker's containers run under its daemon, as a user the node user may not signal, and a
killed ``podman run`` leaves its container behind (conmon holds it). So ``fleetrun_node.stop_run``
also asks the runtime itself: ``stop -t GRACE`` of every container labelled with the run id while
the processes get their SIGTERM, then ``rm -f`` of whatever is left, so no container outlives the
run. apptainer has neither daemon nor container objects: its ranks are plain processes of the
user, which the stop already reaches. Standard library only, Python 3.8 (shipped to the nodes).
"""

from __future__ import annotations

import os
import subprocess

RUNTIME_FILE = "container_runtime"
"""Written by the launch script (``launch.planning.container`` takes the name from here)."""
LABEL = "fleetrun.run"
OBJECT_RUNTIMES = ("podman", "docker")
"""The runtimes whose containers are objects to stop and remove (apptainer's are processes)."""
RUNTIME_TIMEOUT_S = 60.0
"""The longest one runtime command may take beyond the stop's grace (a hung daemon must not hang the stop)."""
MAX_IDS = 256


def runtime_of(run_dir: str) -> str | None:
    """The runtime the run's launch script used on this node, or None (no container, or a file
    that names no known runtime: it is the job's to overwrite, so it is checked, not trusted)."""
    try:
        with open(os.path.join(run_dir, RUNTIME_FILE), "rb") as fh:
            name = fh.read(32).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return name if name in (*OBJECT_RUNTIMES, "apptainer") else None


def _clean_env() -> dict[str, str]:
    """This process's environment less the run's marker: the stop kills whatever carries
    ``FLEETRUN_RUN_ID``, and the watchdog (which has it) must not kill its own runtime commands."""
    return {k: v for k, v in os.environ.items() if k not in ("FLEETRUN_RUN_ID", "FLEETRUN_GUARD")}


def _run(argv: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            argv,
            env=_clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout[:65536].decode("ascii", errors="replace")


def run_containers(runtime: str, run_id: str) -> list[str]:
    """Ids of the run's containers (running or not) on this node, by the run's label."""
    if runtime not in OBJECT_RUNTIMES:
        return []
    out = _run([runtime, "ps", "-aq", "--filter", f"label={LABEL}={run_id}"], RUNTIME_TIMEOUT_S)
    return [word for word in out.split() if word.isalnum()][:MAX_IDS]


def begin_stop(runtime: str | None, run_id: str, grace: float) -> subprocess.Popen[bytes] | None:
    """Start ``RUNTIME stop -t GRACE`` of the run's containers, in the background (the process
    signals go on meanwhile); None when there is nothing to stop."""
    if runtime is None:
        return None
    ids = run_containers(runtime, run_id)
    if not ids:
        return None
    try:
        return subprocess.Popen(
            [runtime, "stop", "-t", str(max(int(grace), 0)), *ids],
            env=_clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def finish_stop(
    runtime: str | None, run_id: str, stopping: subprocess.Popen[bytes] | None, hurry: bool = False
) -> int:
    """Wait for ``begin_stop``'s command, remove every container of the run that is left, and
    return how many still exist (0 when the node is clean). ``hurry``: the stop cut the grace
    short (no rank could use it), so the runtime's own ``stop -t GRACE`` is not waited out
    either: it is ended and ``rm -f`` kills what is left at once."""
    if stopping is not None:
        try:
            stopping.wait(0 if hurry else RUNTIME_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stopping.kill()
            stopping.wait()
    if runtime is None:
        return 0
    ids = run_containers(runtime, run_id)
    if ids:
        _run([runtime, "rm", "-f", *ids], RUNTIME_TIMEOUT_S)
        ids = run_containers(runtime, run_id)
    return len(ids)
