"""The options several commands share, each declared once: its name, help, kind, default and short flag.

Before, every task spelled its own ``--inventory``/``--set``/``--allow-path`` (or lacked one): a
playbook whose workdir lies outside its folder was refused with "name it on the command line:
``--allow-path DIR``", and only ``fab train`` had that flag. Now a command that reads a playbook
says so with ``@reads_playbook(...)``: the task gets the shared options from this one table, and
its body receives them as one ``PlaybookOptions``. ``launch.cli.task_help.task`` fills the help
and kind of any parameter named here (``fab exec --inventory`` is the same option as ``fab train
--inventory``), and ``SHORT_FLAGS`` is the only source of one-letter flags.
``tests/test_cli_help.py`` walks every task's options against this table.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

SET_HELP = (
    "change a playbook field for this run, as written in the file; repeatable, dotted paths: "
    "--set nodes=2 --set hyperparameters.lr=0.01 --set env.NCCL_DEBUG=INFO --set stop.max_wall_time_s=600"
)


@dataclass(frozen=True)
class Option:
    """One option as every command that takes it spells it.

    Attributes:
        param: the task parameter (``allow_path``); the flag is it with dashes (``--allow-path``).
        help: the help line, the same in every command.
        default: the value when not given (``None`` for a repeatable option: an empty list).
        repeatable: given several times, each adds a value.
    """

    param: str
    help: str
    default: Any
    repeatable: bool = False

    @property
    def flag(self) -> str:
        return self.param.replace("_", "-")


INVENTORY = Option(
    "inventory",
    "the machines: 'local' (default), 'local:<prefix>', 'stack:<name>', stack outputs .json, or inventory .yaml",
    "local",
)
SET = Option("set", SET_HELP, None, repeatable=True)
ALLOW_PATH = Option(
    "allow_path",
    "a directory outside the playbook's folder that its workdir or channels may send (repeatable)",
    None,
    repeatable=True,
)
ALLOW_LOCAL_HOOKS = Option(
    "allow_local_hooks",
    "run the playbook's on_end commands on this machine (remembered for this file's exact bytes)",
    False,
)

SHARED: dict[str, Option] = {o.param: o for o in (INVENTORY, SET, ALLOW_PATH, ALLOW_LOCAL_HOOKS)}
"""Every option more than one command takes, by parameter name."""

SHORT_FLAGS: dict[str, str] = {"help": "h", "inventory": "i", "playbook": "p", "set": "s"}
"""The one-letter flags, by option: ``-i`` is ``--inventory`` in every command that has one, and no
other option has a short flag (Invoke's automatic ones made ``-s`` mean ``--skip-doctor`` in
``train`` and ``--set`` in ``sweep``, and ``-h`` mean ``--hosts`` in ``train``)."""


@dataclass(frozen=True)
class PlaybookOptions:
    """What a command was told about its playbook beyond the file: the shared options' values.

    Attributes:
        inventory: the ``--inventory`` selector (``launch.fleets.select``).
        overrides: the ``--set`` items, in order.
        allow_paths: the ``--allow-path`` directories.
        allow_local_hooks: ``--allow-local-hooks`` was given.
    """

    inventory: str = INVENTORY.default
    overrides: tuple[str, ...] = ()
    allow_paths: tuple[Path, ...] = ()
    allow_local_hooks: bool = False

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> PlaybookOptions:
        return cls(
            inventory=values.get("inventory", INVENTORY.default),
            overrides=tuple(values.get("set") or ()),
            allow_paths=tuple(Path(p) for p in values.get("allow_path") or ()),
            allow_local_hooks=bool(values.get("allow_local_hooks", False)),
        )


PLAYBOOK_OPTIONS_ATTR = "playbook_options"
"""Where ``reads_playbook`` leaves, on the task body, the options it gave the task."""

F = TypeVar("F", bound=Callable[..., Any])


def reads_playbook(*, inventory: bool = True, hooks: bool = False) -> Callable[[F], F]:
    """The task reads a playbook: it takes ``--set`` and ``--allow-path``, ``--inventory`` when
    it runs on machines (``inventory=False``: ``fab export``, ``fab demo`` make their own) and
    ``--allow-local-hooks`` when it runs the job to its end (``hooks=True``). The body declares
    a keyword parameter ``opts: PlaybookOptions`` and receives the values in it."""
    applied = tuple(
        o
        for o, wanted in ((INVENTORY, inventory), (SET, True), (ALLOW_PATH, True), (ALLOW_LOCAL_HOOKS, hooks))
        if wanted
    )

    def decorate(body: F) -> F:
        signature = inspect.signature(body)
        if "opts" not in signature.parameters:
            raise TypeError(f"{body.__name__}: a task that reads a playbook takes 'opts: PlaybookOptions'")
        own = [p for p in signature.parameters.values() if p.name != "opts"]
        shared = [
            inspect.Parameter(o.param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default)
            for o in applied
        ]

        @functools.wraps(body)
        def task_body(*args: Any, **kwargs: Any) -> Any:
            values = {o.param: kwargs.pop(o.param, o.default) for o in applied}
            return body(*args, opts=PlaybookOptions.from_values(values), **kwargs)

        task_body.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
        setattr(task_body, PLAYBOOK_OPTIONS_ATTR, applied)
        return task_body  # type: ignore[return-value]

    return decorate
