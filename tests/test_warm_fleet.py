"""``keep_warm_s``: after a run the local fleet's node stays up instead of being torn down; the
next run reuses it (setup skipped); with no next run the node powers itself off when the time is
up, with the laptop gone. Its own 1-node fleet: the node is powered off at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.transport.reachability import sshd_answers
from tests.conftest import fab, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook

pytestmark = needs_root()
PREFIX = fleet_prefix("g")


@pytest.fixture(scope="module")
def warm_fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(12), 1) as fleet:
        yield fleet


def test_kept_warm_reused_then_powered_off_without_the_laptop(
    warm_fleet: LocalFleet, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "job.yaml", digits_workdir, name="t-warm", nodes=1, teardown="always", keep_warm_s=20,
        entrypoint="python -m trainer.task --epochs 1",
    )  # fmt: skip
    runs = tmp_path / "runs"
    first = fab("train", str(playbook), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "kept warm: each node powers itself off in 20 s" in first.stdout
    assert "teardown: skipped: kept warm for 20 s instead (teardown: always)" in first.stdout
    head = warm_fleet.inventory().hosts[0]
    assert sshd_answers(head, 3.0), "teardown: always did not remove the warm fleet"
    # the second run keeps the node warm for 5 s only (its own keep_warm_s re-arms the timer; not
    # part of the setup hash): the 20 s above gave its `fab train` the time to claim the node
    again = write_playbook(
        tmp_path / "again.yaml", digits_workdir, name="t-warm", nodes=1, teardown="always", keep_warm_s=5,
        entrypoint="python -m trainer.task --epochs 1",
    )  # fmt: skip
    second = fab("train", str(again), "--inventory", f"local:{PREFIX}", home=fleetrun_home, runs=runs)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "setup skipped: unchanged" in second.stdout, "the warm node was reused as it was"
    assert "kept warm: each node powers itself off in 5 s" in second.stdout
    home = Path(f"/home/{warm_fleet.node_name(0)}/.fleetrun")
    log = (home / "warm.log").read_text()
    assert "a new run claimed this node" in log or "re-armed by a later run" in log, log
    deadline = time.monotonic() + 120  # 5 s after the second run, whatever this machine's load
    while time.monotonic() < deadline and sshd_answers(head, 2.0):
        time.sleep(1)
    assert not sshd_answers(head, 3.0), "the node powered itself off, with no laptop"
    assert "no new run in time: powering this node off" in (home / "warm.log").read_text()
