"""How fleetrun declares a task: its ``--help``, its short flags, its shared options' help.

Invoke's parser hands every token to a task's missing positional argument before it looks at the
core flags, so ``fab train --help`` ran ``train`` with the playbook ``--help`` ("playbook file not
found"), and ``fab train --bogus`` read the playbook ``--bogus``. The fix lives in the tasks
themselves, so it holds under any program that parses them (``launch.cli.program``'s, and
Fabric's ``fab`` through a checkout's ``fabfile.py`` where Fabric's script was installed last):
each task declares a ``--help``/``-h`` flag of its own, which the parser reads before any
positional argument; once it is given, the positional arguments count as given (so the parse
completes), and the task prints its help instead of running. A token that looks like a flag is
never a positional argument's value, so an unknown option is reported as one.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import invoke
from invoke import Argument, Collection
from invoke.exceptions import Exit
from invoke.parser.parser import ParseMachine

from launch.cli.options import SHARED, SHORT_FLAGS

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
        if value is None and _looks_like_a_flag(_token_being_handled()):
            return ""  # `fab train --bogus`: an unknown option, not the playbook '--bogus'
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
        token = _token_being_handled()
        if (
            self._value is None
            and not self.helped.value
            and token is not None
            and not _looks_like_a_flag(token)
        ):
            return None
        return super().value

    @value.setter
    def value(self, arg: str) -> None:
        self.set_value(arg, cast=True)


def _token_being_handled() -> str | None:
    """The token ``ParseMachine.handle`` is deciding about, when it is among the nearest callers
    (asking whether a positional argument is still missing); else ``None``."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        if frame.f_code.co_name == "handle" and isinstance(frame.f_locals.get("self"), ParseMachine):
            token = frame.f_locals.get("token")
            return token if isinstance(token, str) else None
        frame = frame.f_back
    return None


def _looks_like_a_flag(token: str | None) -> bool:
    """``--name`` or ``-x``: never taken as a positional argument's value (a value that starts
    with a dash goes in the long form, ``--playbook=-odd.yaml``)."""
    return token is not None and len(token) > 1 and token.startswith("-")


def print_task_help(task: invoke.Task) -> None:
    """The text ``fab --help NAME`` prints, under the name the program was called by."""
    from launch.cli.program import CALLED_AS, program

    root = ROOT[0] if ROOT else Collection(task)
    # a program may work on a copy of the collection: a task is known by its body, not its identity
    name = next((n for n in root.task_names if root[n].body is task.body), task.name)
    binary = CALLED_AS[0] if CALLED_AS else "fab"  # no program of ours ran: Fabric's fab did
    program(root, binary).run([binary, "--help", name], exit=False)


class HelpfulTask(invoke.Task):  # type: ignore[misc]
    """A task with its own ``--help`` flag (given it, the task prints its help and does nothing
    else), the shared options' help from ``launch.cli.options``, and one-letter flags only from
    ``SHORT_FLAGS`` (Invoke's automatic ones are off: they gave one letter a different meaning
    in each task)."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        kept = dict(self.help)  # Invoke pops each help text it uses: a second call had none
        try:
            args: list[Argument] = super().get_arguments(ignore_unknown_help=ignore_unknown_help)
        finally:
            self.help = kept
        helped = Argument(
            names=(HELP_FLAG, SHORT_FLAGS[HELP_FLAG]),
            kind=bool,
            default=False,
            help="show this help and exit",
        )
        out = [_with_short_flag(arg, helped) for arg in args]
        return [*out, helped]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop(HELP_FLAG, False):
            print_task_help(self)
            return None
        return super().__call__(*args, **kwargs)


def _with_short_flag(arg: Argument, helped: Argument) -> Argument:
    """``arg`` as a checked argument, named by its long name and its ``SHORT_FLAGS`` letter, if any."""
    names = (arg.names[0], SHORT_FLAGS[arg.name]) if arg.name in SHORT_FLAGS else arg.names[:1]
    common = dict(
        names=names,
        kind=arg.kind,
        default=arg.default,
        help=arg.help,
        optional=arg.optional,
        incrementable=arg.incrementable,
        attr_name=arg.attr_name,
    )
    if arg.positional:
        klass = _Positional if arg.default is None else _OptionalPositional
        return klass(positional=True, helped=helped, **common)
    return _Checked(**common)


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], HelpfulTask]:
    """``invoke.task(**kwargs)`` making a ``HelpfulTask``; a parameter named as a shared option
    (``launch.cli.options.SHARED``) gets that option's help and kind, unless the task says otherwise."""
    kwargs.setdefault("klass", HelpfulTask)
    kwargs.setdefault("auto_shortflags", False)
    helps = dict(kwargs.pop("help", None) or {})
    iterable = list(kwargs.pop("iterable", None) or [])

    def make(body: Callable[..., Any]) -> HelpfulTask:
        own_iterable = list(iterable)
        own_helps = dict(helps)
        for name in inspect.signature(body).parameters:
            option = SHARED.get(name)
            if option is None:
                continue
            own_helps.setdefault(option.flag, option.help)
            if option.repeatable and name not in own_iterable:
                own_iterable.append(name)
        made = invoke.task(body, help=own_helps, iterable=own_iterable, **kwargs)
        assert isinstance(made, HelpfulTask)
        return made

    return make
