"""The playbook's hooks: ``on_end:`` (on the laptop) and ``before_stop:`` (on each node), checked.

Nothing tells a researcher that a 9-hour run died at 3 a.m.; a one-line ``on_end`` command (a
webhook, a mail) does, with the run's ``summary.json`` on its stdin. ``before_stop`` runs on each
node when the on-node watchdog ends the run with the laptop gone (flush a cache, copy a file
somewhere), before it stops the processes, uploads and powers off. A hook is a shell command
line; it can neither change the run's outcome nor hold up the teardown: each is bounded by
``hook_timeout_s`` and its failure is only recorded (``launch.run.hooks``, ``fleetrun_hooks``).

Pure data: the types the job spec uses for the fields, and their checks.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

MAX_HOOKS = 16
MAX_HOOK_CHARS = 8192
MAX_HOOK_TIMEOUT_S = 3600.0
DEFAULT_HOOK_TIMEOUT_S = 60.0


def _as_list(value: object) -> object:
    """``on_end: curl ...`` (one command) is a list of one."""
    return [value] if isinstance(value, str) else value


def _check_commands(value: list[str]) -> list[str]:
    for i, line in enumerate(value):
        if "\0" in line or not line.strip() or len(line) > MAX_HOOK_CHARS:
            raise ValueError(
                f"[{i}]: expected a non-empty shell command without NUL, at most {MAX_HOOK_CHARS} characters"
            )
    return value


HookCommands = Annotated[
    list[str], BeforeValidator(_as_list), AfterValidator(_check_commands), Field(max_length=MAX_HOOKS)
]
"""A hook field: one command line or a list of them, each run by ``sh -c`` in order."""

HookTimeout = Annotated[float, Field(gt=0, le=MAX_HOOK_TIMEOUT_S)]
"""Seconds each hook command may run before it is killed (its process group)."""
