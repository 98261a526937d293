"""Runs on a real Slurm cluster: ``fab train --inventory slurm:FILE`` against the local fleet's
slurmctld (``LocalFleet.up(slurm=True)``: Debian's slurm-wlm and munge, unmodified; node 0 the
controller and login host, nodes 1-4 compute nodes with two gres GPUs each). Nothing of Slurm is
mocked: fleetrun reaches the login host over SSH with its pinned key and runs ``sbatch``,
``squeue``, ``sinfo``, ``scancel`` there; the test plays the site administrator with the same
commands as root (``LocalSlurm.command``).

One cluster for the module (its tests run in order and each leaves the partition idle):
the digits example trained across 3 Slurm nodes by a second run that waited in Slurm's queue
while a first held the partition; a node set DOWN during a run, which resumes on a new
allocation that excludes it; and the laptop gone, the allocation ended by the nodes' watchdog.
Every wait is for an event (a line said, a job's state), bounded only so a broken run fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launch.fleets.kinds.base import TeardownState
from launch.fleets.kinds.slurm import SlurmKind, load_slurm_inventory
from launch.fleets.local import LocalFleet
from launch.fleets.local.slurm import LocalSlurm
from launch.fleets.slurm import commands
from launch.job.fleet_refs import SlurmFleetRef
from launch.run.records import RunRecords
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
from tests.faultkit import wait_for

pytestmark = needs_root()
PREFIX = fleet_prefix("l")
NODES = 5
"""The login node and four compute nodes: a 3-node run leaves one free (for a replacement)."""
RELEASE = "/tmp/fleetrun-test-release"
"""The holding run's ranks end once this exists on their node (each node has its own /tmp)."""
HOLD = f"""import os, time
while not os.path.exists({RELEASE!r}):
    time.sleep(0.2)
"""
FIRST_ATTEMPT_HOLDS = """import os, runpy, sys
# the first attempt holds after its first step (steps.py waits at most 300 s for a file nobody
# makes): it is still running when its node goes DOWN, whatever the load; the next attempt runs on
if os.environ.get("FLEETRUN_ATTEMPT", "1") == "1":
    sys.argv += ["--hold-until", "/nonexistent/fleetrun-test-never"]
sys.argv[0] = "steps.py"
runpy.run_path("steps.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def cluster(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(18), NODES, slurm=True) as fleet:
        yield fleet
    assert not LocalSlurm.daemon_pids([fleet.netns(i) for i in range(NODES)]), "no Slurm daemon left"


def inventory_arg(fleet: LocalFleet) -> str:
    return f"slurm:{LocalSlurm(fleet).inventory_path}"


def squeue(fleet: LocalFleet) -> list[list[str]]:
    """Every job the controller still shows, as the administrator sees it: id, state, nodes."""
    proc = LocalSlurm(fleet).command(["squeue", "-h", "-o", "%i %T %N"])
    assert proc.returncode == 0, proc.stderr
    return [line.split() for line in proc.stdout.splitlines() if line.strip()]


def hostnames(fleet: LocalFleet, nodelist: str) -> list[str]:
    proc = LocalSlurm(fleet).command(["scontrol", "show", "hostnames", nodelist])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def run_processes(fleet: LocalFleet, marker: str) -> dict[str, list[str]]:
    """Processes on the compute nodes whose command line names ``marker`` (the run's trainer)."""
    found: dict[str, list[str]] = {}
    for i in range(1, NODES):
        out = subprocess.run(["ip", "netns", "pids", fleet.netns(i)], capture_output=True, text=True).stdout
        for pid in out.split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.setdefault(fleet.node_name(i), []).append(cmdline.strip())
    return found


def fab_in_background(
    playbook: Path, fleet: LocalFleet, home: Path, out: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """``fab train`` as a user runs it, its output (plain, 200 columns) going to ``out``."""
    env = {**os.environ, "FLEETRUN_HOME": str(home), "COLUMNS": "200"}
    with out.open("wb") as sink:
        return subprocess.Popen(
            [
                str(REPO / ".venv" / "bin" / "fab"),
                "train",
                str(playbook),
                "--inventory",
                inventory_arg(fleet),
                *extra,
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def said(out: Path, text: str) -> bool:
    return out.exists() and text in out.read_text(errors="replace")


def finished(proc: subprocess.Popen[bytes], out: Path, timeout: float = 600) -> str:
    """``proc``'s exit (bounded only so a hung run fails) and its output."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out.read_text(errors="replace")


def test_a_second_run_waits_in_slurms_queue_then_trains_digits_across_three_nodes(
    cluster: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    slurm = LocalSlurm(cluster)
    holder_dir = tmp_path / "holder"
    holder_dir.mkdir()
    (holder_dir / "hold.py").write_text(HOLD)
    holder = write_playbook(
        tmp_path / "holder.yaml", holder_dir, name="t-holder", entrypoint="python hold.py", teardown="always"
    )
    digits = write_playbook(
        tmp_path / "digits.yaml", digits_workdir, name="t-slurm-digits", teardown="always"
    )
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    first = fab_in_background(holder, cluster, fleetrun_home, first_out)
    try:
        wait_for(
            lambda: len(run_processes(cluster, "hold.py")) == 3, 300, "the holding run's ranks on 3 nodes"
        )
        ((first_job, state, nodelist),) = squeue(cluster)
        assert state == "RUNNING" and len(hostnames(cluster, nodelist)) == 3
        second = fab_in_background(digits, cluster, fleetrun_home, second_out, "--wait")
        wait_for(lambda: said(second_out, "(Resources)"), 300, "the second run to wait in the queue")
    finally:
        for i in range(1, NODES):  # the holding run's ranks end: it completes and gives its nodes back
            slurm.on_node(i, ["touch", RELEASE])
    first_text = finished(first, first_out)
    assert first.returncode == 0, first_text[-3000:]
    text = finished(second, second_out)
    assert second.returncode == 0, text[-4000:]
    assert "position 1 of 1 (Resources)" in text, "Slurm's queue position and reason are shown"
    assert "succeeded (completed)" in text
    second_job = int(text.split("slurm job ", 1)[1].split(":", 1)[0])
    assert second_job != int(first_job)
    world = " ".join(text.split())
    ranks = world.split("world size 3:")[1][:300]
    on = [cluster.node_name(i) for i in range(1, NODES) if f"@{cluster.node_name(i)}(" in ranks]
    assert len(on) == 3, f"one rank on each of 3 Slurm compute nodes: {ranks}"
    assert f"teardown: done: Slurm job {second_job} cancelled" in world
    assert squeue(cluster) == [], "both allocations released"
    assert not run_processes(cluster, "trainer.task") and not run_processes(cluster, "hold.py")
    with RunRecords(fleetrun_home / "runs.db") as records:
        record = next(r for r in records.list(limit=5) if r.playbook_name == "t-slurm-digits")
    assert record.state == "succeeded" and record.scheduler_jobs == str(second_job)
    listing = fab("runs", home=fleetrun_home)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if record.id in line)
    assert f" {second_job} " in row, "fab runs shows the Slurm job id"


def test_with_ranks_via_srun_each_nodes_ranks_run_as_a_step_of_the_allocation(
    cluster: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """``slurm.ranks_via: srun``: each node's launcher runs under ``srun --overlap`` inside the
    run's allocation, so its ranks are Slurm job steps (``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` set
    by slurmstepd), one step per node."""
    data = yaml.safe_load(LocalSlurm(cluster).inventory_path.read_text())
    data["slurm"]["ranks_via"] = "srun"
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(yaml.safe_dump(data))
    work = tmp_path / "work"
    work.mkdir()
    (work / "step.py").write_text(
        "import os\nprint('slurm step', os.environ.get('SLURM_JOB_ID'), os.environ.get('SLURM_STEP_ID'), "
        "os.environ.get('RANK'), flush=True)\n"
    )
    playbook = write_playbook(
        tmp_path / "job.yaml", work, name="t-slurm-srun", entrypoint="python step.py", teardown="always"
    )
    runs = tmp_path / "runs"
    proc = fab("train", str(playbook), "--inventory", f"slurm:{inventory}", home=fleetrun_home, runs=runs)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    job = proc.stdout.split("slurm job ", 1)[1].split(":", 1)[0]
    (folder,) = runs.iterdir()
    steps = set()
    for log in folder.glob("nodes/*/node.log"):
        (line,) = [x for x in log.read_text().splitlines() if x.startswith("slurm step ")]
        _slurm, _step, job_id, step_id, _rank = line.split()
        assert job_id == job, f"{log}: the rank ran inside the run's allocation"
        steps.add(step_id)
    assert len(steps) == 3 and all(s.isdigit() for s in steps), "one job step per node"
    assert squeue(cluster) == []


def test_a_node_set_down_during_a_run_resumes_on_a_new_allocation_without_it(
    cluster: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """The torch-free job (the subject is Slurm's DOWN and the new allocation, not training):
    its first attempt holds after its first step, the next one runs its 30 steps."""
    slurm = LocalSlurm(cluster)
    work = tmp_path / "steps"
    shutil.copytree(STEPS_JOB, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "first_attempt_holds.py").write_text(FIRST_ATTEMPT_HOLDS)
    playbook = write_playbook(
        tmp_path / "job.yaml",
        work,
        name="t-slurm-down",
        entrypoint="python first_attempt_holds.py --steps 30",
        teardown="always",
        recovery={"max_restarts": 1, "grace_s": 5, "confirm_s": 2, "replace_timeout_s": 300},
    )
    out = tmp_path / "out.txt"
    proc = fab_in_background(playbook, cluster, fleetrun_home, out)
    victim = ""
    try:
        wait_for(lambda: said(out, "first step logged"), 300, "the first step")
        ((first_job, _state, nodelist),) = squeue(cluster)
        victim = hostnames(cluster, nodelist)[-1]  # not the head: its rendezvous is the run's
        down = slurm.command(
            ["scontrol", "update", f"nodename={victim}", "state=down", "reason=fleetrun-test"]
        )
        assert down.returncode == 0, down.stderr
        text = finished(proc, out)
    finally:
        if victim:
            slurm.command(["scontrol", "update", f"nodename={victim}", "state=resume"])
    assert proc.returncode == 0, text[-4000:]
    assert f"{victim}: the fleet took it: down" in text, "the watcher saw Slurm's DOWN"
    (spare,) = {cluster.node_name(i) for i in range(1, NODES)} - set(hostnames(cluster, nodelist))
    assert f"{victim}: replaced by {spare} (slurm job " in text
    second_job = text.split(f"{victim}: replaced by {spare} (slurm job ", 1)[1].split(")", 1)[0]
    assert "world size 3:" in " ".join(text.split()), "the ranks said their world"
    # this job's rank 0 names only itself in the world: a rank ran on the spare (its log), and the
    # next attempt's nodes (the run's record, below) leave the DOWN node out
    folder = Path(" ".join(text.split()).split("run folder: ", 1)[1].split()[0])
    spare_log = folder / "nodes" / spare / "node.log"
    assert spare_log.exists() and "starting after step" in spare_log.read_text(), sorted(
        folder.glob("nodes/*")
    )
    assert "succeeded (completed)" in text
    assert squeue(cluster) == [], "the first allocation and the replacement's released"
    assert not run_processes(cluster, "first_attempt_holds.py"), (
        "nothing of the run goes on, on the DOWN node either"
    )
    with RunRecords(fleetrun_home / "runs.db") as records:
        record = next(r for r in records.list(limit=5) if r.playbook_name == "t-slurm-down")
    assert record.state == "succeeded" and record.scheduler_jobs == f"{first_job},{second_job}"
    assert [a.get("loss") for a in record.attempts][:1] == ["node_lost"]
    nodes = record.attempts[-1]["nodes"]
    assert spare in nodes and victim not in nodes, record.attempts
    shown = fab("show", record.id, home=fleetrun_home)
    assert shown.returncode == 0 and f"{first_job},{second_job}" in shown.stdout, "every allocation held"


def test_a_gpu_fault_node_is_excluded_where_the_user_may_not_drain_and_drained_where_the_site_may(
    cluster: LocalFleet, fleetrun_home: Path
) -> None:
    """``drain_on_fault: true`` against the real slurmctld, without a training run: the fleet's
    user (no Slurm operator) asks ``scontrol update state=drain`` for a held node in ``renew``:
    refused by the controller, said, and the node only excluded from the new allocation. The
    same argv as the site's administrator drains it: ``sinfo`` and the watcher's question
    (``lost_nodes``) then call it drained, and ``fab doctor`` warns in that node's own line."""
    slurm = LocalSlurm(cluster)
    inventory = load_slurm_inventory(str(slurm.inventory_path))
    assert isinstance(inventory.fleet, SlurmFleetRef)
    ref = inventory.fleet.model_copy(update={"drain_on_fault": True})
    said: list[str] = []
    held = SlurmKind(ref).acquire(
        inventory.model_copy(update={"fleet": ref}), 1, "t-drain", said.append, True
    )
    assert isinstance(held.fleet, SlurmFleetRef)
    kind = SlurmKind(held.fleet)
    (node,) = held.hosts
    drained, ended = "", False
    try:
        new = kind.renew(node, said.append, 120.0)
        assert new is not None and new.name != node.name, said
        refused = next(line for line in said if line.startswith(f"{node.name}: not drained ("))
        assert "scontrol on the login host exited" in refused, refused
        assert slurm.node_states()[node.name] == "allocated", "the user's scontrol changed nothing"
        first, second = kind.job_ids()
        assert first == held.fleet.job_id and str(second) in [row[0] for row in squeue(cluster)]
        ended = kind.tear_down(said.append).state is TeardownState.DONE
        assert ended and squeue(cluster) == []
        reason = f"fleetrun: gpu_fault in run job {first}"
        drain = slurm.command(commands.drain_argv(node.name, reason))
        assert drain.returncode == 0, drain.stderr
        drained = node.name
        wait_for(lambda: slurm.node_states()[node.name] == "drained", 60, f"{node.name} drained")
        shown = slurm.command(["scontrol", "show", "node", node.name]).stdout
        assert f"Reason={reason} " in shown, shown
        assert kind.lost_nodes([node.name, new.name]) == {node.name: "drained"}
        doctor = fab("doctor", "--inventory", inventory_arg(cluster), home=fleetrun_home)
        print(doctor.stdout)  # the real output, for a look with -s
        lines = [" ".join(line.split()) for line in doctor.stdout.splitlines()]
        assert any(
            x.startswith("ok login host ") and "with its pinned key (slurm-wlm " in x for x in lines
        ), lines
        assert f"warning node {node.name}: drained: Slurm gives it to no run" in lines
        others = [h.name for h in inventory.hosts if h.name != node.name]
        assert all(f"ok node {n}: idle in partition gpu (gpu:2)" in lines for n in others), lines
    finally:
        if drained:
            slurm.command(["scontrol", "update", f"nodename={drained}", "state=resume"])
        if not ended:
            slurm.command(["scancel", *map(str, kind.job_ids())])


def test_with_the_laptop_gone_the_watchdog_cancels_the_allocation(
    cluster: LocalFleet, fleetrun_home: Path, tmp_path: Path
) -> None:
    """``fab train`` SIGKILLed once training began: the nodes' watchdogs take over, let the run
    finish and run their last step, ``scancel`` of the run's allocation. The allocation's time
    limit is an hour, so an empty ``squeue`` now is the watchdog's doing. The torch-free job: the
    subject is the watchdog and the allocation."""
    playbook = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-slurm-gone",
        entrypoint="python steps.py --steps 100 --step-sleep 0.1",
        teardown="always",
        stop={"watcher_lost_after_s": 5},
    )
    out = tmp_path / "out.txt"
    proc = fab_in_background(playbook, cluster, fleetrun_home, out)
    try:
        wait_for(lambda: said(out, "first step logged"), 300, "the first step")
        ((job, state, _nodes),) = squeue(cluster)
        assert state == "RUNNING"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: squeue(cluster) == [], 600, f"the watchdogs to scancel slurm job {job}")
    wait_for(lambda: not run_processes(cluster, "steps.py"), 60, "the run's processes to end")
    log = (LocalSlurm(cluster).controller_dir / "slurmctld.log").read_text(errors="replace")
    assert f"REQUEST_KILL_JOB JobId={job} uid" in log, "cancelled (scancel), not ended by its time limit"
    assert not said(out, "teardown:"), "the killed fab train never reached its own teardown"
