"""A preemption notice on a real 2-node local fleet, and a resume from the bucket after the disk is gone.

The fleet's bucket is a local S3-compatible server (moto, ``tests/s3server.py``) on the fleet's
bridge address; nodes reach it with the image's real ``aws`` CLI. One node's namespace gets a
metadata server of our own at 169.254.169.254 (real HTTP, the IMDSv2 token flow). The laptop's
``fab train`` is SIGKILLed once training runs, so what happens is the nodes' doing alone: the
watchdog hears the notice, every rank checkpoints at the next step (rank 0 may be on the other
node: the ranks agree through an all-reduce), the checkpoint reaches the bucket, the node records
``preempted``, and only then do the watchdogs stop and power the nodes off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.nodelib.fleetrun_protocol import PollAnswer
from launch.planning import remote_layout as layout
from tests.conftest import REPO, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook
from tests.faultkit import wait_for
from tests.recovery_helpers import metadata_server, update_fleet_state
from tests.s3server import S3Server, have_s3_tools

pytestmark = needs_root()
PREFIX = fleet_prefix("p")
BUCKET = "fleet-ckpt"


@pytest.fixture(scope="module")
def setup(
    fleetrun_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalFleet, S3Server, Path]]:
    missing = have_s3_tools()
    if missing:
        pytest.skip(missing)
    control = tmp_path_factory.mktemp("metadata")
    with module_fleet(PREFIX, fleet_subnet(13), 2) as fleet:
        if not (Path(fleet_python()).parent / "aws").exists():
            pytest.skip("the node image has no aws CLI: run make setup (images/local/requirements.txt)")
        with S3Server(fleet.gateway) as s3:
            s3.create_bucket(BUCKET)
            update_fleet_state(fleet, bucket=BUCKET, s3_endpoint=s3.endpoint, preemption_poller="ec2-imdsv2")
            with metadata_server(fleet, 1, control):
                yield fleet, s3, control


def run_dirs(fleet: LocalFleet, i: int) -> list[Path]:
    return sorted(fleet.home(i).glob(".fleetrun/runs/*"))


def in_node(fleet: LocalFleet, i: int, script: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """A shell command inside node i's namespace with its home as ``$HOME`` (root: the node is
    powered off, and the power daemon keeps its user's processes away)."""
    return subprocess.run(
        ["ip", "netns", "exec", fleet.netns(i), "env", f"HOME={fleet.home(i)}", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_notice_checkpoints_to_the_bucket_then_resume_from_it(
    setup: tuple[LocalFleet, S3Server, Path], fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    fleet, s3, control = setup
    playbook = write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-preempt",
        nodes=2,
        entrypoint="python -m trainer.task --epochs 30 --step-sleep 0.1 --checkpoint-every 10",
        stop={"watcher_lost_after_s": 5},
    )
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{PREFIX}"],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(tmp_path / "runs")},
        stdout=(tmp_path / "fab.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: any(k.endswith("/checkpoints/LATEST.json") for k in s3.keys(BUCKET, "runs/")),
            150,
            "a first checkpoint in the bucket",
        )
    except AssertionError:
        raise AssertionError(diagnosis(fleet, tmp_path)) from None
    finally:
        fab.kill()  # the laptop is gone: from here on, the nodes act alone
        fab.wait()
    (run_dir,) = run_dirs(fleet, 1)
    run_id = run_dir.name
    noticed = time.time()
    (control / "notice").touch()
    try:
        wait_for(
            lambda: (
                (run_dir / "preempt.json").exists()
                and json.loads((run_dir / "preempt.json").read_text()).get("durable_step") is not None
            ),
            150,
            "the notice's checkpoint to be durable",
        )
    except AssertionError:
        raise AssertionError(diagnosis(fleet, tmp_path)) from None
    record = json.loads((run_dir / "preempt.json").read_text())
    guard_log = (run_dir / "guard.log").read_text()
    assert record["source"] == "ec2-imdsv2" and record["signalled"] == 1, guard_log
    (signalled,) = list((run_dir / "signals").glob("rank-*"))  # this node's one rank
    assert float(signalled.read_text().split()[0]) >= noticed, "the rank got SIGTERM after the notice"
    step = record["durable_step"]
    prefix = f"runs/{run_id}/checkpoints"
    pointer = json.loads(s3.get(BUCKET, f"{prefix}/LATEST.json"))
    assert pointer["steps"][0] == step and pointer["updated"] >= noticed, pointer
    keys = s3.keys(BUCKET, f"{prefix}/step-{step}/")
    assert {k.rsplit("/", 1)[1] for k in keys} == {"MANIFEST.json", "training_state.pt"}, keys
    manifest = json.loads(s3.get(BUCKET, f"{prefix}/step-{step}/MANIFEST.json"))
    assert manifest["step"] == step and manifest["created"] >= noticed, "made after the notice"

    # the node's status says preempted (what the laptop's watcher reads at every poll)
    agent = fleet.home(1) / layout.AGENT
    poll = subprocess.run(
        [sys.executable, str(agent), "poll", str(run_dir), "0", "--no-heartbeat"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answer = PollAnswer.from_json(poll.stdout.strip().splitlines()[-1])
    assert answer.preempted is not None and answer.preempted.durable_step == step

    # the checkpoint was durable before the node went: the watchdogs stop and power off after it
    wait_for(
        lambda: "powering this node off" in (run_dir / "guard.log").read_text(), 120, "node 1's power-off"
    )
    lines = (run_dir / "guard.log").read_text().splitlines()
    durable_at = next(i for i, line in enumerate(lines) if "is in the bucket" in line)
    assert durable_at < next(i for i, line in enumerate(lines) if "powering this node off" in line)

    # the node's disk lost: the checkpoint comes from the bucket, and training resumes from it
    (run0,) = run_dirs(fleet, 0)
    wait_for(lambda: "powering this node off" in (run0 / "guard.log").read_text(), 120, "node 0's power-off")
    # the watchdog logs before it asks; the power daemon kills everything in the namespace when it
    # acts: wait for that, or the commands below could be killed with the node's last processes
    wait_for(lambda: (fleet.node_dir(0) / "powered-off").exists(), 60, "node 0 powered off")
    lose_checkpoints(fleet)
    home = f"$HOME/{layout.rundir(run_id)}"
    found = in_node(
        fleet,
        0,
        f'FLEETRUN_RUN_DIR="{home}" PYTHONPATH="$HOME/{layout.LIB}" {fleet_python()} -c '
        "'import fleetrun_checkpoint as c; f = c.latest(); print(f.source, f.step)'",
    )
    assert found.returncode == 0 and found.stdout.split() == ["bucket", str(step)], found.stderr[-2000:]
    lose_checkpoints(fleet)
    resumed = in_node(
        fleet,
        0,
        f'. "$HOME/{layout.envdir("t-preempt")}/bin/activate" && cd "$HOME/{layout.workdir("t-preempt")}" && '
        f'FLEETRUN_RUN_DIR="{home}" PYTHONPATH="$HOME/{layout.LIB}" OMP_NUM_THREADS=1 '
        # an epoch or two past the checkpoint's (23 steps an epoch on 2 ranks), not 30 epochs
        f"python -m trainer.task --epochs {step // 20 + 2} 2>&1",
    )
    assert f"resumed from step {step} " in resumed.stdout and "bucket)" in resumed.stdout, resumed.stdout[
        -2000:
    ]
    assert resumed.returncode == 0, resumed.stdout[-2000:]


def diagnosis(fleet: LocalFleet, tmp_path: Path) -> str:
    parts = [(tmp_path / "fab.log").read_text(errors="replace")[-2000:]]
    for i in range(2):
        for d in run_dirs(fleet, i):
            for name in ("guard.log", "node.log", "preempt.json"):
                if (d / name).exists():
                    parts.append(f"--- node {i} {name}\n" + (d / name).read_text(errors="replace")[-2500:])
    return "\n".join(parts)


def lose_checkpoints(fleet: LocalFleet) -> None:
    """Every node's checkpoints gone (a replacement node's empty disk)."""
    for i in range(2):
        for directory in run_dirs(fleet, i):
            shutil.rmtree(directory / "checkpoints", ignore_errors=True)


def fleet_python() -> str:
    from launch.fleets.local import image_python

    return str(image_python())
