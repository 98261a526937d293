"""Two runs on the same 3 local-fleet nodes at once: each gets its own rendezvous port (chosen free
on the head), both train to success, and stopping one never touches the other."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from launch.cli import app
from launch.fleets.local import LocalFleet
from launch.paths import known_hosts_file
from launch.run.artifacts import stop_all
from launch.run.summary import RunResult
from launch.transport.ssh import Fleet
from tests.conftest import REPO, STEPS_JOB, TEST_PREFIX, needs_root, write_playbook
from tests.faultkit import is_step_record, quiet, wait_for

pytestmark = needs_root()
INVENTORY = f"local:{TEST_PREFIX}"


def run_dirs(fleet: LocalFleet, job: str, node: int = 0) -> list[Path]:
    return sorted(Path(f"/home/{fleet.node_name(node)}/.fleetrun/runs").glob(f"{job}-*"))


def has_steps(fleet: LocalFleet, job: str) -> bool:
    """A training step logged (not the resume event, which carries ``"step": null``)."""
    return any(
        is_step_record(line)
        for d in run_dirs(fleet, job)
        if (p := d / "metrics.jsonl").exists()
        for line in p.read_bytes().splitlines()
    )


def ended(run_dir: Path) -> bool:
    return (run_dir / "rc").exists()


def pids_of_run(fleet: LocalFleet, run_id: str) -> list[int]:
    """Live processes, on any node, carrying exactly ``FLEETRUN_RUN_ID=run_id``."""
    marker = f"FLEETRUN_RUN_ID={run_id}".encode()
    users = {fleet.node_name(i) for i in range(3)}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.owner() not in users or marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found.append(int(proc.name))
    return found


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


def train(playbook: Path) -> RunResult:
    """A run that shares the machines on purpose: another run holds them (``launch.run.queue_turn``),
    so without ``--allow-busy-gpus`` it would be refused."""
    result = app.train(
        playbook,
        inventory=INVENTORY,
        console=quiet(),
        poll_interval=0.5,
        ask_on_interrupt=False,
        allow_busy_gpus=True,
    )
    assert isinstance(result, RunResult)
    return result


def finished(thread: threading.Thread, box: dict[str, object]) -> RunResult:
    thread.join(600)
    assert not thread.is_alive(), "the run did not end"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    result = box["result"]
    assert isinstance(result, RunResult)
    return result


def port_of(fleet: LocalFleet, run_id: str) -> int:
    return int(Path(f"/home/{fleet.node_name(0)}/.fleetrun/runs/{run_id}/rdzv_port").read_text())


def test_two_runs_on_the_same_nodes_at_once_both_succeed_on_their_own_ports(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """Run a holds after its first step until run b has trained (a file the nodes can see
    releases it): the runs overlap on every machine for sure, and neither waits for a long job.
    The torch-free job: the subject is the rendezvous port each run gets and the runs' overlap."""
    release_dir = Path(tempfile.mkdtemp(prefix="fleetrun-share-"))
    release_dir.chmod(0o755)  # the node users look for the release file here
    release = release_dir / "release"
    slow = write_playbook(
        tmp_path / "a.yaml",
        STEPS_JOB,
        name="t-share-a",
        entrypoint=f"python steps.py --steps 20 --hold-until {release}",
    )
    quick = write_playbook(
        tmp_path / "b.yaml", STEPS_JOB, name="t-share-b", entrypoint="python steps.py --steps 20"
    )
    a_thread, a_box = in_thread(lambda: train(slow))
    try:
        wait_for(lambda: has_steps(fleet, "t-share-a") or not a_thread.is_alive(), 240, "run a's first step")
        assert a_thread.is_alive(), a_box
        b_thread, b_box = in_thread(lambda: train(quick))
        wait_for(lambda: has_steps(fleet, "t-share-b") or not b_thread.is_alive(), 240, "run b's first step")
        overlapped = not any(ended(d) for d in run_dirs(fleet, "t-share-a"))
    finally:
        release.touch()
    a, b = finished(a_thread, a_box), finished(b_thread, b_box)
    shutil.rmtree(release_dir, ignore_errors=True)
    assert overlapped, "run a ended before run b trained: the runs did not overlap"
    assert (a.outcome, b.outcome) == ("succeeded", "succeeded"), (a.reason, b.reason)
    assert a.run_id != b.run_id
    ports = {port_of(fleet, a.run_id), port_of(fleet, b.run_id)}
    assert len(ports) == 2 and 29500 not in ports, ports
    for result in (a, b):
        launch = Path(f"/home/{fleet.node_name(1)}/.fleetrun/runs/{result.run_id}/rdzv_port")
        assert int(launch.read_text()) == port_of(fleet, result.run_id), "every node got the head's port"


def test_stopping_one_run_leaves_the_other_running_to_success(
    fleet: LocalFleet, tmp_path: Path, fleetrun_home: Path
) -> None:
    """Both jobs are the torch-free trainer (under torchrun, each run with its own rendezvous):
    the subject is which processes a stop reaches, not training."""
    victim = write_playbook(
        tmp_path / "v.yaml",
        STEPS_JOB,
        name="t-share-v",
        entrypoint="python steps.py --steps 100000 --step-sleep 0.05",
        stop={"watcher_lost_after_s": 600},
    )
    survivor = write_playbook(
        tmp_path / "s.yaml",
        STEPS_JOB,
        name="t-share-s",
        entrypoint="python steps.py --steps 200 --step-sleep 0.05",
    )
    # the victim's watcher is `fab train` as a user runs it, SIGKILLed once both runs train
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(victim), "--inventory", INVENTORY],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: has_steps(fleet, "t-share-v") or fab.poll() is not None, 240, "the victim's first step"
        )
        assert fab.poll() is None, "the victim's run ended on its own"
        s_thread, s_box = in_thread(lambda: train(survivor))
        wait_for(
            lambda: has_steps(fleet, "t-share-s") or not s_thread.is_alive(), 240, "the survivor's first step"
        )
    finally:
        fab.kill()
        fab.wait()
    (victim_dir,) = run_dirs(fleet, "t-share-v")
    victim_id = victim_dir.name
    (survivor_dir,) = run_dirs(fleet, "t-share-s")
    before = set(pids_of_run(fleet, survivor_dir.name))
    assert pids_of_run(fleet, victim_id) and before, "both runs are running"
    inventory = app.load_inventory(INVENTORY)
    known_hosts = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    with Fleet(inventory.hosts, known_hosts) as nodes:
        errors = stop_all(nodes, victim_id, quiet())
    assert errors == {}
    assert pids_of_run(fleet, victim_id) == [], "the stopped run left processes behind"
    after = set(pids_of_run(fleet, survivor_dir.name))
    survivor_ended = ended(survivor_dir)
    result = finished(s_thread, s_box)
    assert survivor_ended or before <= after, f"survivor processes {sorted(before - after)} were stopped too"
    assert result.outcome == "succeeded", result.reason
    assert port_of(fleet, victim_id) != port_of(fleet, result.run_id)


@pytest.fixture(autouse=True)
def _nothing_of_ours_left(fleet: LocalFleet) -> object:
    yield
    for job in ("t-share-a", "t-share-b", "t-share-v", "t-share-s"):
        for d in run_dirs(fleet, job):
            assert pids_of_run(fleet, d.name) == [], f"run {d.name} left processes"
