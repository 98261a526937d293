"""Real faults on a fresh local fleet per test: the right stop rule, processes stopped, artifacts
back, teardown done (or blocked when artifacts are not safe), the run record right.

Each test builds its own 2-node fleet (prefix ``frf``) with ``teardown: always``, because a
correct run removes the fleet, and the laptop-loss tests power nodes off.

The job is the torch-free trainer (``tests/stdlib_job/steps.py``) wherever the subject is a stop
rule, the watcher, the watchdog or the teardown: it logs the same records through the node
library and its ranks start in a fraction of a second, where the digits example's import torch
and data load cost seconds per rank. The stall test keeps the digits example: its rank 0 stalls
because it waits in a collective for the stopped rank, which only a real distributed job does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.cli import runs as history
from launch.fleets.local import LocalFleet
from launch.fleets.teardown import TeardownState
from launch.run.records import RunRecords
from launch.run.summary import RunResult
from tests.conftest import (
    REPO,
    STEPS_JOB,
    fleet_prefix,
    fleet_subnet,
    needs_root,
    user_processes,
    write_playbook,
)
from tests.faultkit import first_metrics, first_worker, quiet, run_with_fault, wait_for

pytestmark = needs_root()
PREFIX = fleet_prefix("f")
INVENTORY = f"local:{PREFIX}"


@pytest.fixture
def fresh_fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    fleet = LocalFleet(prefix=PREFIX, subnet=fleet_subnet(5))
    fleet.up(2, say=lambda _m: None)
    yield fleet
    subprocess.run(["ip", "link", "set", fleet.veth(1), "up"], check=False, capture_output=True)
    left = fleet.down(say=lambda _m: None)
    assert not any(left.values()), left


def record_of(result: RunResult):  # noqa: ANN201 - RunRecord
    with history.open_records() as records:
        record = records.get(result.run_id)
    assert record is not None
    return record


def playbook_for(tmp_path: Path, digits_workdir: Path, args: str, **stop: object) -> Path:
    """The digits example (torch, a collective every step) with ``args``."""
    return write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-fault",
        nodes=2,
        teardown="always",
        entrypoint=f"python -m trainer.task {args}",
        stop={"watcher_lost_after_s": 300, **stop},
    )


def steps_playbook(tmp_path: Path, args: str, **stop: object) -> Path:
    """The torch-free trainer (``tests/stdlib_job/steps.py``) with ``args``."""
    return write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-fault",
        nodes=2,
        teardown="always",
        entrypoint=f"python steps.py {args}",
        stop={"watcher_lost_after_s": 300, **stop},
    )


def kill_watcher_after_first_step(playbook: Path, fleet: LocalFleet, fleetrun_home: Path) -> None:
    """`fab train` as a user runs it, SIGKILLed (no clean-up at all) once training has begun."""
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", INVENTORY],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: first_metrics(fleet), 180, "the first metrics")
    fab.kill()
    fab.wait()


def assert_torn_down(fleet: LocalFleet, result: RunResult) -> None:
    assert result.teardown.state is TeardownState.DONE, result.teardown
    assert result.teardown.message.startswith(f"local fleet {PREFIX} removed"), result.teardown
    assert not any(fleet.leftovers().values())


def test_kill_one_rank(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    victim = fresh_fleet.node_name(1)
    playbook = steps_playbook(tmp_path, "--steps 4000 --step-sleep 0.05")
    result = run_with_fault(
        playbook, fresh_fleet, lambda: os.kill(first_worker(victim, "steps.py"), signal.SIGKILL)
    )
    assert result.outcome == "failed" and result.rule == "rank_failed"
    assert result.failed_nodes[0] == victim, result.reason
    assert "SIGKILL" in (result.folder / "nodes" / victim / "node.log").read_text()
    record = record_of(result)
    assert record.state == "failed" and record.stop_rule == "rank_failed"
    assert record.exit_codes[victim] not in (0, None)
    assert_torn_down(fresh_fleet, result)


def test_rank_exit_is_pushed_not_polled(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    """A poll every 300 s: the killed rank's exit still ends the run at the watcher's second poll,
    because the node agent pushed it on its event channel and that cut the pause short (had the
    watcher waited for the poll, the test would take five minutes and the push would be missing)."""
    victim = fresh_fleet.node_name(1)
    playbook = steps_playbook(tmp_path, "--steps 4000 --step-sleep 0.05")
    result = run_with_fault(
        playbook,
        fresh_fleet,
        lambda: os.kill(first_worker(victim, "steps.py"), signal.SIGKILL),
        poll_interval=300,
    )
    assert result.outcome == "failed" and result.rule == "rank_failed", result.reason
    assert result.failed_nodes[0] == victim, result.reason
    watch = json.loads((result.folder / "summary.json").read_text())["watch"]
    assert any(p["node"] == victim and p["state"] == "exited" for p in watch["pushed"]), watch
    assert watch["woken_by_push"] >= 1 and watch["polls"] <= 3, watch
    assert_torn_down(fresh_fleet, result)


def test_hang_sigstop_is_a_stall(fresh_fleet: LocalFleet, digits_workdir: Path, tmp_path: Path) -> None:
    victim = fresh_fleet.node_name(1)
    playbook = playbook_for(tmp_path, digits_workdir, "--epochs 200 --step-sleep 0.05", stall_timeout_s=5)
    result = run_with_fault(playbook, fresh_fleet, lambda: os.kill(first_worker(victim), signal.SIGSTOP))
    assert result.outcome == "failed" and result.rule == "stalled", result.reason
    assert not result.stop_errors, "the stopped rank was continued and killed"
    assert (result.folder / "metrics.jsonl").exists()
    assert record_of(result).stop_rule == "stalled"
    assert_torn_down(fresh_fleet, result)


def test_nan_loss(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    playbook = steps_playbook(tmp_path, "--steps 4000 --step-sleep 0.02 --nan-at-step 20")
    result = run_with_fault(playbook, fresh_fleet, None)
    assert result.outcome == "failed" and result.rule == "nan_loss"
    assert "at step 20" in result.reason
    assert record_of(result).stop_rule == "nan_loss"
    assert_torn_down(fresh_fleet, result)


def test_plateau(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    playbook = steps_playbook(
        tmp_path,
        "--steps 4000 --step-sleep 0.02 --lr 0",
        plateau_patience=30,
        plateau_min_delta=0.05,
    )
    result = run_with_fault(playbook, fresh_fleet, None)
    assert result.outcome == "stopped" and result.rule == "plateau", result.reason
    assert record_of(result).state == "stopped"
    assert_torn_down(fresh_fleet, result)


def test_wall_time(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    # 12 s: the rule is what is tested, not a long run; on a loaded machine the job's start-up
    # may take all of it (then no step was logged, checked below)
    playbook = steps_playbook(tmp_path, "--steps 10000 --step-sleep 0.05", max_wall_time_s=12)
    result = run_with_fault(playbook, fresh_fleet, None)
    assert result.outcome == "stopped" and result.rule == "wall_time", result.reason
    assert "limit 12" in result.reason, result.reason
    # the plot is written even when a loaded machine's start-up took the whole limit;
    # the TensorBoard files whenever a step was logged
    assert (result.folder / "loss.png").exists()
    logged = (result.folder / "metrics.jsonl").exists()
    assert (result.folder / "tensorboard").is_dir() == logged, f"metrics.jsonl pulled: {logged}"
    assert_torn_down(fresh_fleet, result)


def test_partition(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    """The cut-off node cannot be stopped or pulled by the laptop: teardown is blocked (its logs are
    only there), and its own watchdog stops the job there and powers it off."""
    victim = fresh_fleet.node_name(1)
    playbook = steps_playbook(
        tmp_path,
        "--steps 10000 --step-sleep 0.05",
        unreachable_timeout_s=6,
        watcher_lost_after_s=5,
    )
    link = fresh_fleet.veth(1)
    result = run_with_fault(
        playbook, fresh_fleet, lambda: subprocess.run(["ip", "link", "set", link, "down"], check=True)
    )
    assert result.outcome == "failed" and result.rule == "unreachable", result.reason
    assert victim in result.failed_nodes
    assert victim in result.pull_errors and result.teardown.blocked, result.teardown
    wait_for(lambda: fresh_fleet.powered_off(1), 120, "the partitioned node's watchdog to power it off")
    wait_for(lambda: not user_processes(victim), 30, "the partitioned node's processes to end")
    outcome = json.loads(
        next(Path(f"/home/{victim}/.fleetrun/runs").glob("*/guard-outcome.json")).read_text()
    )
    assert outcome["rule"] in ("peer_lost", "completed")


def test_laptop_watcher_killed(fresh_fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path) -> None:
    """The dead man's switch: with the watcher gone, the nodes' watchdogs finish the job and power off."""
    playbook = steps_playbook(tmp_path, "--steps 140 --step-sleep 0.05", watcher_lost_after_s=5)
    kill_watcher_after_first_step(playbook, fresh_fleet, fleetrun_home)
    for i in range(2):
        wait_for(lambda i=i: fresh_fleet.powered_off(i), 180, f"node {i} to power itself off")
        wait_for(lambda i=i: not user_processes(fresh_fleet.node_name(i)), 30, f"node {i}'s processes to end")
        ns_pids = subprocess.run(
            ["ip", "netns", "pids", fresh_fleet.netns(i)], capture_output=True, text=True
        ).stdout
        assert not ns_pids.split(), "the node's sshd is off too"
        outcome = json.loads(
            next(
                Path(f"/home/{fresh_fleet.node_name(i)}/.fleetrun/runs").glob("*/guard-outcome.json")
            ).read_text()
        )
        assert outcome["rule"] in ("completed", "peer_lost")
    with RunRecords(fleetrun_home / "runs.db") as records:
        records.mark_stale_as_interrupted(time.time())
        record = records.list(limit=1)[0]  # the run the killed `fab train` started
    assert record.playbook_name == "t-fault" and record.state == "interrupted"


def test_pull_failure_blocks_teardown(fresh_fleet: LocalFleet, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "unreadable.py").write_text(
        "import os\n"
        "path = os.path.join(os.environ['FLEETRUN_OUTPUT_DIR'], 'checkpoint.pt')\n"
        "open(path, 'w').write('weights')\n"
        "os.chmod(path, 0)\n"
    )
    playbook = write_playbook(
        tmp_path / "job.yaml",
        work,
        name="t-pull",
        nodes=2,
        teardown="always",
        entrypoint="python unreadable.py",
    )
    result = run_with_fault(playbook, fresh_fleet, None)
    assert result.outcome == "succeeded"
    assert set(result.pull_errors) == {fresh_fleet.node_name(0), fresh_fleet.node_name(1)}
    assert "Permission denied" in " ".join(result.pull_errors.values())
    assert result.teardown.blocked and result.teardown.message.startswith("blocked: artifacts of"), (
        result.teardown
    )
    assert fresh_fleet.leftovers()["netns"], "the fleet holding the only copy was kept"
    summary = json.loads((result.folder / "summary.json").read_text())
    assert summary["pull_errors"] and summary["teardown"]["state"] == "blocked"
    # the operator makes the files readable again; `fab pull RUN` then completes the teardown
    for i in range(2):
        for ckpt in Path(f"/home/{fresh_fleet.node_name(i)}/.fleetrun/runs").glob("*/outputs/checkpoint.pt"):
            ckpt.chmod(0o644)
    again = history.pull_again(result.run_id, quiet())
    teardown = again.teardown
    assert again.ok and again.pull_errors == {} and teardown.state is TeardownState.DONE, again
    assert teardown.message.startswith(f"local fleet {PREFIX} removed"), teardown
    assert sorted(p.read_text() for p in result.folder.glob("nodes/*/outputs/checkpoint.pt")) == [
        "weights",
        "weights",
    ]
    assert json.loads((result.folder / "summary.json").read_text())["pull_errors"] == {}
    assert not any(fresh_fleet.leftovers().values())


def test_watcher_crash_then_reattach(fresh_fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path) -> None:
    # 300 steps of 0.05 s: the job still trains when the watcher is killed at its first step and
    # when `fab watch` re-attaches a second later
    playbook = steps_playbook(tmp_path, "--steps 300 --step-sleep 0.05")
    kill_watcher_after_first_step(playbook, fresh_fleet, fleetrun_home)
    with RunRecords(fleetrun_home / "runs.db") as records:
        records.mark_stale_as_interrupted(time.time())
        record = records.list(limit=1)[0]  # the run the killed `fab train` started
    assert record.playbook_name == "t-fault" and record.state == "interrupted"
    result = history.reattach(record.id, quiet(), poll_interval=0.5)
    assert result.outcome == "succeeded", result.reason
    with RunRecords(fleetrun_home / "runs.db") as records:
        final = records.get(record.id)
    assert final is not None and final.state == "succeeded"
    assert (result.folder / "metrics.jsonl").exists()
    assert_torn_down(fresh_fleet, result)


HOSTILE_JOB = r'''
"""Rank 0 writes what breaks naive readers: a 200 KB nesting bomb and invalid UTF-8 in
metrics.jsonl, a deeply nested status.json; then good steps. "nan-when-unwatched": once the
watcher's heartbeat is stale, a NaN loss (only the watchdog can see it), then it hangs."""
import os
import sys
import time

from fleetrun_metrics import Metrics

mode = sys.argv[1]
run_dir = os.environ["FLEETRUN_RUN_DIR"]
metrics = Metrics()
if metrics.enabled:
    with open(os.path.join(run_dir, "metrics.jsonl"), "ab") as fh:
        fh.write(b"[" * 200_000 + b"\n" + b'{"step": "\xff\xfe"}\n')
    for step in range(1, 6):
        metrics.log(step=step, loss=1.0 / step)
    with open(os.path.join(run_dir, "status.json"), "w") as fh:
        fh.write("[" * 60_000)
    if mode == "nan-when-unwatched":
        beat = os.path.join(run_dir, "watcher-heartbeat")
        while True:
            try:
                if time.time() - os.stat(beat).st_mtime > 3:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        metrics.log(step=6, loss=float("nan"))
if mode == "nan-when-unwatched":
    time.sleep(600)
'''


def hostile_playbook(tmp_path: Path, mode: str, **stop: object) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hostile.py").write_text(HOSTILE_JOB)
    return write_playbook(
        tmp_path / "job.yaml",
        work,
        name="t-hostile",
        nodes=2,
        teardown="always",
        entrypoint=f"python hostile.py {mode}",
        stop={"watcher_lost_after_s": 300, **stop},
    )


def test_hostile_metrics_and_status_still_end_with_a_recorded_outcome(
    fresh_fleet: LocalFleet, tmp_path: Path
) -> None:
    """The bombs neither kill the watcher nor hide the good steps; the run ends by its exit
    codes, recorded, pulled and torn down; the node's run dir and launch.sh were private."""
    result = run_with_fault(hostile_playbook(tmp_path, "finish"), fresh_fleet, None)
    assert result.outcome == "succeeded" and result.rule == "completed", result.reason
    record = record_of(result)
    assert record.state == "succeeded" and record.last_metrics.get("loss") == 0.2
    assert json.loads((result.folder / "summary.json").read_text())["outcome"] == "succeeded"
    for i in range(2):
        pulled = result.folder / "nodes" / fresh_fleet.node_name(i)
        assert pulled.stat().st_mode & 0o777 == 0o700, "the run dir on the node was 0700"
        assert (pulled / "launch.sh").stat().st_mode & 0o777 == 0o600
        assert (pulled / "guard.json").stat().st_mode & 0o777 == 0o600
    assert_torn_down(fresh_fleet, result)


def test_watchdog_takes_over_a_hostile_run_when_the_watcher_is_killed(
    fresh_fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """With the watcher SIGKILLed, rank 0's watchdog reads past the bombs to the NaN loss the job
    logs once unwatched, stops and powers its node off; the other node follows."""
    playbook = hostile_playbook(
        tmp_path, "nan-when-unwatched", watcher_lost_after_s=5, unreachable_timeout_s=6
    )
    kill_watcher_after_first_step(playbook, fresh_fleet, fleetrun_home)
    outcomes = []
    for i in range(2):
        wait_for(lambda i=i: fresh_fleet.powered_off(i), 240, f"node {i} to power itself off")
        wait_for(lambda i=i: not user_processes(fresh_fleet.node_name(i)), 30, f"node {i}'s processes to end")
        home = Path(f"/home/{fresh_fleet.node_name(i)}/.fleetrun")
        assert home.stat().st_mode & 0o777 == 0o700
        outcomes.append(json.loads(next((home / "runs").glob("*/guard-outcome.json")).read_text()))
    nan = [o for o in outcomes if o["rule"] == "nan_loss"]
    assert len(nan) == 1, outcomes
    assert "at step 6" in nan[0]["reason"] and nan[0]["malformed_lines"] == 2, nan[0]
    other = [o for o in outcomes if o["rule"] != "nan_loss"]
    assert other[0]["rule"] in ("completed", "peer_lost"), other
