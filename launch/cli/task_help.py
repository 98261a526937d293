"""``fab TASK --help`` (and ``fleetrun TASK --help``) print the task's help, like ``fab --help TASK``.

Invoke's parser hands every token to a task's missing positional argument before it looks at the
core flags, so ``fab train --help`` ran ``train`` with the playbook ``--help`` ("playbook file not
found"). The fix must live in the tasks themselves: ``fab`` is Fabric's program and copies our
collection into a plain one, so neither the program nor the collection class is ours there. Each
task therefore declares a ``--help`` flag of its own (``-h`` too, where no option took it), which
the parser reads before any positional argument; once it is given, the positional arguments count
as given (so the parse completes), and the task prints its help instead of running.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import fabric
from invoke import Argument, Collection, Program

HELP_FLAG = "help"

ROOT: list[Collection] = []
"""The root collection whose help is printed (``launch.cli.tasks`` appends its ``ns``)."""


class _Positional(Argument):  # type: ignore[misc]
    """A positional argument that reads as given ('') once the task's ``--help`` flag was seen."""

    def __init__(self, *args: Any, helped: Argument, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.helped = helped

    @property
    def value(self) -> Any:
        value = self._value if self._value is not None else self.default
        if value is None and self.helped.value:
            return ""
        return value

    @value.setter
    def value(self, arg: str) -> None:
        self.set_value(arg, cast=True)


def print_task_help(task: fabric.Task) -> None:
    """The text ``fab --help NAME`` prints, under the name the program was called by."""
    root = ROOT[0] if ROOT else Collection(task)
    # fab works on a deep copy of the collection: a task is known by its body, not its identity
    name = next((n for n in root.task_names if root[n].body is task.body), task.name)
    binary = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fleetrun"
    Program(namespace=root, name=binary, binary=binary).run([binary, "--help", name], exit=False)


class HelpfulTask(fabric.Task):  # type: ignore[misc]
    """A Fabric task with its own ``--help`` flag: given it, the task prints its help and does nothing else."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        args: list[Argument] = super().get_arguments(ignore_unknown_help=ignore_unknown_help)
        taken = {name for arg in args for name in arg.names}
        names = (HELP_FLAG,) if "h" in taken else (HELP_FLAG, "h")
        helped = Argument(names=names, kind=bool, default=False, help="show this help and exit")
        out = [
            _Positional(
                names=arg.names,
                kind=arg.kind,
                default=arg.default,
                help=arg.help,
                positional=True,
                optional=arg.optional,
                incrementable=arg.incrementable,
                attr_name=arg.attr_name,
                helped=helped,
            )
            if arg.positional
            else arg
            for arg in args
        ]
        return [*out, helped]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop(HELP_FLAG, False):
            print_task_help(self)
            return None
        return super().__call__(*args, **kwargs)


def task(*args: Any, **kwargs: Any) -> Callable[..., Any] | HelpfulTask:
    """``fabric.task`` making a ``HelpfulTask``."""
    kwargs.setdefault("klass", HelpfulTask)
    return fabric.task(*args, **kwargs)  # type: ignore[no-any-return]
