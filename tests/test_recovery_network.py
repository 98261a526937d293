"""No false recoveries and no endless retries (issue 11), on a real 3-node local fleet.

* A rank that fails at the same step in every attempt: stopped after ``max_restarts`` with a clear
  reason, nothing left running.
* A network blip longer than the watcher's unreachable limit but shorter than the re-check window
  (node 1's link down for 17 s): the node answers the re-check, the attempt is watched on,
  zero recoveries, and the run succeeds.
* 5% packet loss (tc netem) on node 1's link through a healthy run: zero recoveries and zero
  "unreachable". About a minute here rather than the issue's two (the suite's time budget); it
  needs the kernel's netem qdisc and is skipped, saying so, where the kernel lacks it.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from launch.cli import app
from launch.fleets.local import LocalFleet
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
from tests.faultkit import run_with_fault
from tests.recovery_helpers import attempts_of, run_dirs, step_reached

pytestmark = needs_root()
PREFIX = fleet_prefix("z")
JOB = REPO / "tests" / "recovery_job"


@pytest.fixture(scope="module")
def fleet3(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(15), 3) as fleet:
        yield fleet
        for i in range(3):
            subprocess.run(["ip", "link", "set", fleet.veth(i), "up"], check=False, capture_output=True)


def playbook(tmp_path: Path, args: str, recovery: dict, **stop: object) -> Path:
    return write_playbook(
        tmp_path / "job.yaml",
        JOB,
        name="t-recover-net",
        entrypoint=f"python ckpt_trainer.py --ckpt-every 5 {args}",
        # grace_s 2: after a failed rank the others wait in a collective, with nothing to save
        recovery={"grace_s": 2, "confirm_s": 2, **recovery},
        stop={"watcher_lost_after_s": 300, **stop},
    )


def train_watched(book: Path, fleet: LocalFleet, during: object = None) -> tuple[RunResult, str]:
    """``fab train`` with its console captured; ``during`` runs once training has begun."""
    out = io.StringIO()
    box: dict[str, object] = {}
    old = run_dirs(fleet)

    def target() -> None:
        box["result"] = app.train(
            book,
            inventory=f"local:{fleet.prefix}",
            console=Console(file=out, width=200, force_terminal=False),
            poll_interval=0.5,
            ask_on_interrupt=False,
        )

    thread = threading.Thread(target=target)
    thread.start()
    if callable(during):
        deadline = time.monotonic() + 120
        while not step_reached(fleet, 3, old) and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.2)
        during()
    thread.join(600)
    assert not thread.is_alive() and "result" in box, out.getvalue()[-3000:]
    result = box["result"]
    assert isinstance(result, RunResult)
    return result, out.getvalue()


def test_rank_failing_every_time_stops_after_max_restarts(fleet3: LocalFleet, tmp_path: Path) -> None:
    """The job is the torch-free trainer (rank 1 fails at step 8 of every attempt; the others
    step on until stopped): the restart policy is the subject, not the training state."""
    book = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-recover-net",
        entrypoint="python steps.py --checkpoint-every 5 --steps 4000 --step-sleep 0.1 --fail-rank 1 --fail-step 8",
        recovery={"grace_s": 2, "confirm_s": 2, "max_restarts": 1, "on": ["rank_failed"]},
        stop={"watcher_lost_after_s": 300},
    )
    result = run_with_fault(book, fleet3, None)
    assert result.outcome == "failed" and result.rule == "rank_failed", result.reason
    assert "max_restarts (1) reached" in result.reason, result.reason
    assert [a["loss"] for a in attempts_of(result)] == ["rank_failed", "rank_failed"]
    assert_nothing_running(fleet3)


def test_short_network_blip_is_not_a_lost_node(fleet3: LocalFleet, tmp_path: Path) -> None:
    """Node 1's link is down 8 s: the poll in flight gives up when the unreachable limit (2 s,
    counted from the last answer) is due, so the rule fires within about 2 s of the cut; the
    re-checks (window 12 s) see sshd answer again once the link is back. The ranks' collectives
    wait it out (gloo timeout 30 s)."""
    link = fleet3.veth(1)

    def blip() -> None:
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        time.sleep(8)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)

    book = playbook(
        tmp_path,
        "--steps 60 --step-sleep 0.25",
        {"max_restarts": 2, "confirm_s": 12},
        unreachable_timeout_s=2,
    )
    result, said = train_watched(book, fleet3, blip)
    assert result.outcome == "succeeded", result.reason
    assert "answered again; not lost, watching on" in said, said[-3000:]
    attempts = attempts_of(result)
    assert len(attempts) == 1 and attempts[0]["outcome"] == "succeeded", attempts
    assert not attempts[0]["replaced"] and not attempts[0]["dropped"]


def netem(fleet: LocalFleet, i: int, action: str) -> subprocess.CompletedProcess[str]:
    """5% loss both ways on node i's link: the host end of the veth, and the node's eth0."""
    host = subprocess.run(
        ["tc", "qdisc", action, "dev", fleet.veth(i), "root", "netem", "loss", "5%"],
        capture_output=True,
        text=True,
    )
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            fleet.netns(i),
            "tc",
            "qdisc",
            action,
            "dev",
            "eth0",
            "root",
            "netem",
            "loss",
            "5%",
        ],
        capture_output=True,
        text=True,
    )
    return host


def test_packet_loss_causes_no_recovery(fleet3: LocalFleet, tmp_path: Path) -> None:
    added = netem(fleet3, 1, "add")
    if added.returncode != 0:
        pytest.skip(f"this kernel has no netem qdisc (tc: {added.stderr.strip()[:200]})")
    try:
        book = playbook(tmp_path, "--steps 200 --step-sleep 0.25", {"max_restarts": 2})
        result, said = train_watched(book, fleet3)
    finally:
        netem(fleet3, 1, "del")
    assert result.outcome == "succeeded", result.reason
    assert "-> unreachable" not in said and "checking which nodes are really gone" not in said, said[-3000:]
    assert len(attempts_of(result)) == 1
