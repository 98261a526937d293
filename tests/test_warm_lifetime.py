"""The cloud's lifetime of a kept-warm fleet, as the laptop keeps it (``launch.run.warm``,
``launch.run.warm_lifetime``): armed at the deadline when the fleet is kept warm, disarmed when
a run of this laptop reuses the fleet (and armed anew at that run's end), removed with the fleet
by the teardown, and never for lab machines or the local fleet. The cloud is a fake recording
the calls; the clock is the tests' ``FakeClock`` (no wall time is read or waited on)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launch.errors import FleetrunError
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.base import Say, TeardownOutcome, TeardownState
from launch.fleets.kinds.lab import LabKind
from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LabFleet, LocalFleetRef, StackFleetRef
from launch.fleets.kinds.stack import StackKind
from launch.fleets.stack_lifetime import StackLifetime
from launch.rules.stoprules import Teardown
from launch.run import lifecycle, warm, warm_lifetime
from launch.run.records import RunRecords
from tests.fakefleet import FakeClock, FakeFleet, JobScript, fake_inventory

KEEP_WARM_S = 600.0
STACK = StackFleetRef(stack="dev", cluster_id="fr-dev-0a1b2c", cloud="gcp")


class FakeLifetime:
    """The cloud: records what the laptop armed and disarmed; ``fail`` makes the next call refuse."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail: str | None = None

    def arm(self, until: float, say: Say) -> str:
        self.calls.append(("arm", until))
        if self.fail:
            raise FleetrunError(self.fail)
        return f"the cloud ends the instances at {until:.0f}"

    def disarm(self, say: Say) -> None:
        self.calls.append(("disarm",))
        if self.fail:
            raise FleetrunError(self.fail)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> FakeLifetime:
    fake = FakeLifetime()
    monkeypatch.setattr(StackKind, "lifetime", lambda self: fake)
    return fake


@dataclass
class Teardowns:
    """The stack's teardown: what it returns (the last of ``results``) and each time it was asked."""

    results: list[TeardownOutcome] = field(
        default_factory=lambda: [TeardownOutcome(TeardownState.DONE, "stack dev destroyed")]
    )
    asked: int = 0


@pytest.fixture
def teardowns(monkeypatch: pytest.MonkeyPatch) -> Teardowns:
    recorded = Teardowns()

    def fake_tear_down(self: StackKind, say: Say) -> TeardownOutcome:
        recorded.asked += 1
        return recorded.results[-1]

    monkeypatch.setattr(StackKind, "tear_down", fake_tear_down)
    return recorded


def keep(inventory: Any, owner: str, folder: Path, clock: FakeClock, said: list[str]) -> TeardownOutcome:
    folder.mkdir(parents=True, exist_ok=True)
    port = FakeFleet(inventory.hosts, JobScript(), clock)
    return warm.keep_warm(
        port,
        inventory,
        owner,
        folder,
        Teardown.ALWAYS,
        KEEP_WARM_S,
        said.append,
        now=clock.time(),
        start_timer=False,
    )


def test_keeping_a_cloud_fleet_warm_arms_its_lifetime_at_the_deadline(
    tmp_path: Path, home: Path, cloud: FakeLifetime
) -> None:
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    outcome = keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    until = clock.now + KEEP_WARM_S + warm_lifetime.GRACE_S
    assert cloud.calls == [("arm", until)]
    entry = warm.WarmEntry.load(warm.entry_path(inventory))
    assert (
        entry.deadline == clock.now + KEEP_WARM_S
        and entry.lifetime == f"the cloud ends the instances at {until:.0f}"
    )
    kept = json.loads((tmp_path / "run-a" / warm.RESULT_FILE).read_text())
    assert kept["lifetime"] == entry.lifetime and kept["state"] == "warm"
    # the run's record says what the cloud will do (summary.json's teardown, fab runs)
    assert outcome.state is TeardownState.SKIPPED and outcome.message.endswith(f"; and {entry.lifetime}")
    assert f"  instance lifetime: {entry.lifetime}" in said


def test_a_reuse_disarms_it_and_that_runs_end_arms_the_new_deadline(
    tmp_path: Path, home: Path, cloud: FakeLifetime
) -> None:
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    clock.sleep(120)  # the next run on the same fleet, by this laptop, before the deadline
    warm.claim(inventory, "run-b", said.append)
    assert cloud.calls[1:] == [("disarm",)]
    assert warm.WarmEntry.load(warm.entry_path(inventory)).lifetime is None
    kept = json.loads((tmp_path / "run-a" / warm.RESULT_FILE).read_text())
    assert kept["lifetime_state"] == "disarmed" and kept["lifetime_disarmed_by"] == "run-b"
    warm.claim(inventory, "run-c", said.append)  # a sweep's next variant: nothing left to disarm
    assert cloud.calls[1:] == [("disarm",)]
    clock.sleep(3600)  # run-b ran past run-a's deadline, then keeps the fleet warm in turn
    keep(inventory, "run-b", tmp_path / "run-b", clock, said)
    assert cloud.calls[2:] == [("arm", clock.now + KEEP_WARM_S + warm_lifetime.GRACE_S)]
    assert warm.WarmEntry.load(warm.entry_path(inventory)).owner == "run-b"


def test_a_lifetime_that_cannot_be_disarmed_refuses_the_run(
    tmp_path: Path, home: Path, cloud: FakeLifetime
) -> None:
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    cloud.fail = "pulumi up: another update of this stack is running"
    with pytest.raises(
        FleetrunError, match="could not be disarmed .*another update.* this run would be cut off"
    ):
        warm.claim(inventory, "run-b", said.append)
    assert warm.WarmEntry.load(warm.entry_path(inventory)).lifetime is not None  # still armed, still said


def test_a_run_start_claims_the_fleet_before_it_is_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``start_run`` asks ``warm.claim`` first: a refusal there records no run."""
    claimed: list[str] = []

    def refuse(inventory: Any, run_id: str, say: Say) -> None:
        claimed.append(run_id)
        raise FleetrunError("not disarmed")

    monkeypatch.setattr(warm, "claim", refuse)
    records = SimpleNamespace(start=lambda **_: pytest.fail("the run was recorded before its claim"))
    with pytest.raises(FleetrunError, match="not disarmed"):
        lifecycle.start_run(
            SimpleNamespace(),  # type: ignore[arg-type]
            SimpleNamespace(run_id="run-b"),  # type: ignore[arg-type]
            fake_inventory(2, fleet=STACK),
            tmp_path / "playbook.yaml",
            records,  # type: ignore[arg-type]
            SimpleNamespace(say=lambda *parts: None),  # type: ignore[arg-type]
            SimpleNamespace(),  # type: ignore[arg-type]
            known_hosts=tmp_path / "known_hosts",
        )
    assert claimed == ["run-b"]


def test_the_teardown_at_the_deadline_removes_it_with_the_fleet(
    tmp_path: Path, home: Path, cloud: FakeLifetime, teardowns: Teardowns
) -> None:
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    path = warm.entry_path(inventory)
    with RunRecords(home / "runs.db") as records:
        outcome = warm.enforce(path, records, said.append, now=clock.now + KEEP_WARM_S)
    assert outcome is not None and outcome.state is TeardownState.DONE and teardowns.asked == 1
    assert cloud.calls == [
        ("arm", clock.now + KEEP_WARM_S + warm_lifetime.GRACE_S)
    ]  # destroyed, not disarmed
    kept = json.loads((tmp_path / "run-a" / warm.RESULT_FILE).read_text())
    assert kept["state"] == "torn_down" and kept["lifetime_state"] == "removed with the fleet"


def test_a_failed_teardown_leaves_the_lifetime_armed_and_says_so(
    tmp_path: Path, home: Path, cloud: FakeLifetime, teardowns: Teardowns
) -> None:
    teardowns.results.append(TeardownOutcome(TeardownState.FAILED, "pulumi destroy failed"))
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    with RunRecords(home / "runs.db") as records:
        warm.enforce(warm.entry_path(inventory), records, said.append, now=clock.now + KEEP_WARM_S)
    assert cloud.calls[1:] == []  # never disarmed: it is the backstop now
    assert json.loads((tmp_path / "run-a" / warm.RESULT_FILE).read_text())["lifetime_state"] == "still armed"
    assert any(line.startswith("  the cloud still ends the instances: the cloud ends") for line in said)


def test_a_claim_found_at_the_deadline_disarms_a_lifetime_still_armed(
    tmp_path: Path, home: Path, cloud: FakeLifetime, teardowns: Teardowns
) -> None:
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    with RunRecords(home / "runs.db") as records:
        records.start(run_id="run-b", inventory=inventory.to_yaml_data(), started_at=clock.now + 5)
        assert (
            warm.enforce(warm.entry_path(inventory), records, said.append, now=clock.now + KEEP_WARM_S)
            is None
        )
    assert cloud.calls[1:] == [("disarm",)] and teardowns.asked == 0


def test_an_arming_refused_by_the_cloud_is_said_and_the_fleet_still_kept_warm(
    tmp_path: Path, home: Path, cloud: FakeLifetime
) -> None:
    cloud.fail = "AccessDeniedException: scheduler:CreateSchedule"
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=STACK)
    outcome = keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    assert outcome.state is TeardownState.SKIPPED and "; and" not in outcome.message
    assert warm.WarmEntry.load(warm.entry_path(inventory)).lifetime is None
    assert any("could not arm the instances' lifetime in the cloud (AccessDenied" in line for line in said)


def test_lab_machines_and_the_local_fleet_never_get_a_lifetime(tmp_path: Path, home: Path) -> None:
    assert LabKind(LabFleet()).lifetime() is None
    assert LocalFleetKind(LocalFleetRef(prefix="frd1")).lifetime() is None
    assert (
        StackKind(StackFleetRef(cluster_id="fr-dev-0a1b2c", cloud="aws")).lifetime() is None
    )  # no stack name
    clock, said = FakeClock(), []
    inventory = fake_inventory(2, fleet=LocalFleetRef(prefix="frd1"))
    keep(inventory, "run-a", tmp_path / "run-a", clock, said)
    assert warm.WarmEntry.load(warm.entry_path(inventory)).lifetime is None
    assert not any("lifetime" in line for line in said)


@pytest.mark.parametrize("cloud_name", ["aws", "gcp"])
def test_a_stack_arms_through_fleet_warm_until_rounded_up_to_the_minute(cloud_name: str) -> None:
    updates: list[tuple[str, str | None]] = []
    kind = StackKind(StackFleetRef(stack="dev", cluster_id="fr-dev-0a1b2c", cloud=cloud_name))
    assert isinstance(kind.lifetime(), StackLifetime)
    lifetime = StackLifetime("dev", CLOUDS[cloud_name], update=lambda s, v, say: updates.append((s, v)))
    armed = lifetime.arm(1_795_899_830.0, lambda _: None)  # 2026-11-28T21:03:50Z
    lifetime.disarm(lambda _: None)
    assert updates == [("dev", "2026-11-28T21:04:00Z"), ("dev", None)]
    assert (
        armed.startswith("at 2026-11-28T21:04:00Z a")
        and ("EventBridge" if cloud_name == "aws" else "Cloud Scheduler") in armed
    )
