"""The playbook's hooks, laptop side: ``on_end`` after the record, ``before_stop`` shipped to the nodes.

``on_end`` commands run once the run is recorded and ``summary.json`` written (``fab train`` and
``fab watch``), one after another, each with ``summary.json`` on its stdin and the outcome in its
environment (``FLEETRUN_RUN_ID``, ``FLEETRUN_OUTCOME``, ``FLEETRUN_RULE``, ``FLEETRUN_REASON``,
``FLEETRUN_RUN_DIR``), in the run folder. By then the outcome is decided and the teardown done,
so a hook cannot change either; each is bounded by ``hook_timeout_s`` (its whole process group is
killed then), and what happened is written to the run folder's ``hooks.json`` (a failure is also
printed). Nothing a hook does raises out of here.

The commands are saved in the run folder at launch (``on-end.json``), so ``fab watch`` runs them
too when it is the one that ends the run. ``before_stop`` travels to each node as two files in the
start bundle (``before_stop_files``); the node's watchdog runs it (``fleetrun_hooks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from launch.job.hooks import DEFAULT_HOOK_TIMEOUT_S, MAX_HOOK_CHARS, MAX_HOOK_TIMEOUT_S, MAX_HOOKS
from launch.job.spec import JobSpec
from launch.nodelib import fleetrun_hooks
from launch.reports.safe_text import clean

ON_END_FILE = "on-end.json"
RESULTS_FILE = "hooks.json"
MAX_REASON_CHARS = 1000


def before_stop_files(spec: JobSpec) -> dict[str, str]:
    """The node's ``before_stop`` files for the start bundle (none without the hook)."""
    if not spec.before_stop:
        return {}
    script = "".join(f"{line}\n" for line in spec.before_stop)
    return {fleetrun_hooks.SCRIPT: script, fleetrun_hooks.TIMEOUT_FILE: f"{spec.hook_timeout_s:g}"}


def save_on_end(folder: Path, spec: JobSpec) -> None:
    """Keep the ``on_end`` commands with the run (``fab watch`` may be the one to end it)."""
    if spec.on_end:
        data = {"commands": list(spec.on_end), "timeout_s": spec.hook_timeout_s}
        (folder / ON_END_FILE).write_text(json.dumps(data))


def _saved(folder: Path) -> tuple[list[str], float]:
    """The saved commands, checked again (the run folder is a file anyone could have edited)."""
    try:
        data = json.loads((folder / ON_END_FILE).read_text()[: 2 * MAX_HOOKS * MAX_HOOK_CHARS])
    except (OSError, ValueError):
        return [], DEFAULT_HOOK_TIMEOUT_S
    if not isinstance(data, dict):
        return [], DEFAULT_HOOK_TIMEOUT_S
    raw = data.get("commands")
    commands = (
        [c for c in raw[:MAX_HOOKS] if isinstance(c, str) and "\0" not in c] if isinstance(raw, list) else []
    )
    timeout = data.get("timeout_s")
    if isinstance(timeout, int | float) and 0 < timeout <= MAX_HOOK_TIMEOUT_S:
        return commands, float(timeout)
    return commands, DEFAULT_HOOK_TIMEOUT_S


def _summary_fields(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_command(command: str, folder: Path, env: dict[str, str], timeout: float, log: Path) -> dict[str, Any]:
    """One hook command: ``sh -c``, summary.json on stdin, output to ``log``; bounded by ``timeout``."""
    started = time.time()
    summary = folder / "summary.json"
    with (
        open(summary, "rb") if summary.exists() else open(os.devnull, "rb") as stdin,
        open(log, "ab") as out,
    ):
        child = subprocess.Popen(
            ["sh", "-c", command],
            cwd=folder,
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        timed_out = False
        try:
            rc: int | None = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
        with contextlib.suppress(OSError):  # what it left running goes with it
            os.killpg(child.pid, signal.SIGKILL)
        if timed_out:
            child.wait()
    return {
        "hook": "on_end",
        "command": command,
        "rc": rc,
        "timed_out": timed_out,
        "timeout_s": timeout,
        "seconds": round(time.time() - started, 3),
        "ok": rc == 0,
        "log": log.name,
    }


def run_on_end(folder: Path, say: Any = print) -> list[dict[str, Any]]:
    """Run the run's saved ``on_end`` commands; their results (also in ``hooks.json``).

    ``say`` prints a line about each failed or killed hook. Never raises.
    """
    try:
        commands, timeout = _saved(folder)
        if not commands:
            return []
        summary = _summary_fields(folder)
        env = {
            **os.environ,
            "FLEETRUN_RUN_ID": clean(summary.get("run_id", folder.name), 200),
            "FLEETRUN_OUTCOME": clean(summary.get("outcome", "unknown"), 40),
            "FLEETRUN_RULE": clean(summary.get("rule", ""), 100),
            "FLEETRUN_REASON": clean(summary.get("reason", ""), MAX_REASON_CHARS),
            "FLEETRUN_RUN_DIR": str(folder),
        }
        results = []
        for i, command in enumerate(commands):
            try:
                result = run_command(command, folder, env, timeout, folder / f"on-end-{i}.log")
            except Exception as exc:  # noqa: BLE001 - a hook never breaks the end of a run
                result = {"hook": "on_end", "command": command, "rc": None, "ok": False, "error": str(exc)}
            results.append(result)
            if not result["ok"]:
                why = (
                    f"killed after {timeout:g} s"
                    if result.get("timed_out")
                    else f"exit {result.get('rc')}"
                    if "error" not in result
                    else result["error"]
                )
                say(
                    clean(
                        f"  on_end hook {i} failed ({why}); see {folder / result.get('log', RESULTS_FILE)}",
                        600,
                    )
                )
        (folder / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        return results
    except Exception as exc:  # noqa: BLE001
        with contextlib.suppress(Exception):
            say(clean(f"  on_end hooks: {type(exc).__name__}: {exc}", 400))
        return []
