"""``launcher: horovod`` on the real local fleet: a 3-node job through ``fab train``, a failing rank,
and the cluster-internal SSH the head's horovodrun uses (pinned, and usable from the head only).

Horovod is built once into the local fleet's image by ``images/horovod/install.sh`` (a cached
wheel makes later runs take seconds); these tests skip, saying why, when it cannot be built.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launch.cli import app
from launch.fleets.local import LocalFleet, image_python
from launch.planning import cluster_ssh
from launch.run.summary import RunResult
from tests.conftest import (
    REPO,
    assert_nothing_running,
    needs_root,
    quiet_console,
    write_playbook,
)

pytestmark = needs_root()
INSTALL = REPO / "images" / "horovod" / "install.sh"


@pytest.fixture(scope="module")
def horovod_image(fleet: LocalFleet) -> Path:
    """Horovod importable by the fleet image's Python (every node's job venv layers the image in)."""
    python = image_python()
    proc = subprocess.run(
        ["sh", str(INSTALL), str(python)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        pytest.skip(f"Horovod could not be built or installed into {python} by {INSTALL}:\n{tail}")
    return python


def in_node(
    fleet: LocalFleet, i: int, argv: list[str], user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command inside node ``i``'s network namespace (as its user when given)."""
    prefix = ["ip", "netns", "exec", fleet.netns(i)]
    if user:
        prefix += ["runuser", "-u", user, "--"]
    return subprocess.run(prefix + argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(1800)  # the first test may build Horovod (about 3.5 min on 2 cores), once
def test_three_node_horovod_job_through_fab(
    fleet: LocalFleet, horovod_image: Path, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-hvd",
        launcher="horovod",
        entrypoint="python -m trainer.task_horovod --epochs 3",
    )
    runs = tmp_path / "runs"
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(runs)}
    # Worker 1's authorized_keys lacks a trailing newline: the cluster key must not glue onto it.
    keys = [Path(f"/home/{fleet.node_name(i)}/.ssh/authorized_keys") for i in range(3)]
    saved = [k.read_bytes() for k in keys]
    keys[1].write_bytes(saved[1].rstrip(b"\n"))
    before = [k.read_bytes() for k in keys]
    try:
        proc = subprocess.run(
            [
                str(REPO / ".venv" / "bin" / "fab"),
                "train",
                str(playbook),
                "--inventory",
                f"local:{fleet.prefix}",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        after = [k.read_bytes() for k in keys]
    finally:
        for k, content in zip(keys, saved, strict=True):
            k.write_bytes(content)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = list(runs.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    names = [fleet.node_name(i) for i in range(3)]
    addrs = [fleet.address(i) for i in range(3)]

    world = summary["world"]
    assert world["world_size"] == 3 and world["backend"] == "horovod-gloo"
    ranks = sorted(world["ranks"], key=lambda r: r["rank"])
    assert [r["host"] for r in ranks] == names, "every rank joined, one per node, in -H order"
    assert [r["addr"] for r in ranks] == addrs
    for r in ranks:
        home = f"/home/{r['host']}"
        assert r["python"] == f"{home}/.fleetrun/envs/t-hvd/bin/python", "the node's own job venv"
        assert r["cwd"] == f"{home}/.fleetrun/work/t-hvd", "the node's own workdir"

    status = json.loads((run / "status.json").read_text())
    checksums = status["param_checksums"]
    assert len(checksums) == 3 and len(set(checksums)) == 1, f"replicas diverged: {checksums}"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert len(losses) >= 30
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, "the loss fell"

    head = run / "nodes" / names[0]
    assert (head / "rc").read_text().strip() == "0", "horovodrun exited 0"
    launch = (head / "launch.sh").read_text()
    assert f"-np 3 -H {addrs[0]}:1,{addrs[1]}:1,{addrs[2]}:1 --network-interfaces" in launch
    assert summary["rank0_node"] == names[0]
    assert (head / "outputs" / "model.pt").stat().st_size > 10_000
    for i in (1, 2):
        worker = run / "nodes" / names[i]
        assert not (worker / "launch.sh").exists(), "workers' ranks are started by horovodrun"
        assert (worker / f"rank-{i}.log").exists(), "each worker's rank log came back"
        assert not (worker / "rc").exists(), "no rank failed on this worker"
    assert_nothing_running(fleet)

    # The cluster key was revoked at the end of the run: every authorized_keys is byte for byte
    # what it was (the unterminated one included), and the head's key files are gone.
    assert after == before, "the operator's keys are intact and no fleetrun key remains"
    assert not Path(f"/home/{names[0]}/{cluster_ssh.CLUSTER_DIR}").exists(), (
        "the head's cluster key is deleted"
    )


def test_cluster_ssh_is_pinned_and_works_from_the_head_only(fleet: LocalFleet, horovod_image: Path) -> None:
    """The plan's cluster SSH files, put on the nodes as the runner would, then revoked."""
    head_user, worker_user = fleet.node_name(0), fleet.node_name(1)
    inventory = fleet.inventory()
    key = cluster_ssh.new_cluster_key(inventory)
    for f in cluster_ssh.head_files(key, inventory.hosts[1:]):
        target = Path(f"/home/{head_user}/{f.path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
        target.chmod(f.mode)
    subprocess.run(["chown", "-R", f"{head_user}:{head_user}", f"/home/{head_user}/.fleetrun"], check=True)
    worker_keys = Path(f"/home/{worker_user}/.ssh/authorized_keys")
    before = worker_keys.read_bytes()
    known = Path(f"/home/{head_user}/{cluster_ssh.KNOWN_HOSTS}").read_text()
    assert known == "".join(f"{h.private_address} {h.host_key}\n" for h in inventory.hosts[1:])
    authorize = cluster_ssh.authorize_script(key, inventory.head)
    subprocess.run(["runuser", "-u", worker_user, "--", "sh", "-c", authorize], check=True, cwd="/")
    try:
        _check_pinned_and_head_only(fleet, head_user, worker_user)
    finally:
        for user in (head_user, worker_user):
            subprocess.run(
                ["runuser", "-u", user, "--", "sh", "-c", cluster_ssh.revoke_command()], check=True, cwd="/"
            )
    assert worker_keys.read_bytes() == before
    assert not Path(f"/home/{head_user}/{cluster_ssh.CLUSTER_DIR}").exists()


def _check_pinned_and_head_only(fleet: LocalFleet, head_user: str, worker_user: str) -> None:
    wrapper = f"/home/{head_user}/{cluster_ssh.SSH_WRAPPER}"
    ok = in_node(fleet, 0, [wrapper, fleet.address(1), "id", "-un"], user=head_user)
    assert ok.returncode == 0 and ok.stdout.strip() == worker_user, ok.stderr
    # A worker host key that differs from the pinned one is refused, whatever horovodrun passes.
    known = Path(f"/home/{head_user}/{cluster_ssh.KNOWN_HOSTS}")
    saved = known.read_text()
    other_key = fleet.inventory().hosts[2].host_key
    try:
        known.write_text(saved.replace(fleet.inventory().hosts[1].host_key, other_key))
        bad = in_node(
            fleet,
            0,
            [wrapper, "-o", "StrictHostKeyChecking=no", fleet.address(1), "true"],
            user=head_user,
        )
        assert bad.returncode == 255, "a changed host key must stop the connection"
    finally:
        known.write_text(saved)
    # The same private key used from another node is refused (authorized from the head only).
    key = f"/home/{head_user}/{cluster_ssh.PRIVATE_KEY}"
    elsewhere = in_node(
        fleet,
        2,
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            key,
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            f"{worker_user}@{fleet.address(1)}",
            "true",
        ],
    )
    assert elsewhere.returncode == 255 and "Permission denied" in elsewhere.stderr, elsewhere.stderr


@pytest.mark.timeout(1800)
def test_failing_horovod_rank_is_detected_and_reported(
    fleet: LocalFleet, horovod_image: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "fail.yaml",
        digits_workdir,
        name="t-hvd-fail",
        launcher="horovod",
        nodes=2,
        entrypoint="python -m trainer.task_horovod --epochs 50 --fail-rank 1 --fail-step 5 --step-sleep 0.05",
    )
    console, buf = quiet_console()
    result = app.train(playbook, inventory=f"local:{fleet.prefix}", console=console, poll_interval=0.5)
    assert isinstance(result, RunResult)
    assert result.outcome == "failed" and result.rule == "rank_failed", buf.getvalue()[-3000:]
    assert result.world is not None
    rank1_host = next(r["host"] for r in result.world["ranks"] if r["rank"] == 1)
    head = fleet.node_name(0)
    assert rank1_host == fleet.node_name(1)
    assert result.failed_node == rank1_host, "the rank's node failed first (its exit precedes horovodrun's)"
    assert result.reason.startswith(f"{rank1_host} exited with exit code")
    assert result.exit_codes[rank1_host] == 3, "the failing rank's own exit code, recorded on its node"
    # the worker's failure is acted on at the next poll, often before horovodrun on the head notices
    assert result.exit_codes[head] != 0, "horovodrun on the head did not succeed"
    worker_log = (result.folder / "nodes" / rank1_host / "rank-1.log").read_text()
    assert "failing on purpose at step 5" in worker_log, "the failing rank's log came back"
    head_log = (result.folder / "nodes" / head / "node.log").read_text()
    assert "Process 1 exit with status code 3" in head_log, "horovodrun's account is in the head's log"
    assert_nothing_running(fleet)
