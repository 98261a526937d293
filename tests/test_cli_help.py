"""One command-line surface: every task's help asked either way, the same options under the same
names in every command, one meaning per short flag, and ``fab``/``fleetrun`` from any folder.

Run in-process through the programs that parse fleetrun's command lines: fleetrun's own (behind
both the ``fab`` and the ``fleetrun`` scripts) and, for help only, Fabric's ``fab`` over the
collection (what a checkout's ``fabfile.py`` gets where Fabric's script was installed last).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fabric.config import Config as FabricConfig
from fabric.executor import Executor as FabricExecutor
from fabric.main import Fab
from invoke import Argument, Program

from launch.cli.main import program
from launch.cli.options import PLAYBOOK_OPTIONS_ATTR, SHARED, SHORT_FLAGS
from launch.cli.program import CORE_SHORT_FLAGS
from launch.cli.tasks import ns

ROOT = Path(__file__).resolve().parent.parent
TASKS = sorted(ns.task_names)
PROGRAMS = pytest.mark.parametrize(
    "make", [lambda: program("fab"), lambda: program("fleetrun")], ids=["fab", "fleetrun"]
)

READERS = {"train", "plan", "sweep", "doctor", "export", "demo"}
"""The commands that read a playbook file."""
RUNS_TO_THE_END = {"train", "sweep", "demo"}
"""Those that run the job to its end (its on_end hooks): --allow-local-hooks."""
MAKE_THEIR_OWN_MACHINES = {"export", "demo"}
"""Readers without --inventory: export writes a manifest, demo brings up its own local fleet."""


def _fabric_fab() -> Program:
    return Fab(
        name="Fabric", namespace=ns, binary="fab", executor_class=FabricExecutor, config_class=FabricConfig
    )


def _help_of(
    make: Callable[[], Program], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    make().run(argv, exit=False)
    captured = capsys.readouterr()
    return captured.out, captured.err


def _arguments(name: str) -> list[Argument]:
    return list(ns[name].get_arguments())


def test_the_collection_has_every_task() -> None:
    assert {"train", "show", "exec", "local.up", "logs", "export"} <= set(TASKS)


@PROGRAMS
@pytest.mark.parametrize("name", TASKS)
def test_every_task_prints_its_help_whichever_way_asked(
    name: str, make: Callable[[], Program], capsys: pytest.CaptureFixture[str]
) -> None:
    docstring = inspect.getdoc(ns[name].body) or ""
    first_line = docstring.splitlines()[0]
    outputs = []
    for argv in (["prog", name, "--help"], ["prog", name, "-h"], ["prog", "--help", name]):
        out, err = _help_of(make, argv, capsys)
        assert out.startswith(f"Usage: {make().binary} {name} "), (argv, out, err)
        assert first_line in out, (argv, out)
        assert not err, (argv, err)
        assert "--core-opts" not in out and "Docstring:" not in out
        outputs.append(out)
    assert len(set(outputs)) == 1, "--help after the task reads the same as --help before it"


def test_help_after_a_positional_argument_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _help_of(
        lambda: program("fab"), ["fab", "train", "playbooks/none.yaml", "--dry-run", "--help"], capsys
    )
    assert "Sync, set up, launch and watch" in out and "--dry-run" in out and not err


def test_help_shows_a_value_for_every_option_that_takes_one(capsys: pytest.CaptureFixture[str]) -> None:
    """Invoke's own rows showed ``--set`` (a list) and ``--timeout`` (a float) like yes/no flags."""
    out, _ = _help_of(lambda: program("fab"), ["fab", "train", "--help"], capsys)
    assert "-s TEXT, --set=TEXT" in out and "--allow-path=TEXT" in out and "-i TEXT, --inventory=TEXT" in out
    out, _ = _help_of(lambda: program("fab"), ["fab", "exec", "--help"], capsys)
    assert "--timeout=NUMBER" in out and "--quiet " in out


def test_a_task_help_under_fabrics_own_fab_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    """Where Fabric's script answers (a checkout's fabfile.py, Fabric installed after fleetrun),
    ``fab train --help`` prints the help, not "playbook file not found"."""
    out, err = _help_of(_fabric_fab, ["fab", "train", "--help"], capsys)
    assert out.startswith("Usage: ") and " train PLAYBOOK [--options]" in out and "--allow-path" in out, (
        out,
        err,
    )
    assert "error" not in err.lower()


@PROGRAMS
@pytest.mark.parametrize("flag", [["--help"], ["-h"], []])
def test_alone_it_shows_its_commands_and_first_steps_not_invokes_options(
    make: Callable[[], Program], flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    binary = make().binary
    out, err = _help_of(make, [binary, *flag], capsys)
    assert not err
    assert "First steps:" in out and f"{binary} examples" in out and f"{binary} train " in out
    for name in TASKS:
        assert f"  {name} " in out, name
    for core_option in ("Core options", "--write-pyc", "--prompt-for-sudo-password", "--hide", "-H STRING"):
        assert core_option not in out, core_option
    assert "Subcommands" not in out and "Commands:" in out


def test_a_shared_option_is_one_definition_in_every_command() -> None:
    """Same name, same help, kind, default and short flag in every command that takes it."""
    seen: dict[str, dict[str, tuple[object, ...]]] = {}
    for name in TASKS:
        for arg in _arguments(name):
            if arg.attr_name in SHARED or arg.name in SHARED:
                option = SHARED[arg.attr_name or arg.name]
                seen.setdefault(option.param, {})[name] = (
                    arg.help,
                    arg.kind,
                    tuple(arg.names),
                    repr(arg.default),
                )
                assert arg.help == option.help, (name, arg.name)
    for param, by_task in seen.items():
        assert len(set(by_task.values())) == 1, (param, by_task)
    assert set(seen["inventory"]) >= {"train", "plan", "sweep", "doctor", "exec", "queue"}


NAME_SUFFIXES = re.compile(r"-(id|ids|name|file|dir|path|count)$")
"""What a second spelling of one option's name tends to add (``--sweep-id`` beside ``--sweep``)."""


def test_one_thing_has_one_name_in_every_command() -> None:
    """Every task's options walked: two commands that name one thing differently (``fab train
    --sweep-id ID`` and ``fab runs --sweep ID`` both meant a sweep's id) fail, as do two
    spellings of a shared option (``--allow-paths``, ``--overrides``) beside the shared one."""
    spellings: dict[str, set[str]] = {}
    for name in TASKS:
        for arg in _arguments(name):
            long = arg.names[0]
            spellings.setdefault(NAME_SUFFIXES.sub("", long), set()).add(long)
            for option in SHARED.values():
                if long != option.flag:
                    close = difflib.SequenceMatcher(None, long, option.flag).ratio() >= 0.8
                    assert not close and arg.help != option.help, (name, long, option.flag)
    assert not {k: v for k, v in spellings.items() if len(v) > 1}


def test_every_command_that_reads_a_playbook_takes_the_playbook_options() -> None:
    declared = {n for n in TASKS if getattr(ns[n].body, PLAYBOOK_OPTIONS_ATTR, None) is not None}
    assert declared == READERS, "each reader says so with @reads_playbook (and nothing else does)"
    for name in TASKS:
        flags = {n for a in _arguments(name) for n in a.names}
        if name not in READERS:
            assert not flags & {"set", "allow-path", "allow-local-hooks"}, name
            continue
        expected = {"set", "allow-path"}
        expected |= set() if name in MAKE_THEIR_OWN_MACHINES else {"inventory"}
        expected |= {"allow-local-hooks"} if name in RUNS_TO_THE_END else set()
        assert expected <= flags, (name, expected - flags)
        if name not in RUNS_TO_THE_END:
            assert "allow-local-hooks" not in flags, name


def test_a_short_flag_means_one_thing_in_every_task() -> None:
    meaning: dict[str, set[str]] = {}
    for name in TASKS:
        for arg in _arguments(name):
            long = arg.names[0]
            for short in (n for n in arg.names if len(n) == 1):
                meaning.setdefault(short, set()).add(long)
                assert SHORT_FLAGS.get(long.replace("-", "_")) == short, (name, long, short)
        names = {n for a in _arguments(name) for n in a.names}
        assert "h" in names and "help" in names, f"-h is help in {name}"
    assert all(len(longs) == 1 for longs in meaning.values()), meaning
    core = {short for short in CORE_SHORT_FLAGS.values()} - {"h"}
    assert not core & set(meaning), "a task's short flag would read as a core option elsewhere"
    assert "-s" not in {f"-{n}" for a in _arguments("train") for n in a.names if a.names[0] == "skip-doctor"}


def test_the_scripts_are_declared() -> None:
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    lines = {line.split("#")[0].strip() for line in scripts.splitlines()}
    assert {'fleetrun = "launch.cli.main:main"', 'fab = "launch.cli.main:fab"'} <= lines, scripts


def _script(entry: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The console script ``entry`` as pip writes it, run in ``cwd`` with the checkout importable."""
    code = f"import sys; from launch.cli.main import {entry}; sys.argv[0] = 'fab'; sys.exit({entry}())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_fab_outside_a_checkout_runs_fleetruns_commands(tmp_path: Path) -> None:
    listed = _script("fab", ["--help"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "Can't find any collection" not in listed.stderr
    assert (
        "Commands:" in listed.stdout and "  train " in listed.stdout and "Core options" not in listed.stdout
    )
    helped = _script("fab", ["train", "--help"], tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: fab train PLAYBOOK"), helped.stderr


def test_fab_in_the_checkout_is_fleetruns_and_a_foreign_fabfile_gets_fabric(tmp_path: Path) -> None:
    here = _script("fab", ["-l"], ROOT)
    assert here.returncode == 0 and "  train " in here.stdout, here.stderr
    (tmp_path / "fabfile.py").write_text(
        "from fabric import task\n\n@task\ndef deploy(c):\n    print('deployed')\n"
    )
    theirs = _script("fab", ["deploy"], tmp_path)
    assert theirs.returncode == 0 and "deployed" in theirs.stdout, theirs.stderr
