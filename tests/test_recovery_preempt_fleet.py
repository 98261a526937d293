"""A spot notice with the laptop watching and ``recovery:`` on (issues 11 and 19), on a real 2-node
local fleet made as a user makes it: ``local.up --bucket --spot`` (the fleet's own S3-compatible
server as the nodes' bucket, a metadata endpoint at 169.254.169.254 inside every node's namespace)
and ``local.preempt``'s notice (EC2's IMDSv2 flow, the node taken 120 s later).

The noticed node's watchdog flags every rank, which checkpoints at its next step and uploads; the
laptop records the attempt as preempted (not failed), keeps the noticed node (processes and
watchdog) until that checkpoint is in the bucket (the drain, recorded with how much of the notice
it used), only then replaces it, and the run resumes from that very step: nothing recomputed.
In one run: the notice on a worker, then on the head (rank 0's node, where the checkpoint is made).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.local import LocalFleet
from launch.fleets.local.bucket import have_moto
from launch.fleets.local.spot import serve_notice
from tests.conftest import (
    REPO,
    assert_nothing_running,
    fleet_prefix,
    fleet_subnet,
    module_fleet,
    needs_root,
    write_playbook,
)
from tests.faultkit import run_with_fault, wait_for
from tests.recovery_helpers import attempts_of, run_dirs, step_reached

pytestmark = needs_root()
PREFIX = fleet_prefix("w")


@pytest.fixture(scope="module")
def fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    if not have_moto():
        pytest.skip("moto[server] is not installed (pip install -e '.[dev]')")
    with module_fleet(PREFIX, fleet_subnet(17), 2, bucket=True, spot_notices=True) as made:
        yield made


def bucket_keys(fleet: LocalFleet, prefix: str) -> list[str]:
    """The keys under ``prefix`` in the fleet's own bucket (as its inventory names it)."""
    import boto3

    from launch.fleets.local.bucket import fleet_secret
    from launch.fleets.local.s3_server import ACCESS_KEY

    ref: Any = fleet.inventory().fleet
    client = boto3.client(
        "s3",
        endpoint_url=ref.s3_endpoint,
        aws_access_key_id=ACCESS_KEY,  # the fleet's own key: the server refuses any other
        aws_secret_access_key=fleet_secret(fleet.state_dir),
        region_name="us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def attempt_steps(fleet: LocalFleet, attempt: int, old: set[Path]) -> list[int]:
    """The steps rank 0 (wherever it runs) logged in ``attempt`` of the run not in ``old``."""
    steps = []
    for run_dir in run_dirs(fleet) - old:
        for path in run_dir.glob("metrics.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if "event" not in entry and entry.get("attempt") == attempt and "step" in entry:
                    steps.append(int(entry["step"]))
    return steps


def test_spot_notices_on_a_worker_then_on_the_head_drain_then_resume_from_their_checkpoints(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """One run, three attempts (one launch and wrap-up fewer than a run per notice): a notice on
    the worker in attempt 1 (rank 0's checkpoint is made and uploaded on the other node), then on
    the head in attempt 2 (made and uploaded on the noticed node itself, and the bucket already
    holds attempt 1's pointer, which must not pass for the notice's checkpoint)."""
    book = write_playbook(
        tmp_path / "job.yaml",
        REPO / "tests" / "recovery_job",
        name="t-drain",
        nodes=2,
        entrypoint="python ckpt_trainer.py --steps 45 --ckpt-every 5 --step-sleep 0.25",
        recovery={"max_restarts": 2, "grace_s": 10, "confirm_s": 2},
        stop={"watcher_lost_after_s": 300},
    )
    old = run_dirs(fleet)
    worker, head = fleet.node_name(1), fleet.node_name(0)
    noticed_at: list[int] = []
    # the bucket's keys once the next attempt runs: later uploads drop steps past keep (3)
    seen: list[list[str]] = []

    def notices() -> None:
        wait_for(lambda: step_reached(fleet, 8, old), 120, "step 8")
        serve_notice(fleet, worker, 120)
        noticed_at.append(8)
        # attempt 2 has resumed and trained a few steps: the head's turn
        wait_for(lambda: len(attempt_steps(fleet, 2, old)) >= 3, 300, "3 steps of attempt 2")
        seen.append(bucket_keys(fleet, "runs/"))
        noticed_at.append(max(attempt_steps(fleet, 2, old)))
        serve_notice(fleet, head, 120)
        wait_for(lambda: bool(attempt_steps(fleet, 3, old)), 300, "a step of attempt 3")
        seen.append(bucket_keys(fleet, "runs/"))

    result = run_with_fault(book, fleet, notices)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    assert [a["outcome"] for a in attempts] == ["preempted", "preempted", "succeeded"], attempts
    for i, node in enumerate((worker, head)):
        ended, resumed = attempts[i], attempts[i + 1]
        assert ended["loss"] == "preempted" and ended["replaced"] == [node], ended
        (drained,) = ended["drained"]
        # the node was kept until the checkpoint the notice asked for was in the bucket, then replaced
        assert drained["node"] == node and drained["ended"] == "durable", drained
        step = drained["step"]
        assert step >= noticed_at[i], f"a checkpoint made after the notice: {attempts}"
        assert 100 <= drained["notice_s"] <= 120 and 0 < drained["used_s"] < drained["notice_s"], drained
        assert "drain" in resumed["recovery_s"], resumed
        assert f"runs/{result.run_id}/checkpoints/step-{step}/MANIFEST.json" in seen[i], seen[i]
        # the run resumed from that very step: nothing recomputed
        assert resumed["first_step"] == step + 1 and resumed["steps_recomputed"] == 0, attempts
    assert_nothing_running(fleet, nodes=2)


# -- the head lost with a bucket, its newest upload under way (issue 33) --------------------------


def saves_recorded(fleet: LocalFleet, i: int, old: set[Path]) -> list[int]:
    """The steps rank 0 recorded saving (``checkpoint_saved``) in node i's run directory."""
    steps = []
    for run_dir in set(Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs").glob("*")) - old:
        for line in (
            (run_dir / "metrics.jsonl").read_bytes().splitlines()
            if (run_dir / "metrics.jsonl").exists()
            else []
        ):
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(entry, dict) and entry.get("event") == "checkpoint_saved":
                steps.append(int(entry["step"]))
    return steps


def complete_steps(fleet: LocalFleet, i: int, old: set[Path]) -> list[int]:
    """The complete checkpoints (a manifest in place) node i holds for the new run."""
    home = Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs")
    return [
        int(p.parent.name[5:])
        for r in set(home.glob("*")) - old
        for p in r.glob("checkpoints/step-*/MANIFEST.json")
    ]


def test_head_lost_right_after_a_save_with_a_bucket_resumes_from_that_save(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """With a bucket, rank 0's newest save used to live on its node only until its upload ended
    (several ``aws`` calls): a head lost meanwhile resumed from the bucket's previous step. Here
    rank 0's uploads never get through (its node's packets to the bucket are dropped: an upload
    slower than the peer copy), and its node is lost (link down, then every process killed) 0.5 s
    after a save of step 10 or later, once that save's second copy exists: the run resumes from
    that very save, from the peer copy made with a bucket too, at most one interval recomputed."""
    from launch.fleets.local.power import replace_node
    from launch.transport.reachability import sshd_answers

    for host in fleet.inventory().hosts:  # the notice test replaced nodes: each answers
        if not sshd_answers(host, 3.0):
            replace_node(fleet, host)
    ref: Any = fleet.inventory().fleet
    endpoint = ref.s3_endpoint.removeprefix("http://")
    address, port = endpoint.rsplit(":", 1)
    book = write_playbook(
        tmp_path / "job.yaml",
        REPO / "tests" / "recovery_job",
        name="t-head-bucket",
        nodes=2,
        entrypoint="python ckpt_trainer.py --steps 30 --ckpt-every 5 --step-sleep 0.8",
        recovery={"max_restarts": 2, "grace_s": 2, "confirm_s": 2},
        stop={"unreachable_timeout_s": 6, "watcher_lost_after_s": 300},
    )
    old = run_dirs(fleet)
    drop = ["-p", "tcp", "-d", address, "--dport", port, "-j", "DROP"]
    lost: dict[str, int] = {}

    def rank0() -> int | None:
        for i in range(2):
            home = Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs")
            if any(p.stat().st_size for r in set(home.glob("*")) - old for p in r.glob("metrics.jsonl")):
                return i
        return None

    def lose_the_head_after_a_save() -> None:
        wait_for(lambda: rank0() is not None, 120, "rank 0's first metrics")
        head = rank0()
        assert head is not None
        other = 1 - head
        netns = ["ip", "netns", "exec", fleet.netns(head), "iptables"]
        subprocess.run([*netns, "-I", "OUTPUT", *drop], check=True)
        try:
            wait_for(
                lambda: max(saves_recorded(fleet, head, old), default=0) >= 10, 180, "a save of step 10+"
            )
            saved = max(saves_recorded(fleet, head, old))
            time.sleep(0.5)  # the fault 0.5 s after the save...
            # ...or once its second copy exists, if later: a copy takes seconds on a loaded machine
            wait_for(lambda: max(complete_steps(fleet, other, old), default=0) >= saved, 120, "its peer copy")
            lost["saved"] = saved
            lost["copied"] = max(complete_steps(fleet, other, old))
            lost["head"] = head
            key = fleet.node_dir(head) / "ssh_host_ed25519_key.pub"
            before = key.stat().st_mtime_ns
            subprocess.run(["ip", "link", "set", fleet.veth(head), "down"], check=True)
            fleet.stop_node(head)
        finally:
            subprocess.run([*netns, "-D", "OUTPUT", *drop], check=False)

        def replaced() -> bool:
            try:
                return key.stat().st_mtime_ns != before
            except OSError:
                return False

        try:  # the link comes back for the new machine fleetrun puts in its place
            wait_for(replaced, 300, "the replacement of the lost head")
        finally:
            subprocess.run(["ip", "link", "set", fleet.veth(head), "up"], check=False)

    try:
        result = run_with_fault(book, fleet, lose_the_head_after_a_save)
    finally:
        for i in range(2):
            subprocess.run(["ip", "link", "set", fleet.veth(i), "up"], check=False)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    lost_node = fleet.node_name(lost["head"])
    assert attempts[0]["loss"] == "node_lost" and attempts[0]["replaced"] == [lost_node], attempts[0]
    story = attempts[1]["resumed_from"]
    # the newest save before the fault (or a newer one whose copy landed as the link went down),
    # from the peer copy: no upload of rank 0's ever ended
    resumed = attempts[1]["first_step"] - 1
    assert resumed >= lost["saved"], (lost, attempts[1])
    assert f"step {resumed} from {fleet.node_name(1 - lost['head'])} (a peer copy)" in story, story
    assert 0 <= attempts[1]["steps_recomputed"] <= 5, attempts
    assert_nothing_running(fleet, nodes=2)
