"""A preemption notice with the laptop watching and ``recovery:`` on (issue 11), on a real 2-node
local fleet: a metadata server of our own at 169.254.169.254 in node 1's namespace (real HTTP, the
IMDSv2 token flow, ``tests/metadataserver.py``) announces the spot interruption; node 1's watchdog
SIGTERMs its rank, every rank checkpoints at the next step and exits, node 1 reports ``preempted``;
the laptop records the attempt as preempted (not failed), replaces node 1 with a fresh node and
resumes from the checkpoint made after the notice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
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
from tests.recovery_helpers import (
    attempts_of,
    metadata_server,
    run_dirs,
    step_reached,
    update_fleet_state,
)

pytestmark = needs_root()
PREFIX = fleet_prefix("w")


@pytest.fixture(scope="module")
def setup(fleetrun_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFleet, Path]]:
    control = tmp_path_factory.mktemp("metadata")
    with module_fleet(PREFIX, fleet_subnet(17), 2) as fleet:
        update_fleet_state(fleet, preemption_poller="ec2-imdsv2")
        with metadata_server(fleet, 1, control):
            yield fleet, control


def test_preempted_attempt_is_recorded_and_resumed(setup: tuple[LocalFleet, Path], tmp_path: Path) -> None:
    fleet, control = setup
    book = write_playbook(
        tmp_path / "job.yaml",
        REPO / "tests" / "recovery_job",
        name="t-recover-pre",
        nodes=2,
        entrypoint="python ckpt_trainer.py --steps 45 --ckpt-every 5 --step-sleep 0.25",
        recovery={"max_restarts": 1, "grace_s": 10, "confirm_s": 2},
        stop={"watcher_lost_after_s": 300},
    )
    old = run_dirs(fleet)

    def notice() -> None:
        wait_for(lambda: step_reached(fleet, 12, old), 120, "step 12")
        (control / "notice").touch()

    result = run_with_fault(book, fleet, notice)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    node1 = fleet.node_name(1)
    assert [a["outcome"] for a in attempts] == ["preempted", "succeeded"], attempts
    assert attempts[0]["loss"] == "preempted" and attempts[0]["replaced"] == [node1], attempts[0]
    assert attempts[1]["first_step"] > 12, "resumed from the checkpoint made after the notice"
    assert 0 <= attempts[1]["steps_recomputed"] <= 1, attempts
    assert_nothing_running(fleet, nodes=2)
