"""The keep-warm timer on a node (``fleetrun_warm``), run as a plain local process, and which
fleets are kept warm at all (never lab machines)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from launch.fleets.kinds.refs import LabFleet
from launch.rules.stoprules import Teardown
from launch.run.warm import applies, kept_outcome
from tests.conftest import sample_inventory

TIMER = str(Path(__file__).resolve().parent.parent / "launch" / "nodelib" / "fleetrun_warm.py")


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".fleetrun" / "runs").mkdir(parents=True)
    (home / ".fleetrun" / "poweroff").write_text('touch "$HOME/powered-off"\n')
    return home


def test_no_new_run_in_time_powers_the_node_off(tmp_path: Path) -> None:
    home = _home(tmp_path)
    out = subprocess.run(
        [sys.executable, TIMER, "1"], env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert (home / "powered-off").exists() and "powering this node off" in out.stdout


def test_a_new_run_claims_the_node_and_it_stays_up(tmp_path: Path) -> None:
    home = _home(tmp_path)
    timer = subprocess.Popen(
        [sys.executable, TIMER, "30"], env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (home / ".fleetrun" / "warm.json").exists():
        time.sleep(0.1)
    time.sleep(1.1)  # past the arming second: a run directory made now is newer
    (home / ".fleetrun" / "runs" / "next-run").mkdir()
    out, _ = timer.communicate(timeout=30)
    assert timer.returncode == 0 and "a new run claimed this node" in out
    assert not (home / "powered-off").exists()


def test_only_fleets_that_power_off_are_kept_warm() -> None:
    local = sample_inventory(1)  # a lab inventory by default: never powered off
    assert local.fleet == LabFleet() and not applies(local, 20)
    assert "kept warm for 20 s instead (teardown: always)" in str(kept_outcome(Teardown.ALWAYS, 20))
