"""fleetrun's command line on top of Invoke: the program behind both ``fab`` and ``fleetrun``.

Invoke parses; this class decides what the user sees. Three things differ from Invoke's own
``Program`` (and from Fabric's ``fab``, which is Invoke's program plus SSH host flags):

* ``--help`` (and the bare command) lists fleetrun's commands and first steps, not Invoke's core
  options (``--hide``, ``--pty``, ``--write-pyc``...), which steer shell commands fleetrun's
  tasks never run. They still parse, by their long names only.
* A short flag means one thing on every command line: the core options keep only ``-h``
  (help), ``-V`` (version) and ``-l`` (list); every other one-letter flag is a task option's,
  from ``launch.cli.options.SHORT_FLAGS``. (Invoke reads a core flag given after a task name as
  the core flag, so ``fab train job.yaml -e`` used to turn on Invoke's ``--echo``.)
* Every parse error (unknown option or command, a missing value or argument) is one
  ``fleetrun: error:`` line and exit code 2, like every other bad input
  (``docs/reference/exit-codes.md``), not Invoke's own wording and exit code 1.

It imports Invoke only: neither Fabric nor paramiko, which only the commands that reach nodes
load (``fab --help`` and ``fab runs`` do not pay for them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from invoke import Argument, Program
from invoke.exceptions import Exit, ParseError

CORE_SHORT_FLAGS = {"help": "h", "version": "V", "list": "l"}
"""The only one-letter core options; the tests check that no task option takes these letters."""

FIRST_STEPS = (
    ("{binary} examples", "copy the built-in playbooks and example code into ./fleetrun-examples"),
    (
        "{binary} doctor --inventory hosts.yaml",
        "check your machines: SSH, Python, rsync, GPUs, the rendezvous port",
    ),
    (
        "{binary} train fleetrun-examples/playbooks/digits-ddp.yaml --inventory hosts.yaml",
        "sync, launch and watch a job (add --dry-run to only print the plan)",
    ),
)
"""The commands a new user needs first, in the order they need them (the bare command prints them)."""

USAGE_EXIT = 2
"""Bad input, nothing started (``docs/reference/exit-codes.md``)."""


def fleetrun_version() -> str:
    """The installed package's version; read only when shown (``importlib.metadata`` and the
    ``email`` package it loads cost a command that never prints it a tenth of its start-up)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetrun")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


CALLED_AS: list[str] = []
"""The name the running program was called by (``fab``, ``fleetrun``), once it runs."""

VALUE_NAMES = {str: "TEXT", int: "INT", float: "NUMBER", list: "TEXT"}
"""The placeholder of an option's value in help, by kind (a flag takes none)."""


def _flag(name: str) -> str:
    return ("--" if len(name) > 1 else "-") + name


def option_row(arg: Argument) -> tuple[str, str]:
    """``("-i, --inventory=TEXT", help)``: the option's flags with its value, and its help
    (a repeatable option says so; Invoke's own rows showed ``--set`` like a yes/no flag)."""
    value = VALUE_NAMES.get(arg.kind)
    flags = sorted(arg.names, key=len)
    shown = [_flag(n) + ((" " if len(n) == 1 else "=") + value if value else "") for n in flags]
    text = arg.help or ""
    if arg.kind is list and "repeatable" not in text:
        text = f"{text} (repeatable)".strip()
    return ", ".join(shown), text


class FleetrunProgram(Program):  # type: ignore[misc]
    """Invoke's program over fleetrun's collection, with fleetrun's help and errors (module doc)."""

    def print_version(self) -> None:
        print(f"fleetrun {fleetrun_version()}")

    def core_args(self) -> list[Argument]:
        kept: list[Argument] = []
        for arg in super().core_args():
            short = CORE_SHORT_FLAGS.get(arg.name or "")
            names = tuple(n for n in arg.names if len(n) > 1 or n == short)
            kept.append(
                Argument(
                    names=names,
                    kind=arg.kind,
                    default=arg.default,
                    help=arg.help,
                    optional=arg.optional,
                    incrementable=arg.incrementable,
                )
            )
        return kept

    # -- help ---------------------------------------------------------------------------------

    def print_help(self) -> None:
        print(f"Usage: {self.binary} <command> [--options]   (fleetrun {fleetrun_version()})")
        print("")
        print("Launch multi-node training jobs on machines you own or rent, watch them, record every run.")
        print("")
        print("First steps:")
        print("")
        for command, what in FIRST_STEPS:
            print(f"  {command.format(binary=self.binary)}")
            print(f"      {what}")
        print("")
        if self.namespace is not None:
            self.list_tasks()
        print(
            f"'{self.binary} COMMAND --help' shows a command's options; '{self.binary} --version' its version."
        )

    def task_list_opener(self, extra: str = "") -> str:
        opener: str = super().task_list_opener(extra=extra)
        return "Commands" if opener == "Subcommands" else opener

    def print_task_help(self, name: str) -> None:
        """``Usage: fab train PLAYBOOK [--options]``, the docstring, the options (no core options)."""
        import inspect

        ctx = self.parser.contexts[name]
        positional = " ".join(arg.name.upper() for arg in ctx.positional_args)
        print(f"Usage: {self.binary} {name} {positional + ' ' if positional else ''}[--options]")
        print("")
        for line in (inspect.getdoc(self.collection[name]) or "").splitlines():
            print(self.leading_indent + line if line.strip() else "")
        print("")
        print("Options:")
        rows = [option_row(arg) for arg in ctx.args.values()]
        if rows:
            self.print_columns(rows)
        else:
            print(self.leading_indent + "none")

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        CALLED_AS[:] = [self.binary]  # the name a task's own --help prints under
        super().run(argv, exit=exit)

    # -- parse errors: one line, exit 2 ---------------------------------------------------------

    def parse_core(self, argv: list[str] | None) -> None:
        with self._usage_errors():
            super().parse_core(argv)

    def parse_tasks(self) -> None:
        with self._usage_errors():
            super().parse_tasks()
            self._check_repeatable_values(list(self.core.unparsed))

    def _check_repeatable_values(self, tokens: list[str]) -> None:
        """A repeatable option (``--set``, ``--allow-path``, ``--grid``) given without its value,
        last or before another option: a parse error. Invoke starts such an option's value as an
        empty list, which its parser takes for a value given, so ``fab train job.yaml --set``
        used to run with no change at all."""
        contexts = self.parser.contexts
        context: Any = None
        waiting: str | None = None
        for token in tokens:
            if waiting is not None:
                if token in context.flags or token == "--":
                    raise ParseError(f"Flag <list: {waiting}> needed value and was not given one!", context)
                waiting = None
            elif token in contexts:
                context = contexts[token]
            elif context is not None and token in context.flags and context.flags[token].kind is list:
                waiting = context.flags[token].names[0]
        if waiting is not None:
            raise ParseError(f"Flag <list: {waiting}> needed value and was not given one!", context)

    def parse_cleanup(self) -> None:
        with self._usage_errors():
            super().parse_cleanup()

    @contextmanager
    def _usage_errors(self) -> Iterator[None]:
        try:
            yield
        except ParseError as exc:
            context = getattr(exc, "context", None)
            task = getattr(context, "name", None) if context is not None else None
            raise Exit(
                message=f"fleetrun: error: {self.usage_error(str(exc), task)}", code=USAGE_EXIT
            ) from None
        except Exit as exc:
            if exc.code == 1 and isinstance(exc.message, str) and exc.message.startswith("Sub-collection"):
                raise Exit(message=f"fleetrun: error: --list: {exc.message}", code=USAGE_EXIT) from None
            raise

    def usage_error(self, message: str, task: str | None) -> str:
        """Invoke's parse error ``message`` (raised in ``task``'s options, or before any task) said
        in fleetrun's words, naming the command and where its options are listed."""
        from launch.reports.safe_text import clean

        where = f"{self.binary} {task}" if task else self.binary
        see = f"'{where} --help' lists {'its options' if task else 'the commands'}"
        rules: tuple[tuple[str, Callable[[re.Match[str]], str]], ...] = (
            (r"No idea what '(.*)' is!$", lambda m: self._unknown(m.group(1), task, where)),
            (
                r"Flag <\w+: ([\w-]+).*> needed value and was not given one!$",
                lambda m: f"{where}: {_flag(m.group(1))} needs a value",
            ),
            (
                r"'(.*)' did not receive required positional arguments: (.*)$",
                lambda m: (
                    f"{self.binary} {m.group(1)}: missing "
                    + ", ".join(n.strip("' ").upper().replace("_", "-") for n in m.group(2).split(","))
                ),
            ),
            (
                r"Flag <\w+: ([\w-]+).*> doesn't take any value!$",
                lambda m: f"{where}: {_flag(m.group(1))} takes no value",
            ),
        )
        for pattern, say in rules:
            match = re.match(pattern, message, re.DOTALL)
            if match:
                return f"{clean(say(match), 400)}; {see}"
        return f"{where}: {clean(message, 400)}; {see}"

    def _unknown(self, token: str, task: str | None, where: str) -> str:
        import difflib

        from launch.reports.safe_text import clean

        shown = repr(clean(token, 100))
        if token.startswith("-"):
            return f"{where}: unknown option {shown}"
        names: list[str] = list(self.collection.task_names) if self.collection is not None else []
        close = difflib.get_close_matches(token, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        if task:
            return f"{where}: unexpected argument {shown}{hint}"
        return f"unknown command {shown}{hint}"


def program(namespace: Any, binary: str) -> FleetrunProgram:
    """The program over ``namespace`` under the name the user typed (``fab`` or ``fleetrun``)."""
    return FleetrunProgram(namespace=namespace, name="fleetrun", binary=binary)
