"""Lose a node, keep the run (issue 11), on a real 3-node local fleet.

A tiny trainer (``tests/recovery_job``) checkpoints every few steps in the layout of fleetrun's
checkpoint helper. Node 2 is powered off mid-run the way a preempted VM goes (its sshd and every
process killed, ``LocalFleet.stop_node``): with ``recovery:`` the run resumes from the latest
checkpoint on a replacement node (a fresh node with a new host key), or, elastic and without
replacement, on the two survivors. Tests whose subject is the recovery, not the training state
(elastic survivors, a GPU fault, a re-attached watcher), run the torch-free ``tests/stdlib_job``
(``steps_playbook``); those that check the trainers' parameters, a stall in a collective, a
poisoned pickle or a CPU-bound pace keep the torch trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
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
    STEPS_JOB,
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
    """The tests' job: 30 steps (the loss comes at step 12, the next attempt resumes from about
    step 10 and goes on to the end); the survivors of a lost node, stuck in a collective with it,
    cannot checkpoint, so a short ``grace_s`` (a test whose ranks are not stuck sets its own);
    the lost node is declared unreachable 6 s after its last answer (a slow poll of a healthy
    node on a loaded machine is re-checked, not lost)."""
    recovery = {"max_restarts": 2, "grace_s": 2, "confirm_s": 2}
    recovery.update(fields.pop("recovery", {}))  # type: ignore[arg-type]
    return write_playbook(
        tmp_path / "job.yaml",
        JOB,
        name="t-recover",
        entrypoint=f"python ckpt_trainer.py --steps 30 --ckpt-every {EVERY} --step-sleep 0.25 {args}".strip(),
        recovery=recovery,
        stop={"unreachable_timeout_s": 6, "watcher_lost_after_s": 300},
        **fields,
    )


def steps_playbook(tmp_path: Path, **fields: object) -> Path:
    """The torch-free job, for a test whose subject is the recovery, not the training state (its
    ranks share no collective, and checkpoint when stopped): at the pace of ``playbook``'s,
    checkpointing every ``EVERY`` steps; the first attempt goes on until fleetrun stops it, the
    next one ends 10 steps past the step it resumed from."""
    recovery = {"max_restarts": 2, "grace_s": 2, "confirm_s": 2}
    recovery.update(fields.pop("recovery", {}))  # type: ignore[arg-type]
    return write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-recover",
        entrypoint=f"python steps.py --steps 100000 --later-attempts 10 --checkpoint-every {EVERY} --step-sleep 0.25",
        recovery=recovery,
        stop={"unreachable_timeout_s": 6, "watcher_lost_after_s": 300},
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


def every_node_up(fleet: LocalFleet) -> None:
    """An earlier test of the module may have left a node powered off: a fresh one in its place."""
    from launch.fleets.local.power import replace_node
    from launch.transport.reachability import sshd_answers

    for host in fleet.inventory().hosts:
        if not sshd_answers(host, 3.0):
            replace_node(fleet, host)


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


# -- checkpoints a run can trust (issue 19) -------------------------------------------------------


def checkpoint_steps(fleet: LocalFleet, i: int, old: set[Path]) -> list[int]:
    """Complete-looking checkpoint steps (a manifest) node i holds in the new run, newest first."""
    home = Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs")
    found = [
        int(p.parent.name[5:])
        for run_dir in set(home.glob("*")) - old
        for p in run_dir.glob("checkpoints/step-*/MANIFEST.json")
    ]
    return sorted(found, reverse=True)


def test_a_poisoned_checkpoint_on_a_worker_never_runs(fleet3: LocalFleet, tmp_path: Path) -> None:
    """Rank 1 plants on its node a step 999999 (a code-executing pickle beside a sparse 64 GiB
    file) and a forged copy of step 10, then fails: the laptop believes neither (never recorded;
    not rank 0's manifest), names the planted step, and every rank resumes from rank 0's step 10;
    nothing the pickles would run ever runs (the marker is never created)."""
    every_node_up(fleet3)  # an earlier test of the module may have left a node off
    shared = Path(tempfile.mkdtemp(prefix="fleetrun-ck-poison-"))
    shared.chmod(0o1777)  # the node users could create the marker here, had a pickle run
    marker = shared / "ran"
    book = playbook(tmp_path, f"--plant-at 12 --marker {marker}", recovery={"on": ["rank_failed"]})
    result = run_with_fault(book, fleet3, None)
    assert not marker.exists(), "a planted pickle ran"
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    assert [a["loss"] for a in attempts[:1]] == ["rank_failed"], attempts
    story = attempts[1]["resumed_from"]
    assert ": ~/.fleetrun/runs/" in story, story
    assert "step-999999/MANIFEST.json: step 999999 was never recorded as saved by rank 0" in story, story
    # the forged step 10 is refused ("differs from the manifest rank 0 recorded") unless the peer
    # copy of rank 0's step 10 replaced it first (it may land on the same node): both are fine,
    # and test_checkpoint_trust checks the manifest rule itself
    assert "rank 0 resumed from step 10 (resume_from)" in story, story
    assert attempts[1]["first_step"] == 11, attempts
    sums = final_status(result)["param_checksums"]
    assert len(set(sums)) == 1, sums
    shutil.rmtree(shared, ignore_errors=True)


def test_head_powered_off_without_a_bucket_resumes_from_its_peer_copy(
    fleet3: LocalFleet, tmp_path: Path
) -> None:
    """No bucket: rank 0 saves on the head only, and the laptop copies each save to the next
    node. The head goes (powered off, then replaced with an empty disk) right after its newest
    save reached node 1: the run resumes from that step, at most one interval recomputed."""
    every_node_up(fleet3)  # an earlier test of the module may have left a node off
    old = {p for i in range(3) for p in Path(f"/home/{fleet3.node_name(i)}/.fleetrun/runs").glob("*")}
    rank0: list[int] = []

    def rank0_node() -> int | None:
        for i in range(3):
            home = Path(f"/home/{fleet3.node_name(i)}/.fleetrun/runs")
            if any(p.stat().st_size for r in set(home.glob("*")) - old for p in r.glob("metrics.jsonl")):
                return i
        return None

    def power_off_head() -> None:
        def caught_up() -> bool:
            holder = rank0_node()
            if holder is None:
                return False
            own = checkpoint_steps(fleet3, holder, old)
            copies = [checkpoint_steps(fleet3, i, old) for i in range(3) if i != holder]
            if own and own[0] >= 2 * EVERY and any(c and c[0] == own[0] for c in copies):
                rank0.append(holder)
                return True
            return False

        wait_for(caught_up, 120, "a peer copy of rank 0's newest checkpoint")
        fleet3.stop_node(0)  # the head (rank 0 is there unless the rendezvous put it elsewhere)

    book = playbook(tmp_path, "--steps 30 --step-sleep 0.8")
    result = run_with_fault(book, fleet3, power_off_head)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    node0, node1 = fleet3.node_name(0), fleet3.node_name(1)
    assert attempts[0]["loss"] == "node_lost" and attempts[0]["replaced"] == [node0], attempts[0]
    assert attempts[1]["first_step"] > 2 * EVERY, "resumed from a checkpoint, not from the beginning"
    assert 0 <= attempts[1]["steps_recomputed"] <= EVERY, attempts
    print(f"rank 0 on node {rank0}; attempt 2 resumed from {attempts[1]['resumed_from']}")
    if rank0 == [0]:  # the head held rank 0's saves: only the peer copy survived it
        assert f"from {node1} (a peer copy)" in attempts[1]["resumed_from"], attempts[1]
    sums = final_status(result)["param_checksums"]
    assert len(sums) == 3 and len(set(sums)) == 1, sums
    assert_nothing_running(fleet3)


# the elastic test leaves node 2 powered off: it stays last
def test_elastic_survivors_go_on(fleet3: LocalFleet, tmp_path: Path) -> None:
    book = steps_playbook(tmp_path, nodes="2:3", recovery={"replace_lost_nodes": False})
    started, old = time.time(), run_dirs(fleet3)
    result = run_with_fault(book, fleet3, lambda: power_off_node2(fleet3, old))
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    node2 = fleet3.node_name(2)
    assert attempts[0]["dropped"] == [node2] and node2 not in attempts[1]["nodes"], attempts
    assert len(attempts[1]["nodes"]) == 2 and attempts[1]["started_at"] > started
    assert final_status(result)["world_size"] == 2
    assert 0 <= attempts[1]["steps_recomputed"] <= EVERY, attempts


def test_gpu_fault_excludes_the_host_and_the_run_completes_on_the_spare(
    fleet3: LocalFleet, tmp_path: Path
) -> None:
    """A lab inventory of the 3 nodes, a job of 2: node 2 is the spare. Node 1 runs the scripted
    ``nvidia-smi``/``dmesg`` (healthy at the start); mid-run its GPU falls off the bus (Xid 79,
    gone from nvidia-smi's list). ``gpu_fault`` stops the attempt, node 1 is excluded for the rest
    of the run, and the run resumes from its checkpoint on node 0 and the spare."""
    import pwd
    import threading

    import yaml

    from launch.cli import app
    from tests.faultkit import quiet
    from tests.gpustandin import install, write_scenario, xid

    every_node_up(fleet3)
    one, spare = fleet3.node_name(1), fleet3.node_name(2)
    home = fleet3.home(1)
    user = pwd.getpwnam(one)
    fakebin = install(home / "fakebin", {"count": 1}, owner=(user.pw_uid, user.pw_gid))
    bashrc = home / ".bashrc"
    before = bashrc.read_text() if bashrc.exists() else ""
    bashrc.write_text('export PATH="$HOME/fakebin:$PATH"\n' + before)
    lab = tmp_path / "lab.yaml"
    lab.write_text(yaml.safe_dump({"hosts": fleet3.inventory().to_yaml_data()["hosts"]}))
    # the first attempt goes on until stopped: the GPU reading (a thread of the node agent) sees
    # the fault mid-run whatever the load; grace_s 5: the ranks checkpoint when stopped
    book = steps_playbook(tmp_path, nodes=2, procs_per_node=1, recovery={"on": ["gpu_fault"], "grace_s": 5})
    old = run_dirs(fleet3)
    box: dict[str, object] = {}

    def train() -> None:
        box["result"] = app.train(
            book, inventory=str(lab), console=quiet(), poll_interval=0.5, ask_on_interrupt=False
        )

    thread = threading.Thread(target=train)
    try:
        thread.start()
        wait_for(lambda: step_reached(fleet3, 2 * EVERY + 2, old) or not thread.is_alive(), 180, "step 12")
        fault = xid(0, 79, "2026-11-25T14:02:11", "pid=4242, name=python, GPU has fallen off the bus.")
        write_scenario(fakebin, {"gpus": [{"lost": True}], "xids": [fault]})
        thread.join(600)
    finally:
        bashrc.write_text(before)
    assert not thread.is_alive(), "fab train did not finish"
    result = box["result"]
    assert isinstance(result, RunResult) and result.outcome == "succeeded", getattr(result, "reason", result)
    attempts = attempts_of(result)
    assert attempts[0]["rule"] == "gpu_fault" and attempts[0]["loss"] == "gpu_fault", attempts[0]
    assert f"{one} gpu0: Xid 79 at 14:02: GPU has fallen off the bus (drain)" in attempts[0]["reason"]
    assert attempts[0]["replaced"] == [one]
    assert one not in attempts[1]["nodes"] and spare in attempts[1]["nodes"], attempts
    assert attempts[1]["first_step"] > EVERY, "the second attempt resumed from a checkpoint"
    hosts = json.loads((result.folder / "hosts.json").read_text())
    assert hosts["chosen"] == [fleet3.node_name(0), one] and hosts["spares"] == [spare]
    assert "Xid 79" in hosts["excluded"][one]
    assert_nothing_running(fleet3)


def test_local_fleet_renews_a_live_node_as_a_fresh_one(fleet3: LocalFleet, tmp_path: Path) -> None:
    """What a ``gpu_fault`` without a spare gets on the local fleet (``FleetKind.renew``, asked
    through the registry as recovery asks it): the node, still running, is powered off and comes
    back fresh: its processes and files gone, a new host key pinned in the fleet's inventory, and
    a connection that checks that key works."""
    import pwd

    from launch.fleets.kinds.registry import fleet_kind
    from launch.transport.ssh import SshPool

    every_node_up(fleet3)
    inventory = fleet3.inventory()
    host = inventory.hosts[2]
    entry = pwd.getpwnam(host.name)
    marker = fleet3.home(2) / "left-by-the-bad-machine"
    marker.write_text("x\n")
    sleeper = subprocess.Popen(["sleep", "600"], user=entry.pw_uid, group=entry.pw_gid)
    said: list[str] = []
    try:
        new = fleet_kind(inventory.fleet).renew(host, said.append, 60.0)
        assert sleeper.wait(timeout=10) < 0, "the bad node's processes were not ended"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert new is not None and new.name == host.name and new.host_key != host.host_key
    assert not marker.exists() and any("renewed as a fresh node" in m for m in said), said
    assert fleet3.inventory().hosts[2].host_key == new.host_key
    known = fleet3.inventory().write_known_hosts(tmp_path / "known_hosts")
    with SshPool([new], known) as pool:
        assert pool.connections[new.name].run("true", timeout=30).ok


def _job_pids(user: str) -> list[int]:
    """Processes of ``user`` that carry a run's ``FLEETRUN_RUN_ID`` (the job, not the node agent)."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"FLEETRUN_RUN_ID=") for v in env):
            found.append(int(entry.name))
    return found


def test_a_cpu_throttled_node_is_named_by_the_straggler_rule(fleet3: LocalFleet, tmp_path: Path) -> None:
    """Node 2's job processes are put in a cgroup with 3% of a CPU (``cpu.cfs_quota_us``) once the
    run trains (no sleep between steps: CPU-bound, so the quota bites; a mostly sleeping job under
    the same quota is not slowed, and rightly not flagged): its ranks' pace probe runs many times
    slower than the other nodes', and the straggler rule (action stop) stops the run naming node 2."""
    import contextlib
    import os

    cgroup = Path("/sys/fs/cgroup/cpu") / f"fleetrun-{os.environ.get('FLEETRUN_TEST_TAG', 't')}-straggler"
    if not Path("/sys/fs/cgroup/cpu/cgroup.procs").exists():
        pytest.skip("no cgroup v1 cpu controller to throttle a node with")
    every_node_up(fleet3)
    book = write_playbook(
        tmp_path / "job.yaml",
        JOB,
        name="t-straggler",
        entrypoint=f"python ckpt_trainer.py --steps 5000 --ckpt-every {EVERY * 100} --step-sleep 0",
        procs_per_node=1,
        stop={"straggler": {"factor": 2.0, "window_s": 8, "action": "stop"}, "watcher_lost_after_s": 300},
    )
    slow = fleet3.node_name(2)
    old = run_dirs(fleet3)

    def throttle() -> None:
        wait_for(lambda: step_reached(fleet3, 20, old), 120, "step 20 of this run")
        cgroup.mkdir(exist_ok=True)
        (cgroup / "cpu.cfs_period_us").write_text("100000")
        (cgroup / "cpu.cfs_quota_us").write_text("3000")
        pids = _job_pids(slow)
        assert pids, f"no job process of {slow} to throttle"
        for pid in pids:
            with contextlib.suppress(OSError):  # gone meanwhile
                (cgroup / "cgroup.procs").write_text(str(pid))

    try:
        result = run_with_fault(book, fleet3, throttle)
    finally:
        if cgroup.exists():
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    Path("/sys/fs/cgroup/cpu/cgroup.procs").write_text(pid)
            cgroup.rmdir()
    assert (result.outcome, result.rule) == ("stopped", "straggler"), result.reason
    assert result.failed_nodes == (slow,) or slow in result.reason, result.reason
    assert f"{slow} " in result.reason and "x the median node's probe time" in result.reason


def test_reattached_watcher_follows_a_node_loss_into_the_next_attempt(
    fleet3: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """``fab train`` SIGKILLed during attempt 1; ``fab watch RUN`` re-attaches, and when node 2
    is powered off it recovers as ``fab train`` would: one run, two attempts, succeeded."""
    from launch.fleets.local.power import replace_node

    replace_node(fleet3, fleet3.inventory().hosts[2])  # the elastic test left node 2 powered off
    book, old = steps_playbook(tmp_path), run_dirs(fleet3)
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
