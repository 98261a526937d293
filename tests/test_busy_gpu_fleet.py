"""Busy GPUs on a real local-fleet node: an ``nvidia-smi`` stand-in on the node's PATH reports a
process of another user (root's pid 1) on GPU 0. ``fab train`` refuses before starting anything,
naming node, user, pid, memory and GPU; ``--allow-busy-gpus`` starts it anyway."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.cli import app
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import STEPS_JOB, TEST_PREFIX, needs_root, write_playbook
from tests.faultkit import quiet

pytestmark = needs_root()
INVENTORY = f"local:{TEST_PREFIX}"
STAND_IN = """#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, GPU-11111111-2222"; echo "1, GPU-33333333-4444";;
  --query-compute-apps=*) echo "GPU-11111111-2222, 1, 4096";;
  -L) echo "GPU 0: Stand-in (UUID: GPU-11111111-2222)"; echo "GPU 1: Stand-in (UUID: GPU-33333333-4444)";;
esac
"""
MARK = "# fleetrun test: nvidia-smi stand-in\n"


@pytest.fixture
def busy_node(fleet: LocalFleet) -> Iterator[str]:
    """Node 1's bash (which sshd's commands run in) finds the stand-in first on its PATH."""
    user = fleet.node_name(1)
    entry = pwd.getpwnam(user)
    home = Path(entry.pw_dir)
    fakebin = home / "fakebin"
    fakebin.mkdir(exist_ok=True)
    (fakebin / "nvidia-smi").write_text(STAND_IN)
    (fakebin / "nvidia-smi").chmod(0o755)
    os.chown(fakebin, entry.pw_uid, entry.pw_gid)
    bashrc = home / ".bashrc"
    old = bashrc.read_text() if bashrc.exists() else None
    bashrc.write_text(MARK + 'export PATH="$HOME/fakebin:$PATH"\n' + (old or ""))
    yield user
    if old is None:
        bashrc.unlink()
    else:
        bashrc.write_text(old)
    (fakebin / "nvidia-smi").unlink()
    fakebin.rmdir()


def test_busy_gpu_refuses_the_start_and_the_override_runs(
    fleet: LocalFleet, busy_node: str, tmp_path: Path
) -> None:
    """The job is the torch-free trainer: the claim and its override are the subject."""
    playbook = write_playbook(
        tmp_path / "job.yaml", STEPS_JOB, name="t-busy", entrypoint="python steps.py --steps 20"
    )
    refused = app.train(
        playbook, inventory=INVENTORY, console=quiet(), poll_interval=0.5, ask_on_interrupt=False
    )
    assert isinstance(refused, RunResult)
    assert (refused.outcome, refused.rule, refused.failed_nodes) == ("failed", "claim_failed", (busy_node,))
    assert "GPU 0 is busy: user root, pid 1, 4096 MiB" in refused.reason
    assert "--allow-busy-gpus" in refused.reason
    home = Path(pwd.getpwnam(busy_node).pw_dir)
    assert not (home / ".fleetrun" / "runs" / refused.run_id / "launch.sh").exists(), "nothing started"
    allowed = app.train(
        playbook,
        inventory=INVENTORY,
        console=quiet(),
        poll_interval=0.5,
        ask_on_interrupt=False,
        allow_busy_gpus=True,
    )
    assert isinstance(allowed, RunResult) and allowed.outcome == "succeeded", allowed.reason
