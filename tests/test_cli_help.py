"""Every task's help, asked either way: ``fab TASK --help``, ``fab TASK -h`` and ``fab --help TASK``.

Invoke gives a task's missing positional argument every token before it looks at core flags, so
``fab train --help`` used to run ``train`` with the playbook ``--help``. Run in-process through
both programs that parse fleetrun's command lines: Fabric's (``fab``) and Invoke's (``fleetrun``).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fabric.config import Config as FabricConfig
from fabric.executor import Executor as FabricExecutor
from fabric.main import Fab
from invoke import Program

from launch.cli.main import program as fleetrun_program
from launch.cli.tasks import ns

ROOT = Path(__file__).resolve().parent.parent
TASKS = sorted(ns.task_names)


def _fab() -> Program:
    return Fab(
        name="Fabric", namespace=ns, binary="fab", executor_class=FabricExecutor, config_class=FabricConfig
    )


def _help_of(
    make: Callable[[], Program], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    make().run(argv, exit=False)
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_collection_has_every_task() -> None:
    assert {"train", "show", "exec", "local.up", "logs", "export"} <= set(TASKS)


@pytest.mark.parametrize("make", [_fab, fleetrun_program], ids=["fab", "fleetrun"])
@pytest.mark.parametrize("name", TASKS)
def test_every_task_prints_its_help_whichever_way_asked(
    name: str, make: Callable[[], Program], capsys: pytest.CaptureFixture[str]
) -> None:
    docstring = inspect.getdoc(ns[name].body) or ""
    first_line = docstring.splitlines()[0]
    outputs = []
    for argv in (["prog", name, "--help"], ["prog", name, "-h"], ["prog", "--help", name]):
        if argv[2] == "-h" and "-h" not in {f for a in ns[name].get_arguments() for f in a.names}:
            # the task took -h for an option of its own: only --help is asked for
            continue
        out, err = _help_of(make, argv, capsys)
        assert "Usage:" in out and f" {name} " in out, (argv, out, err)
        assert first_line in out, (argv, out)
        assert "error" not in err.lower() and "not found" not in err, (argv, err)
        outputs.append(out.split("\n", 1)[1])  # the Usage line names argv[0]
    assert len(set(outputs)) == 1, "--help after the task reads the same as --help before it"


def test_help_after_a_positional_argument_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _help_of(_fab, ["fab", "train", "playbooks/none.yaml", "--dry-run", "--help"], capsys)
    assert "Sync, set up, launch and watch" in out and "--dry-run" in out and not err


def test_a_task_without_its_positional_argument_still_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _help_of(_fab, ["fab", "show"], capsys)
    assert "did not receive required positional arguments: 'run'" in err


def test_the_fab_command_itself() -> None:
    """The real ``fab`` (the fabfile of the checkout), as a user types it."""
    fab = Path(sys.executable).parent / "fab"
    result = subprocess.run(
        [str(fab), "train", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: fab [--core-opts] train") and "--playbook" in result.stdout
    assert "playbook file not found" not in result.stderr


@pytest.mark.parametrize("argv", [["fleetrun"], ["fleetrun", "--help"], ["fleetrun", "-h"]])
def test_fleetrun_alone_shows_its_commands_and_first_steps_not_invokes_options(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _help_of(fleetrun_program, argv, capsys)
    assert not err
    assert "First steps:" in out and "fleetrun examples" in out and "fleetrun train " in out
    for name in TASKS:
        assert f"  {name} " in out, name
    for invoke_option in ("Core options", "--write-pyc", "--prompt-for-sudo-password", "--hide"):
        assert invoke_option not in out, invoke_option
    assert "Subcommands" not in out and "Commands:" in out
