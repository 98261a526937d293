"""Lose a node, keep the run (issue 11), on a real 3-node local fleet.

A tiny trainer (``tests/recovery_job``) checkpoints every few steps in the layout of fleetrun's
checkpoint helper. Node 2 is powered off mid-run the way a preempted VM goes (its sshd and every
process killed, ``LocalFleet.stop_node``): with ``recovery:`` the run resumes from the latest
checkpoint on a replacement node (a fresh node with a new host key), or, elastic and without
replacement, on the two survivors.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.cli import runs as history
from launch.fleets.local import LocalFleet
from launch.run.records import RunRecords
from launch.run.summary import RunResult
from tests.conftest import (
    REPO,
    assert_nothing_running,
    fleet_prefix,
    fleet_subnet,
    module_fleet,
    needs_root,
    write_playbook,
)
from tests.faultkit import quiet, run_with_fault, wait_for
from tests.recovery_helpers import attempts_of, run_dirs, step_reached

pytestmark = needs_root()
PREFIX = fleet_prefix("y")
JOB = REPO / "tests" / "recovery_job"
EVERY = 5
"""Checkpoint interval (steps) of the trainer in these tests."""


@pytest.fixture(scope="module")
def fleet3(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(14), 3) as fleet:
        yield fleet


def playbook(tmp_path: Path, args: str = "", **fields: object) -> Path:
    recovery = {"max_restarts": 2, "grace_s": 5, "confirm_s": 2}
    recovery.update(fields.pop("recovery", {}))  # type: ignore[arg-type]
    return write_playbook(
        tmp_path / "job.yaml",
        JOB,
        name="t-recover",
        entrypoint=f"python ckpt_trainer.py --steps 45 --ckpt-every {EVERY} --step-sleep 0.25 {args}".strip(),
        recovery=recovery,
        stop={"unreachable_timeout_s": 20, "watcher_lost_after_s": 300},
        **fields,
    )


def power_off_node2(fleet: LocalFleet, old: set[Path]) -> None:
    """Like a preempted VM: every process of node 2 and its sshd gone, once step 12 is logged."""
    wait_for(lambda: step_reached(fleet, 2 * EVERY + 2, old), 120, f"step {2 * EVERY + 2}")
    fleet.stop_node(2)


def final_status(result: RunResult) -> dict:
    found = [
        json.loads(p.read_text()) for p in result.folder.rglob("status.json") if "attempt-" not in str(p)
    ]
    assert found, f"no status.json pulled into {result.folder}"
    return found[0]


def test_node_lost_is_replaced_and_the_run_resumes(fleet3: LocalFleet, tmp_path: Path) -> None:
    old_key = fleet3.inventory().hosts[2].host_key
    old = run_dirs(fleet3)
    result = run_with_fault(playbook(tmp_path), fleet3, lambda: power_off_node2(fleet3, old))
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    node2 = fleet3.node_name(2)
    assert attempts[0]["loss"] == "node_lost" and attempts[0]["replaced"] == [node2], attempts[0]
    assert attempts[1]["outcome"] == "succeeded"
    assert 0 <= attempts[1]["steps_recomputed"] <= EVERY, attempts
    assert attempts[1]["first_step"] > EVERY, "the second attempt resumed from a checkpoint, not from 0"
    new_key = fleet3.inventory().hosts[2].host_key
    assert new_key != old_key, "the replacement node has a new host key, pinned in the inventory"
    status = final_status(result)
    sums = status["param_checksums"]
    assert len(sums) == 3 and len(set(sums)) == 1, sums
    assert (result.folder / "attempts.json").exists()
    assert_nothing_running(fleet3)


def test_elastic_survivors_go_on(fleet3: LocalFleet, tmp_path: Path) -> None:
    book = playbook(tmp_path, nodes="2:3", recovery={"replace_lost_nodes": False})
    started, old = time.time(), run_dirs(fleet3)
    result = run_with_fault(book, fleet3, lambda: power_off_node2(fleet3, old))
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    node2 = fleet3.node_name(2)
    assert attempts[0]["dropped"] == [node2] and node2 not in attempts[1]["nodes"], attempts
    assert len(attempts[1]["nodes"]) == 2 and attempts[1]["started_at"] > started
    assert final_status(result)["world_size"] == 2
    assert 0 <= attempts[1]["steps_recomputed"] <= EVERY, attempts


def test_reattached_watcher_follows_a_node_loss_into_the_next_attempt(
    fleet3: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """``fab train`` SIGKILLed during attempt 1; ``fab watch RUN`` re-attaches, and when node 2
    is powered off it recovers as ``fab train`` would: one run, two attempts, succeeded."""
    from launch.fleets.local.power import replace_node

    replace_node(fleet3, fleet3.inventory().hosts[2])  # the elastic test left node 2 powered off
    book, old = playbook(tmp_path), run_dirs(fleet3)
    log = (tmp_path / "fab-train.log").open("wb")
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(book), "--inventory", f"local:{fleet3.prefix}"],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: step_reached(fleet3, 2, old) or fab.poll() is not None, 180, "step 2")
    finally:
        log.close()
    assert fab.poll() is None, (tmp_path / "fab-train.log").read_text()[-3000:]
    fab.kill()
    fab.wait()
    with RunRecords(fleetrun_home / "runs.db") as records:
        records.mark_stale_as_interrupted(time.time())
        record = records.list(limit=1)[0]  # the run the killed `fab train` started
    assert record.playbook_name == "t-recover" and record.state == "interrupted"
    box: dict[str, object] = {}
    watcher = threading.Thread(
        target=lambda: box.update(result=history.reattach(record.id, quiet(), poll_interval=0.5))
    )
    watcher.start()
    power_off_node2(fleet3, old)
    watcher.join(600)
    assert not watcher.is_alive(), "fab watch did not finish"
    result = box["result"]
    assert isinstance(result, RunResult) and result.run_id == record.id
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["loss"] == "node_lost" and attempts[0]["replaced"] == [fleet3.node_name(2)]
    assert attempts[1]["first_step"] > EVERY, "the second attempt resumed from a checkpoint"
    with RunRecords(fleetrun_home / "runs.db") as records:
        runs = [r for r in records.list(limit=50) if r.started_at >= record.started_at]
    assert [(r.id, r.state) for r in runs] == [(record.id, "succeeded")], "one run, recorded once"
    assert_nothing_running(fleet3)
