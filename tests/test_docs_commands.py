"""Every ``fab`` command the README and the docs show runs as shown.

The README once showed ``fab sweep job.yaml --grid lr=0.1,0.01`` (``lr`` is no field:
``hyperparameters.lr`` is), and the docs spelled one node three ways, two of which never exist.
So each command is checked against the real task definitions and the real validators, without
starting a fleet or reaching a host:

* each line of a fenced ``sh``/``bash``/``shell`` block that runs ``fab``, ``.venv/bin/fab`` or
  ``fleetrun`` parses with the real program (the task exists, its options exist, their values
  are of their kind, the required arguments are given);
* each command, in a fenced block or an inline code span: the task and its options exist, and
  its ``--set`` and ``--grid`` values validate against the playbook it names (a placeholder such
  as ``job.yaml`` stands for a built-in playbook); a ``fab sweep``'s options are checked as
  ``fab sweep`` checks them before its first variant (``launch.planning.sweep_plan.plan_sweep``);
* the dry runs (``fab plan``, ``fab train --dry-run``) run for real, on a stand-in inventory
  (a placeholder ``hosts.yaml``; ``local`` needs a live local fleet);
* a local fleet's node in an example is named as the fleet names it (``frnode1``, as user and
  host; ``fr-node1`` only as its network namespace, ``launch.fleets.local.naming``).
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fabric.config import Config as FabricConfig
from fabric.executor import Executor as FabricExecutor
from fabric.main import Fab
from invoke import Program
from invoke.exceptions import Exit, ParseError
from invoke.parser import ParseResult

from launch.cli.main import program as fleetrun_program
from launch.cli.tasks import ns
from launch.fleets.local.naming import PREFIX_RE, FleetNames
from launch.job.builtin import resolve_playbook
from launch.job.overrides import parse_overrides
from launch.job.spec import load_job_spec
from launch.planning.sweep_plan import plan_sweep
from tests.conftest import REPO, fab, sample_inventory

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_FENCES = ("sh", "bash", "shell")
PROGRAMS = ("fab", ".venv/bin/fab", "fleetrun")
COMMAND_RE = re.compile(r"\s*(?:\.venv/bin/fab|fab|fleetrun)\s")
INLINE_RE = re.compile(r"`((?:\.venv/bin/fab|fab|fleetrun) [^`]+)`")
FENCE_RE = re.compile(r"^\s*```(\S*)")
STAND_IN_PLAYBOOK = "playbooks/digits-ddp.yaml"
NOT_A_COMMAND = {
    "fab trian",
    "fab train job.yaml --bogus",
    "fab train: unknown option '--bogus'",
    "fab show: missing RUN",
    "fab runs: --limit needs a value",
}
"""Shown on purpose as what fails, or as the error line it gives (docs/reference/exit-codes.md,
docs/cli.md)."""


@dataclass(frozen=True)
class DocCommand:
    """One command as a page shows it: in a fenced shell block, or in an inline code span."""

    page: Path
    line: int
    text: str
    fenced: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {self.text}"

    @property
    def words(self) -> list[str]:
        """The command line as the shell splits it (its comment and a trailing ``&`` left out),
        the program as ``fab`` or ``fleetrun``."""
        words = shlex.split(self.text, comments=True)
        if words and words[-1] == "&":
            words.pop()
        return ["fleetrun" if words[0] == "fleetrun" else "fab", *words[1:]]

    @property
    def task(self) -> str:
        return next((w for w in self.words[1:] if not w.startswith("-")), "")


def code_lines(page: Path) -> Iterator[tuple[int, str, str | None]]:
    """Each line of a page with the language of the fenced block it is in (None: prose)."""
    fence: str | None = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE_RE.match(line)
        if match:
            fence = (match.group(1) or "text") if fence is None else None
            continue
        yield number, line, fence


def doc_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for page in PAGES:
        for number, line, fence in code_lines(page):
            if fence in SHELL_FENCES and COMMAND_RE.match(line):
                found.append(DocCommand(page, number, line.strip(), fenced=True))
            elif fence is None:
                found += [
                    DocCommand(page, number, m.group(1), fenced=False) for m in INLINE_RE.finditer(line)
                ]
    return [c for c in found + task_examples() if c.text not in NOT_A_COMMAND]


def task_examples() -> list[DocCommand]:
    """The ``Example:`` lines of each task's docstring (``fab TASK --help``, and the reference
    page generated from them), a parenthesised remark after the command left out."""
    found = []
    for name in sorted(ns.task_names):
        body = ns[name].body
        source = Path(inspect.getsourcefile(body) or "")
        lines = (inspect.getdoc(body) or "").splitlines()
        for number, line in enumerate(lines):
            text = line.removeprefix("Example:").strip()
            shown = line.startswith("Example:") or (number and lines[number - 1].startswith("Example:"))
            if shown and COMMAND_RE.match(text + " "):
                text = re.split(r"\s{2,}\(", text)[0]
                found.append(DocCommand(source, body.__code__.co_firstlineno, text, fenced=True))
    return found


COMMANDS = doc_commands()
FENCED = [c for c in COMMANDS if c.fenced]


def _program(name: str) -> Program:
    if name == "fleetrun":
        return fleetrun_program()
    return Fab(
        name="Fabric", namespace=ns, binary="fab", executor_class=FabricExecutor, config_class=FabricConfig
    )


def parse(words: list[str]) -> ParseResult:
    """The command line parsed as the program parses it before running a task (ParseError, or
    Exit for a value not of its option's kind, when it would not run)."""
    program = _program(words[0])
    program.create_config()
    program.parse_core(words)
    program.parse_collection()
    program.parse_tasks()
    return program.tasks


def test_the_docs_show_commands_to_check() -> None:
    """The extraction finds what it is meant to (a page's format change would check nothing)."""
    texts = {c.text for c in COMMANDS}
    assert len(FENCED) > 40 and len(COMMANDS) > 150
    assert ".venv/bin/fab local.up --nodes 3" in texts
    assert any(c.task == "sweep" and not c.fenced and c.page.name == "README.md" for c in COMMANDS)
    assert {"ssh", "queue", "sweep", "forward"} <= {c.task for c in task_examples()}


@pytest.mark.parametrize("command", FENCED, ids=[c.where for c in FENCED])
def test_every_fenced_command_parses_with_the_real_tasks(command: DocCommand) -> None:
    try:
        parsed = parse(command.words)
    except (ParseError, Exit) as exc:
        pytest.fail(f"{command.where}: {exc.message if isinstance(exc, Exit) else exc}")
    assert [context.name for context in parsed][:1] == ([command.task] if command.task else []), command.where


def _options_of(task: str) -> set[str]:
    return {f"-{n}" if len(n) == 1 else f"--{n}" for arg in ns[task].get_arguments() for n in arg.names}


def _values(words: list[str], option: str) -> list[str]:
    """Every value given to ``option`` (``--set X`` or ``--set=X``)."""
    found = []
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words):
            found.append(words[i + 1])
        elif word.startswith(option + "="):
            found.append(word.split("=", 1)[1])
    return found


def _playbook(words: list[str]) -> Path:
    """The playbook a command names, or the stand-in for a placeholder (``job.yaml``)."""
    named = _values(words, "--playbook") or [w for w in words[2:] if w.endswith(".yaml") or "/" in w][:1]
    if named:
        path = resolve_playbook(named[0])
        if not path.is_absolute():
            path = REPO / path
        if path.is_file():
            return path
    return resolve_playbook(STAND_IN_PLAYBOOK)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_command_names_real_options_and_valid_values(command: DocCommand) -> None:
    """Inline spans too (``fab train --wait`` in a sentence names no playbook: only what it
    names is checked), with every ``--set``/``--grid`` validated as the command would."""
    words = command.words
    if command.task.isupper():  # `fab TASK --help`, `fleetrun COMMAND --help`: a placeholder
        return
    if not command.task:  # the program's own options (`fab -l`, `fleetrun --help`)
        assert parse(words) == [], command.where
        return
    assert command.task in ns.task_names, f"{command.where}: no task {command.task!r}"
    options = _options_of(command.task)
    given = [w.split("=", 1)[0] for w in words[1:] if w.startswith("-") and not re.fullmatch(r"-\d.*", w)]
    unknown = [o for o in given if o not in options]
    assert not unknown, f"{command.where}: {command.task} has no option {unknown}"
    sets = _values(words, "--set")
    if command.task == "sweep" and _values(words, "--grid"):
        random = (_values(words, "--random") or [None])[-1]
        plan_sweep(
            _playbook(words), _values(words, "--grid"), sets,
            sample=random if random is None or random.lstrip("-").isdigit() else None,
            parallel=int((_values(words, "--parallel") or ["1"])[-1]),
            max_failures=int((_values(words, "--max-failures") or ["0"])[-1]),
        )  # fmt: skip
    elif sets:
        load_job_spec(_playbook(words), parse_overrides(sets))


DRY_RUNS = [c for c in FENCED if c.task == "plan" or (c.task == "train" and "--dry-run" in c.words)]


@pytest.mark.parametrize("command", DRY_RUNS, ids=[c.where for c in DRY_RUNS])
def test_every_dry_run_shown_runs(command: DocCommand, tmp_path: Path) -> None:
    """``fab plan`` and ``fab train --dry-run`` connect to nothing: run them, the playbook and
    the inventory a placeholder stands for replaced by a built-in playbook and three hosts."""
    inventory = tmp_path / "hosts.yaml"
    hosts = sample_inventory(3).to_yaml_data()["hosts"]  # a lab inventory: hosts only
    inventory.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    words = command.words
    args = words[1:]
    at = args.index("--playbook") + 1 if "--playbook" in args else args.index(command.task) + 1
    args[at] = str(_playbook(words))
    if "--inventory" in args:
        args[args.index("--inventory") + 1] = str(inventory)
    else:
        args += ["--inventory", str(inventory)]
    proc = fab(*args, home=tmp_path / "home", runs=tmp_path / "runs")
    assert proc.returncode == 0, f"{command.where}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert "# fleetrun plan for job" in proc.stdout and "### launch.sh" in proc.stdout, proc.stdout[-2000:]


def test_there_are_dry_runs_to_run() -> None:
    assert len(DRY_RUNS) >= 2, [c.where for c in DRY_RUNS]


# -- node names ------------------------------------------------------------------------------
NODE_LIKE_RE = re.compile(r"(?<![\w.])([a-z][a-z0-9]{0,5}?)(-?)(node|n)(\d+)(?![\w-])")
"""A token that looks like a local fleet's node: ``frnode1``, ``fr-node1``, ``fr-n1``."""


def bad_node_names(line: str) -> list[str]:
    """The names on one example line no local fleet has: a node (host, user, home) is
    ``<prefix>node<i>``; ``<prefix>-node<i>`` is only its network namespace (a line about
    ``netns``/namespaces); no name of a fleet is ``<prefix>-n<i>``."""
    bad = []
    for match in NODE_LIKE_RE.finditer(line):
        prefix, dash, word, index = match.groups()
        if not PREFIX_RE.fullmatch(prefix) or (word == "n" and not dash):
            continue  # not a fleet's name (``gpu1``, ``n0`` of a lab's inventory)
        names = FleetNames(prefix=prefix)
        if match.group(0) == names.node_name(int(index)):
            continue
        if match.group(0) == names.netns(int(index)) and re.search(
            r"netns|namespace", line[: match.start()][-40:]
        ):
            continue  # ``ip netns pids fr-node1``, "in namespaces fr-node0..2"
        bad.append(match.group(0))
    return bad


def example_lines() -> Iterator[tuple[str, str]]:
    """Every line of a fenced block and every inline code span of the README and the docs, and
    every task's example (``fab TASK --help``)."""
    yield from ((c.where, c.text) for c in task_examples())
    for page in PAGES:
        for number, line, fence in code_lines(page):
            where = f"{page.relative_to(REPO)}:{number}"
            if fence is not None:
                yield where, line
            else:
                yield from ((where, span) for span in re.findall(r"`([^`]+)`", line))


def test_node_names_in_examples_are_the_local_fleets_own() -> None:
    """``ssh fleetrun-fr-n1`` (the ssh-config page) never matched: the node is ``frnode1``."""
    wrong = [f"{where}: {name}" for where, line in example_lines() for name in bad_node_names(line)]
    assert wrong == []


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("fab ssh last --node fr-n1 --command 'nvidia-smi'", ["fr-n1"]),
        ("ssh fleetrun-fr-n1", ["fr-n1"]),
        ("nodes fr-node0..2: namespaces 198.18.0.10-12, users frnode0..2", ["fr-node0"]),
        ("nodes frnode0..2 (users too), in namespaces fr-node0..2 at 198.18.0.10-12", []),
        ("ip netns pids fr-node1 | xargs kill -9", []),
        ("pkill -9 -u frnode1 -f trainer.task; fab local.preempt --node frknode3", []),
        ("hosts n0 n1 gpu1, ens5, lan0", []),
    ],
)
def test_the_node_name_check_tells_the_spellings_apart(line: str, bad: list[str]) -> None:
    assert bad_node_names(line) == bad
