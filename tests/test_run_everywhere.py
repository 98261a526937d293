"""``fab exec``: a command on every node of the 3-node local fleet, pdsh-style, per-host results."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

from launch.fleets.local import LocalFleet
from launch.transport.run_everywhere import run_everywhere
from tests.conftest import REPO, TEST_PREFIX, needs_root

pytestmark = needs_root()


def _fab_exec(command: str, fleetrun_home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home)}
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), "exec", command, "--inventory", f"local:{TEST_PREFIX}", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_fab_exec_prints_each_nodes_output_as_its_own_user(fleet: LocalFleet, fleetrun_home: Path) -> None:
    proc = _fab_exec("echo hello from $(whoami) on $(hostname)", fleetrun_home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = set(proc.stdout.splitlines())
    for i in range(3):
        name = fleet.node_name(i)
        assert f"{name}: hello from {name} on {name}" in lines


def test_fab_exec_names_the_node_that_failed_and_exits_1(fleet: LocalFleet, fleetrun_home: Path) -> None:
    bad = fleet.node_name(1)
    proc = _fab_exec(f'[ "$(hostname)" != {bad} ] || exit 7', fleetrun_home, "--quiet")
    assert proc.returncode == 1
    assert f"fleetrun: {bad}: FAILED: exit code 7" in proc.stdout
    assert "2/3 node(s) ok, 1 failed" in proc.stdout


def test_unreachable_host_is_reported_without_blocking_the_others(fleet: LocalFleet) -> None:
    """A host with no machine behind its address fails on its own; the live nodes still answer."""
    inventory = fleet.inventory()
    ghost = inventory.hosts[2].model_copy(update={"name": "ghost", "address": "198.18.1.250"})
    mixed = inventory.model_copy(update={"hosts": [*inventory.hosts[:2], ghost]})
    out = io.StringIO()
    result = run_everywhere(mixed, "echo up", timeout=20, out=out)
    assert sorted(result.ok) == sorted(h.name for h in inventory.hosts[:2])
    assert list(result.failed) == ["ghost"]
    assert "198.18.1.250" in result.failed["ghost"]
    assert "fleetrun: ghost: FAILED:" in out.getvalue()


def test_a_nodes_output_cannot_drive_the_operators_terminal() -> None:
    """``fab exec`` prints what a node sent as data: ESC sequences (retitle, clear, hyperlinks),
    BEL, backspace and bidi overrides become ``?``; tabs stay; a node's failure text too."""
    from launch.transport.exec_report import ExecReport

    out = io.StringIO()
    report = ExecReport(["n0", "n1"], out)
    report.answered("n0", 0, "\x1b]0;pwned\x07title\tok\n\x1b[2Jcleared\x08\u202eevil\n", "")
    report.unreachable("n1", "refused \x1b[31mred")
    result = report.finish()
    assert out.getvalue() == (
        "n0: ?]0;pwned?title\tok\n"
        "n0: ?[2Jcleared??evil\n"
        "fleetrun: n1: FAILED: refused ?[31mred\n"
        "fleetrun: 1/2 node(s) ok, 1 failed\n"
    )
    assert result.ok == ["n0"] and "\x1b" not in out.getvalue()
