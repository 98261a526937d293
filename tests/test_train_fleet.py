"""``fab train`` on a real 3-node local fleet: success, a failing rank, host keys, bad hosts, setup skips."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml

from launch.cli import app
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import (
    REPO,
    STEPS_JOB,
    TEST_PREFIX,
    assert_nothing_running,
    needs_root,
    quiet_console,
    write_playbook,
)

pytestmark = needs_root()
INVENTORY = f"local:{TEST_PREFIX}"


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_three_node_torchrun_job_through_fab(
    fleet: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "job.yaml", digits_workdir, name="t-e2e", entrypoint="python -m trainer.task --epochs 3"
    )
    runs = tmp_path / "runs"
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(runs)}
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", INVENTORY],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = list(runs.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    world = summary["world"]
    assert world["world_size"] == 3 and world["backend"] == "gloo"
    addrs = {r["addr"] for r in world["ranks"]}
    hosts = {r["host"] for r in world["ranks"]}
    assert addrs == {fleet.address(i) for i in range(3)}, "every rank joined, one per node"
    assert hosts == {fleet.node_name(i) for i in range(3)}
    losses = [m["loss"] for m in read_metrics(run / "metrics.jsonl") if "loss" in m]
    assert len(losses) >= 30
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, "the loss fell"
    for i in range(3):
        node = run / "nodes" / fleet.node_name(i)
        assert (node / "node.log").exists() and (node / "launch.sh").exists()
        assert (node / "rc").read_text().strip() == "0"
    rank0_node = summary["rank0_node"]
    assert (run / "nodes" / rank0_node / "outputs" / "model.pt").stat().st_size > 10_000
    assert (run / "loss.png").stat().st_size > 1000
    assert "first step logged" in proc.stdout
    assert_nothing_running(fleet)


def test_failing_rank_is_named_and_the_rest_stopped(fleet: LocalFleet, tmp_path: Path) -> None:
    """The torch-free job (its ranks share no collective): the other two ranks would go on for
    10000 steps had fleetrun not stopped them once rank 1 failed."""
    playbook = write_playbook(
        tmp_path / "fail.yaml",
        STEPS_JOB,
        name="t-fail",
        entrypoint="python steps.py --steps 10000 --fail-rank 1 --fail-step 5 --step-sleep 0.05",
    )
    console, buf = quiet_console()
    result = app.train(playbook, inventory=INVENTORY, console=console, poll_interval=0.5)
    assert isinstance(result, RunResult)
    assert result.outcome == "failed"
    assert result.world is not None
    # each rank of this job reports only itself (rank 0 the world): rank 1's node is the one
    # whose log came back with its failure
    logs = {node.parent.name: node.read_text() for node in result.folder.glob("nodes/*/node.log")}
    assert len(logs) == 3, sorted(logs)
    rank1_hosts = [name for name, log in logs.items() if "rank 1: failing on purpose at step 5" in log]
    assert rank1_hosts == [result.failed_node], (rank1_hosts, result.failed_node)
    assert result.rule == "rank_failed"
    # the rank's own code (3) when the node's rank watch read it before torchrun reaped it, else
    # torchrun's (1), which comes once torchrun ends
    assert re.match(rf"{result.failed_node} exited with exit code [13]\b", result.reason), result.reason
    assert_nothing_running(fleet)


def test_changed_host_key_is_refused(fleet: LocalFleet, digits_workdir: Path, tmp_path: Path) -> None:
    node_dir = fleet.node_dir(2)
    key = node_dir / "ssh_host_ed25519_key"
    saved = {p: p.read_bytes() for p in (key, key.with_suffix(".pub"))}
    pid = int((node_dir / "sshd.pid").read_text())
    try:
        for p in saved:
            p.unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        os.kill(pid, signal.SIGHUP)  # sshd re-executes itself and serves the new key
        time.sleep(1.0)
        playbook = write_playbook(tmp_path / "job.yaml", digits_workdir, name="t-hostkey")
        console, buf = quiet_console()
        result = app.train(playbook, inventory=INVENTORY, console=console)
        assert isinstance(result, RunResult) and result.outcome == "failed"
        name = fleet.node_name(2)
        assert result.failed_node == name
        assert (
            f"{name}: host key at {name}@{fleet.address(2)}:22 does not match the pinned key" in result.reason
        )
        for i in range(3):
            assert not Path(f"/home/{fleet.node_name(i)}/.fleetrun/work/t-hostkey").exists(), (
                "nothing was synced or started"
            )
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
        key.chmod(0o600)
        os.kill(int((node_dir / "sshd.pid").read_text()), signal.SIGHUP)
        time.sleep(1.0)


def test_unreachable_host_is_named_and_nothing_starts(
    fleet: LocalFleet, digits_workdir: Path, tmp_path: Path
) -> None:
    real = fleet.inventory().hosts[0]
    ghost = f"{fleet.block_prefix(0)}.250"  # in this fleet's own subnet: nobody answers there
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "defaults": {"key": str(real.key)},
                "hosts": [
                    {
                        "name": real.name,
                        "address": real.address,
                        "user": real.user,
                        "host_key": real.host_key,
                    },
                    {"name": "ghost", "address": ghost, "user": "nobody", "host_key": real.host_key},
                ],
            }
        )
    )
    playbook = write_playbook(tmp_path / "job.yaml", digits_workdir, name="t-unreachable", nodes=2)
    console, buf = quiet_console()
    result = app.train(playbook, inventory=str(inventory), console=console)
    assert isinstance(result, RunResult) and result.outcome == "failed"
    assert result.failed_node == "ghost"
    assert f"ghost: unreachable at nobody@{ghost}:22" in result.reason
    assert not Path(f"/home/{real.user}/.fleetrun/work/t-unreachable").exists(), "nothing was synced"


def test_setup_skipped_when_unchanged_and_rerun_after_change(fleet: LocalFleet, tmp_path: Path) -> None:
    work = tmp_path / "hello"
    work.mkdir()
    (work / "hello.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    fields = {
        "name": "t-setup",
        "nodes": 2,
        "entrypoint": "python hello.py",
        "setup": ["echo preparing > prepared.txt"],
    }
    playbook = write_playbook(tmp_path / "job.yaml", work, **fields)
    outputs = []
    for _ in range(2):
        console, buf = quiet_console()
        result = app.train(playbook, inventory=INVENTORY, console=console, poll_interval=0.3)
        assert isinstance(result, RunResult) and result.ok, buf.getvalue()[-2000:]
        outputs.append(buf.getvalue())
    assert outputs[0].count("setup ran: first setup of job t-setup") == 2
    assert outputs[1].count("setup skipped: unchanged") == 2
    write_playbook(tmp_path / "job.yaml", work, **{**fields, "setup": ["echo changed > prepared.txt"]})
    console, buf = quiet_console()
    result = app.train(playbook, inventory=INVENTORY, console=console, poll_interval=0.3)
    assert isinstance(result, RunResult) and result.ok
    assert buf.getvalue().count("setup ran: setup commands or requirements changed") == 2
    assert Path(f"/home/{fleet.node_name(0)}/.fleetrun/work/t-setup/prepared.txt").read_text() == "changed\n"
