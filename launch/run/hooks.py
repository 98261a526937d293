"""The playbook's hooks, laptop side: ``on_end`` after the record, ``before_stop`` shipped to the nodes.

``on_end`` commands run once the run is recorded and ``summary.json`` written (``fab train`` and
``fab watch``), one after another, each with ``summary.json`` on its stdin and the outcome in its
environment (``FLEETRUN_RUN_ID``, ``FLEETRUN_OUTCOME``, ``FLEETRUN_RULE``, ``FLEETRUN_REASON``,
``FLEETRUN_RUN_DIR``), in the run folder. By then the outcome is decided and the teardown done,
so a hook cannot change either; each is bounded by ``hook_timeout_s`` (its whole process group is
killed then), and what happened is written to the run folder's ``hooks.json`` (a failure is also
printed). Nothing a hook does raises out of here.

A playbook is someone's file (one a colleague sent), and ``on_end`` runs on *this* machine, so
its commands run only when the user allowed them for that playbook's exact bytes: once with
``fab train PLAYBOOK --allow-local-hooks``, which records the playbook's SHA-256 under
``$FLEETRUN_HOME/allowed-hooks/`` for later runs of the same file (``local_hooks_verdict``). Without
it the run runs as usual; the hooks are skipped with one line, and ``hooks.json`` says so. The
dry run and ``plan.txt`` print every hook, laptop- and node-side (``LaunchPlan.render``).

The commands are saved in the run folder at launch (``on-end.json``, with the verdict), so
``fab watch`` runs them too when it is the one that ends the run. ``before_stop`` travels to each
node as two files in the start bundle (``before_stop_files``); the node's watchdog runs it
(``fleetrun_hooks``): it runs where the job's own code runs, so it needs no allowance.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.job.hooks import DEFAULT_HOOK_TIMEOUT_S, MAX_HOOK_CHARS, MAX_HOOK_TIMEOUT_S, MAX_HOOKS
from launch.job.spec import JobSpec
from launch.nodelib import fleetrun_hooks
from launch.paths import fleetrun_home
from launch.reports.safe_text import clean

ON_END_FILE = "on-end.json"
RESULTS_FILE = "hooks.json"
MAX_REASON_CHARS = 1000
ALLOWED_HOOKS_DIR = "allowed-hooks"
ALLOW_OPTION = "--allow-local-hooks"
MAX_PLAYBOOK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LocalHooks:
    """Whether a run's ``on_end`` commands may run on this machine, and the one-line reason."""

    allowed: bool
    why: str
    playbook: str = ""


def playbook_digest(playbook: Path) -> str:
    """SHA-256 of the playbook file as it is now (how a test or a person finds an allowance's
    name). A verdict never uses this: it takes the digest of the bytes the spec was parsed from
    (``JobSpec.source_sha256``), since a second read could see another file swapped in."""
    try:
        with playbook.open("rb") as handle:
            return hashlib.sha256(handle.read(MAX_PLAYBOOK_BYTES + 1)).hexdigest()
    except OSError:
        return ""


def _allowance(digest: str) -> Path:
    return fleetrun_home() / ALLOWED_HOOKS_DIR / digest


def local_hooks_verdict(playbook: Path, spec: JobSpec, allow: bool, record: bool) -> LocalHooks:
    """May the playbook's ``on_end`` run here? ``allow``: the user said so on the command line
    (``--allow-local-hooks``), which is remembered for these bytes when ``record`` (a real run, not
    a dry run); else only a playbook whose SHA-256 was allowed before. The SHA-256 is that of the
    bytes ``spec`` was parsed from, never a second read of ``playbook``: a file swapped between
    the parse and the check must not lend its allowance to the commands that will run."""
    shown = clean(playbook, 400)
    if not spec.on_end:
        return LocalHooks(True, "no on_end hooks", shown)
    digest = spec.source_sha256()
    if allow:
        if record and digest:
            where = _allowance(digest)
            where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:  # the path is a note for people; the name is the key
                handle.write(f"{playbook.resolve()}\n")
        kept = ", remembered for this file's bytes" if record else ""
        return LocalHooks(True, f"allowed ({ALLOW_OPTION}{kept})", shown)
    if digest and _allowance(digest).is_file():
        return LocalHooks(True, f"allowed (these bytes were allowed with {ALLOW_OPTION})", shown)
    return LocalHooks(
        False,
        f"not allowed: skipped (this playbook's bytes were never allowed; {ALLOW_OPTION} runs them)",
        shown,
    )


def before_stop_files(spec: JobSpec) -> dict[str, str]:
    """The node's ``before_stop`` files for the start bundle (none without the hook)."""
    if not spec.before_stop:
        return {}
    script = "".join(f"{line}\n" for line in spec.before_stop)
    return {fleetrun_hooks.SCRIPT: script, fleetrun_hooks.TIMEOUT_FILE: f"{spec.hook_timeout_s:g}"}


def save_on_end(folder: Path, spec: JobSpec, verdict: LocalHooks) -> None:
    """Keep the ``on_end`` commands with the run (``fab watch`` may be the one to end it), with
    whether the user allowed them (decided at launch: ``local_hooks_verdict``)."""
    if spec.on_end:
        data = {
            "commands": list(spec.on_end),
            "timeout_s": spec.hook_timeout_s,
            "allowed": verdict.allowed,
            "why": verdict.why,
            "playbook": verdict.playbook,
        }
        (folder / ON_END_FILE).write_text(json.dumps(data))


@dataclass(frozen=True)
class _Saved:
    commands: list[str]
    timeout: float = DEFAULT_HOOK_TIMEOUT_S
    allowed: bool = False
    playbook: str = ""


def _saved(folder: Path) -> _Saved:
    """The saved commands, checked again (the run folder is a file anyone could have edited).
    Only ``"allowed": true`` runs them: a folder from before allowances existed, or a mangled one,
    does not."""
    try:
        data = json.loads((folder / ON_END_FILE).read_text()[: 2 * MAX_HOOKS * MAX_HOOK_CHARS])
    except (OSError, ValueError):
        return _Saved([])
    if not isinstance(data, dict):
        return _Saved([])
    raw = data.get("commands")
    commands = (
        [c for c in raw[:MAX_HOOKS] if isinstance(c, str) and "\0" not in c] if isinstance(raw, list) else []
    )
    timeout = data.get("timeout_s")
    if not (isinstance(timeout, int | float) and 0 < timeout <= MAX_HOOK_TIMEOUT_S):
        timeout = DEFAULT_HOOK_TIMEOUT_S
    playbook = data.get("playbook")
    return _Saved(
        commands, float(timeout), data.get("allowed") is True, playbook if isinstance(playbook, str) else ""
    )


def skipped_line(count: int, playbook: str) -> str:
    """The one line a run prints for ``on_end`` commands it did not run (and the launch warning)."""
    return clean(
        f"on_end: {count} command(s) of {playbook or 'the playbook'} not run on this machine: a playbook's "
        f"on_end runs here only when allowed (fab train PLAYBOOK {ALLOW_OPTION}; see docs/trust.md)",
        1200,
    )


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
        rc, timed_out = fleetrun_hooks.run_bounded(
            ["sh", "-c", command], str(folder), stdin, out, env, timeout
        )
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
        saved = _saved(folder)
        commands, timeout = saved.commands, saved.timeout
        if not commands:
            return []
        if not saved.allowed:
            skipped = [
                {"hook": "on_end", "command": c, "rc": None, "ok": False, "skipped": "not allowed"}
                for c in commands
            ]
            (folder / RESULTS_FILE).write_text(json.dumps(skipped, indent=2))
            say(f"  {skipped_line(len(commands), saved.playbook)}")
            return skipped
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
