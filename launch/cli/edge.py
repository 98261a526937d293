"""The command-line edge every Fabric task passes through (``launch.cli.tasks``, ``daily_tasks``).

One place, so every command reads its settings the same way and fails the same way: the settings
are read once from the environment for the command (``launch.settings``), warm fleets past their
deadline are torn down first (``keep_warm_deadlines``), and a
``FleetrunError`` (bad input the user can act on) becomes one clear line on stderr and exit code 2,
not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

from invoke.exceptions import Exit

from launch.errors import FleetrunError
from launch.settings import Settings, active


def keep_warm_deadlines(settings: Settings) -> None:
    """A warm fleet whose deadline passed while no laptop-side timer ran (the lid was closed) is
    torn down by the next command, whatever it is (``launch.run.warm``). Cheap when none is warm:
    the pipeline is imported only when the ledger holds an entry."""
    folder = settings.home / "warm"
    if folder.is_dir() and any(folder.glob("*.json")):
        from launch.run.warm import enforce_due

        enforce_due(say=lambda line: print(line, file=sys.stderr))


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with the environment's settings, a ``FleetrunError`` as one line and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with active(Settings.from_env()) as settings:
                keep_warm_deadlines(settings)
                return fn(*args, **kwargs)
        except FleetrunError as exc:
            from launch.reports.safe_text import MAX_LINE_CHARS, clean

            # the message may quote a node, a job or an inventory: no control characters, bounded
            print(f"fleetrun: error: {clean(exc, MAX_LINE_CHARS, multiline=True)}", file=sys.stderr)
            raise Exit(code=2) from None

    return wrapper
