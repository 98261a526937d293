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
