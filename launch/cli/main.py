"""The console scripts: ``fleetrun`` and ``fab`` run fleetrun's commands, from any folder.

Both run the tasks of ``launch.cli.tasks.ns`` through ``launch.cli.program`` (fleetrun's help,
one short flag per meaning, parse errors as one line and exit code 2). fleetrun installs its own
``fab`` script over Fabric's: Fabric's looks for a ``fabfile.py`` up from the current folder, so
outside a checkout it answered "Can't find any collection named 'fabfile'!", and inside one its
help listed Fabric's SSH options (``-H``, ``-i``...) before fleetrun's commands.

``fab`` still hands over to Fabric, unchanged, where a folder holds a fabfile of its own (a
project that uses Fabric for something else); a fabfile that only loads fleetrun's collection
(``from launch.cli.tasks import ns``, the checkout's and the one-line file the docs showed)
is fleetrun's, and fleetrun answers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Invoke is imported when a command needs it: ``fab exec`` on a local fleet does not
    from invoke import Program

FLEETRUN_FABFILE_MARK = "launch.cli.tasks"
"""What a fabfile that only loads fleetrun's collection imports."""


def program(binary: str = "fleetrun") -> Program:
    from launch.cli.program import program as fleetrun_program
    from launch.cli.tasks import ns

    return fleetrun_program(ns, binary)


def _run(binary: str, argv: list[str] | None) -> None:
    from launch.cli.fast_exec import main as fast_exec

    code = fast_exec(argv)
    if code is not None:  # ``fab exec`` answered without Invoke, Fabric or the models
        sys.exit(code)
    try:
        program(binary).run(argv)
    except BrokenPipeError:  # `fleetrun --help | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fleetrun`` script; ``argv`` as ``sys.argv`` (program name first)."""
    _run("fleetrun", argv)


def foreign_fabfile(start: Path) -> Path | None:
    """The nearest ``fabfile.py`` (or ``fabfile/``) from ``start`` up, as Fabric would find it,
    when it is not fleetrun's own; ``None`` when there is none or it only loads fleetrun's tasks."""
    for folder in (start, *start.parents):
        for candidate in (folder / "fabfile.py", folder / "fabfile" / "__init__.py"):
            if candidate.is_file():
                try:
                    text = candidate.read_text(errors="replace")
                except OSError:
                    return candidate
                return None if FLEETRUN_FABFILE_MARK in text else candidate
    return None


def fab(argv: list[str] | None = None) -> None:
    """Entry point of the ``fab`` script fleetrun installs (module doc)."""
    try:
        here = Path.cwd()
    except OSError:  # the current folder was removed: no fabfile to defer to
        here = None
    if here is not None and foreign_fabfile(here) is not None:
        from fabric.main import program as fabric_program

        fabric_program.run(argv)
        return
    _run("fab", argv)


if __name__ == "__main__":
    main()
