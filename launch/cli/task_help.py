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
from types import FrameType
from typing import Any

import fabric
from invoke import Argument, Collection, Program
from invoke.exceptions import Exit
from invoke.parser.parser import ParseMachine

HELP_FLAG = "help"

ROOT: list[Collection] = []
"""The root collection whose help is printed (``launch.cli.tasks`` appends its ``ns``)."""


class _Checked(Argument):  # type: ignore[misc]
    """An argument whose value that is not of its kind (``--port abc``) is one ``fleetrun: error:``
    line and exit code 2, like every other bad input, not Invoke's ``ValueError`` traceback."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast=cast)
        except (ValueError, TypeError):
            kind = {int: "a whole number", float: "a number"}.get(self.kind, self.kind.__name__)
            name = str(self.name or "")
            flag = ("--" if len(name) > 1 else "-") + name.replace("_", "-")
            shown = ascii(value)[:100]
            raise Exit(message=f"fleetrun: error: {flag} {shown}: expected {kind}", code=2) from None


class _Positional(_Checked):
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


class _OptionalPositional(_Positional):
    """A positional argument with a default: ``fab doctor PLAYBOOK`` or just ``fab doctor``.

    Invoke's parser gives a bare token to a positional argument only while that argument reads
    as missing (``None``), and refuses the command when one still reads missing once the task's
    tokens are done, so a positional argument could not be optional. This one reads as missing
    only to the parser's token handler (which then hands it the token), and as its default
    everywhere else (the end-of-task check, the task's keyword arguments)."""

    @property
    def value(self) -> Any:
        if self._value is None and not self.helped.value and _asked_by_the_token_handler():
            return None
        return super().value

    @value.setter
    def value(self, arg: str) -> None:
        self.set_value(arg, cast=True)


def _asked_by_the_token_handler() -> bool:
    """Whether ``ParseMachine.handle`` (deciding what a bare token is) is among the nearest callers."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name == "handle" and isinstance(frame.f_locals.get("self"), ParseMachine):
            return True
        frame = frame.f_back
    return False


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
            (_Positional if arg.default is None else _OptionalPositional)(
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
            else _Checked(
                names=arg.names,
                kind=arg.kind,
                default=arg.default,
                help=arg.help,
                optional=arg.optional,
                incrementable=arg.incrementable,
                attr_name=arg.attr_name,
            )
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
