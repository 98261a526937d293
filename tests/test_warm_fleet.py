"""``keep_warm_s``: after a run the local fleet's node stays up instead of being torn down; the
next run reuses it (setup skipped); with no next run the node powers itself off when the time is
up, with the laptop gone. With the laptop there, its own timer tears the fleet down at the
deadline even when a process the job left behind fools the node's timer; ``fab watch`` of a
warm run keeps it warm the same way. Its own 1-node fleet, brought up for each test (each ends
with the node powered off or the fleet torn down)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.transport.reachability import sshd_answers
from tests.conftest import (
    REPO,
    STEPS_JOB,
    fab,
    fleet_prefix,
    fleet_subnet,
    module_fleet,
    needs_root,
    write_playbook,
)

pytestmark = needs_root()
PREFIX = fleet_prefix("g")


@pytest.fixture
def warm_fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(12), 1) as fleet:
        try:
            yield fleet
        finally:  # a test that failed early: its laptop timer must not tear down while this does
            laptop_gone(fleetrun_home)
            for entry in (fleetrun_home / "warm").glob("*"):
                entry.unlink()


@pytest.fixture
def steps_workdir(tmp_path: Path) -> Path:
    """A copy of the torch-free job (the subject here is the warm fleet, not training), so a test
    can add its own wrapper beside ``steps.py``."""
    target = tmp_path / "steps"
    shutil.copytree(STEPS_JOB, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_kept_warm_reused_then_powered_off_without_the_laptop(
    warm_fleet: LocalFleet, fleetrun_home: Path, steps_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "job.yaml", steps_workdir, name="t-warm", nodes=1, teardown="always", keep_warm_s=120,
        entrypoint="python steps.py --steps 20",
    )  # fmt: skip
    runs = tmp_path / "runs"
    first = fab("train", str(playbook), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    laptop_gone(fleetrun_home)
    assert "kept warm: each node powers itself off in 120 s" in first.stdout
    assert "teardown: skipped: kept warm for 120 s instead (teardown: always)" in first.stdout
    head = warm_fleet.inventory().hosts[0]
    assert sshd_answers(head, 3.0), "teardown: always did not remove the warm fleet"
    # the second run keeps the node warm for 15 s only (its own keep_warm_s re-arms the timer; not
    # part of the setup hash): the 120 s above give its `fab train` the time to claim the node (past
    # them, the laptop's deadline would tear the fleet down when this command starts); the test then
    # waits the 15 s out, so they are short, but long enough to kill the laptop's timer well before
    again = write_playbook(
        tmp_path / "again.yaml", steps_workdir, name="t-warm", nodes=1, teardown="always", keep_warm_s=15,
        entrypoint="python steps.py --steps 20",
    )  # fmt: skip
    second = fab("train", str(again), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "setup skipped: unchanged" in second.stdout, "the warm node was reused as it was"
    assert "kept warm: each node powers itself off in 15 s" in second.stdout
    laptop_gone(fleetrun_home)  # well before its deadline: the node's own timer is left alone
    home = Path(f"/home/{warm_fleet.node_name(0)}/.fleetrun")
    log = (home / "warm.log").read_text()
    assert "a new run claimed this node" in log or "re-armed by a later run" in log, log
    deadline = time.monotonic() + 300  # 15 s after the second run, whatever this machine's load
    while time.monotonic() < deadline and sshd_answers(head, 2.0):
        time.sleep(1)
    assert not sshd_answers(head, 3.0), "the node powered itself off, with no laptop"
    assert "no new run in time: powering this node off" in (home / "warm.log").read_text()
    # the laptop is back: its next command, whatever it is, keeps the deadline it missed
    later = fab("runs", home=fleetrun_home, runs=runs)
    assert later.returncode == 0, later.stdout[-2000:] + later.stderr[-2000:]
    assert "past its deadline: tearing it down" in later.stderr
    assert not list((fleetrun_home / "warm").glob("*.json")), "the deadline was kept and cleared"


def laptop_gone(home: Path) -> None:
    """The laptop goes away: its timer for the warm fleet (a detached process) with it."""
    for pid_file in (home / "warm").glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def kept_warm_result(folder: Path, wait_s: float = 180.0) -> dict[str, object]:
    """The run's ``keep_warm.json`` once it says how the warm fleet ended (waited for, bounded:
    the assertions are on what it says, not on when)."""
    path = folder / "keep_warm.json"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        data = json.loads(path.read_text()) if path.exists() else {}
        if data.get("state") not in (None, "warm"):
            return data
        time.sleep(1)
    return json.loads(path.read_text()) if path.exists() else {}


def only_run(runs: Path) -> Path:
    folders = [p for p in runs.iterdir() if p.is_dir() and (p / "watch.json").exists()]
    assert len(folders) == 1, folders
    return folders[0]


LEFT_BEHIND = """\
import os, runpy, subprocess, sys, time
# a process the job leaves behind, out of its session, touching the runs folder every second:
# the node's own timer takes that for a new run claiming the node
LOOP = 'while true; do mkdir -p "$HOME/.fleetrun/runs/left-$(date +%s)"; sleep 1; done'
subprocess.Popen(["sh", "-c", LOOP], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open(os.path.expanduser("~/job-started"), "w").close()  # the test's sign that the job runs
time.sleep(float(os.environ.get("FIRST_SLEEP_S", "0")))
sys.argv = ["steps.py", *sys.argv[1:]]
runpy.run_path("steps.py", run_name="__main__")
"""


def test_a_process_left_behind_does_not_keep_the_fleet_past_the_deadline(
    warm_fleet: LocalFleet, fleetrun_home: Path, steps_workdir: Path, tmp_path: Path
) -> None:
    head = warm_fleet.inventory().hosts[0]
    (steps_workdir / "leave_behind.py").write_text(LEFT_BEHIND)
    playbook = write_playbook(
        tmp_path / "job.yaml", steps_workdir, name="t-warm-left", nodes=1, teardown="always",
        keep_warm_s=10, entrypoint="python leave_behind.py --steps 20",
    )  # fmt: skip
    runs = tmp_path / "runs"
    run = fab("train", str(playbook), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "kept warm for 10 s instead (teardown: always)" in run.stdout
    folder = only_run(runs)
    result = kept_warm_result(folder)
    assert result.get("state") == "torn_down", result
    assert result["teardown"]["state"] == "done", result  # type: ignore[index]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["teardown"]["state"] == "done" and summary["kept_warm"] is True
    assert not sshd_answers(head, 3.0), "the fleet was torn down"
    assert not list((fleetrun_home / "warm").glob("*.json")), "the deadline was kept and cleared"


def test_fab_watch_of_a_warm_run_keeps_it_warm_then_tears_it_down(
    warm_fleet: LocalFleet, fleetrun_home: Path, steps_workdir: Path, tmp_path: Path
) -> None:
    head = warm_fleet.inventory().hosts[0]
    (steps_workdir / "leave_behind.py").write_text(LEFT_BEHIND)
    playbook = write_playbook(
        tmp_path / "job.yaml", steps_workdir, name="t-warm-watch", nodes=1, teardown="always",
        keep_warm_s=10, entrypoint="python leave_behind.py --steps 20",
        env={"OMP_NUM_THREADS": "1", "FIRST_SLEEP_S": "20"},
    )  # fmt: skip
    runs = tmp_path / "runs"
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(runs), "COLUMNS": "200"}
    started = Path(f"/home/{warm_fleet.node_name(0)}/job-started")
    train = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{PREFIX}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:  # the laptop's watcher dies once the job runs (a crash, not a wrap-up)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not started.exists() and train.poll() is None:
            time.sleep(0.5)
    finally:
        train.kill()
        train.wait()
    assert started.exists(), "the job started before the watcher was killed"
    folder = only_run(runs)
    watch = fab("watch", "last", home=fleetrun_home, runs=runs)
    assert watch.returncode == 0, watch.stdout[-3000:] + watch.stderr[-2000:]
    assert "re-attached to run" in watch.stdout
    assert "kept warm for 10 s instead (teardown: always)" in watch.stdout, watch.stdout[-3000:]
    result = kept_warm_result(folder)
    assert result.get("state") == "torn_down" and result["teardown"]["state"] == "done", result  # type: ignore[index]
    assert not sshd_answers(head, 3.0), "the fleet was torn down"
