"""A spot notice with the laptop watching and ``recovery:`` on (issues 11 and 19), on a real 2-node
local fleet made as a user makes it: ``local.up --bucket --spot`` (the fleet's own S3-compatible
server as the nodes' bucket, a metadata endpoint at 169.254.169.254 inside every node's namespace)
and ``local.preempt``'s notice (EC2's IMDSv2 flow, the node taken 120 s later).

The noticed node's watchdog flags every rank, which checkpoints at its next step and uploads; the
laptop records the attempt as preempted (not failed), keeps the noticed node (processes and
watchdog) until that checkpoint is in the bucket (the drain, recorded with how much of the notice
it used), only then replaces it, and the run resumes from that very step: nothing recomputed.
Once with the notice on a worker, once on the head (rank 0's node, where the checkpoint is made).
"""

from __future__ import annotations

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

    ref: Any = fleet.inventory().fleet
    client = boto3.client(
        "s3",
        endpoint_url=ref.s3_endpoint,
        aws_access_key_id="fleetrun-test",
        aws_secret_access_key="fleetrun-test",
        region_name="us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@pytest.mark.parametrize("noticed", [1, 0], ids=["worker", "head"])
def test_a_spot_notice_drains_the_node_then_resumes_from_its_checkpoint(
    fleet: LocalFleet, noticed: int, tmp_path: Path
) -> None:
    book = write_playbook(
        tmp_path / "job.yaml",
        REPO / "tests" / "recovery_job",
        name=f"t-drain-{noticed}",
        nodes=2,
        entrypoint="python ckpt_trainer.py --steps 30 --ckpt-every 5 --step-sleep 0.25",
        recovery={"max_restarts": 1, "grace_s": 10, "confirm_s": 2},
        stop={"watcher_lost_after_s": 300},
    )
    old = run_dirs(fleet)
    node = fleet.node_name(noticed)

    def notice() -> None:
        wait_for(lambda: step_reached(fleet, 12, old), 120, "step 12")
        serve_notice(fleet, node, 120)

    result = run_with_fault(book, fleet, notice)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    assert [a["outcome"] for a in attempts] == ["preempted", "succeeded"], attempts
    assert attempts[0]["loss"] == "preempted" and attempts[0]["replaced"] == [node], attempts[0]
    (drained,) = attempts[0]["drained"]
    # the node was kept until the checkpoint the notice asked for was in the bucket, then replaced
    assert drained["node"] == node and drained["ended"] == "durable", drained
    step = drained["step"]
    assert step >= 12, f"a checkpoint made after the notice: {attempts}"
    assert 100 <= drained["notice_s"] <= 120 and 0 < drained["used_s"] < drained["notice_s"], drained
    assert "drain" in attempts[1]["recovery_s"], attempts[1]
    keys = bucket_keys(fleet, f"runs/{result.run_id}/checkpoints/step-{step}/")
    assert any(k.endswith("MANIFEST.json") for k in keys), keys
    # the run resumed from that very step: nothing recomputed
    assert attempts[1]["first_step"] == step + 1 and attempts[1]["steps_recomputed"] == 0, attempts
    assert_nothing_running(fleet, nodes=2)
