"""Every command ends a run the same way (the fake fleet, no root).

{``fab train``, a ``fab sweep`` variant, ``fab watch`` re-attached mid-run, ``fab pull``} x
{succeeded, failed, kept warm then claimed, kept warm with the laptop gone}: the same teardown
outcome, the same keep-warm timers on the nodes, the same laptop ledger and the same record of
how the fleet finally went, for the same playbook. Only the transport and the clock are fakes;
the local fleet's teardown is recorded instead of run (it needs root).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LocalFleetRef
from launch.job.spec import load_job_spec
from launch.rules.stoprules import Teardown
from launch.run import lifecycle, warm
from launch.run.records import RunRecords
from launch.run.reporter import RecordingReporter
from tests.fakefleet import FakeClock, JobScript, NodeScript, fake_inventory, run_on_fake_fleet

COMMANDS = ("train", "sweep", "watch", "pull")
ENDINGS = ("succeeded", "failed", "warm_claimed", "laptop_gone")
KEEP_WARM_S = 60.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``FLEETRUN_HOME`` here: the runs database the ledger's claims are read from is the tests'."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))
    monkeypatch.setenv("FLEETRUN_RUNS", str(tmp_path / "runs"))
    return tmp_path


@pytest.fixture
def teardowns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_tear_down(self: LocalFleetKind, say: Any) -> TeardownOutcome:
        calls.append(self.ref.prefix)
        return TeardownOutcome(TeardownState.DONE, f"local fleet {self.ref.prefix} removed")

    monkeypatch.setattr(LocalFleetKind, "tear_down", fake_tear_down)
    return calls


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The laptop-side timers started (a detached process each, outside the tests)."""
    started: list[Path] = []
    monkeypatch.setattr(warm, "start_backstop", started.append)
    return started


def inventory() -> Any:
    return fake_inventory(2, fleet=LocalFleetRef(prefix="frend"))


def playbook_of(ending: str) -> dict[str, Any]:
    """One playbook per ending: its teardown, its keep-warm, and whether the job fails."""
    warm_too = ending in ("warm_claimed", "laptop_gone")
    return {
        "teardown": "on_success" if ending == "failed" else "always",
        "keep_warm_s": KEEP_WARM_S if warm_too else None,
        "job": JobScript(steps=6, nodes={"n1": NodeScript(exit_at_step=4)} if ending == "failed" else {}),
    }


@dataclass
class Ended:
    teardown: TeardownOutcome
    folder: Path
    """Where the fleet's end is recorded: the run's folder (the sweep's, for a sweep)."""
    fleet: Any
    record_state: str


def end_by_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> Ended:
    book = playbook_of(ending)
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, book["job"], inventory=inventory(), teardown=book["teardown"],
        keep_warm_s=book["keep_warm_s"],
    )  # fmt: skip
    record = run.records.get("fake-run-1")
    return Ended(run.summary.teardown, run.folder, run.fleet, record.state)


def end_by_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> Ended:
    """A variant runs as ``fab sweep`` starts it (``--teardown never``); the sweep's end decides."""
    book = playbook_of(ending)
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, book["job"], inventory=inventory(), teardown="never",
        keep_warm_s=book["keep_warm_s"],
    )  # fmt: skip
    assert run.summary.teardown.state is TeardownState.SKIPPED and "kept warm" not in str(
        run.summary.teardown
    )
    assert run.playbook is not None
    spec = load_job_spec(run.playbook).model_copy(update={"teardown": Teardown(book["teardown"])})
    sweep_folder = tmp_path / "sweeps" / "sw-1"
    sweep_folder.mkdir(parents=True)
    teardown = lifecycle.end_sweep(
        inventory(), spec, run.summary.ok, "sw-1", sweep_folder, lambda _m: None, port=run.fleet
    )
    record = run.records.get("fake-run-1")
    return Ended(teardown, sweep_folder, run.fleet, record.state)


def end_by_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> Ended:
    """The watcher goes away mid-run (Ctrl-C, keep it running); ``fab watch`` re-attaches."""
    import tests.fakefleet as fakefleet

    book = playbook_of(ending)
    fleets: list[Any] = []
    real = fakefleet.FakeFleet

    def keep(*args: Any, **kwargs: Any) -> Any:
        fleets.append(real(*args, **kwargs))
        return fleets[-1]

    monkeypatch.setattr(fakefleet, "FakeFleet", keep)
    clock = FakeClock()
    clock.interrupt_at = clock.now + 6
    with pytest.raises(KeyboardInterrupt):
        run_on_fake_fleet(
            tmp_path, monkeypatch, book["job"], inventory=inventory(), teardown=book["teardown"],
            keep_warm_s=book["keep_warm_s"], clock=clock, ask_keep_running=lambda _run_id: True,
        )  # fmt: skip
    fleet = fleets[0]
    assert fleet.step < 4, "detached before the job ended"
    records = RunRecords(tmp_path / "runs.db")
    records.update("fake-run-1", watcher_pid=0)  # the watcher is gone
    record = records.get("fake-run-1")
    assert record is not None and record.state == "running"
    summary = lifecycle.reattach(
        records, record, RecordingReporter(), poll_interval=5.0, port=fleet, transfers=fleet.transfers(),
        clock=clock,
    )  # fmt: skip
    ended = records.get("fake-run-1")
    assert ended is not None
    return Ended(summary.teardown, summary.folder, fleet, ended.state)


def end_by_pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> Ended:
    """A pull fails, which blocks the teardown; ``fab pull`` then gets everything and ends it."""
    book = playbook_of(ending)
    job = book["job"]
    job.nodes.setdefault("n0", NodeScript()).fail_pull = True
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, job, inventory=inventory(), teardown=book["teardown"],
        keep_warm_s=book["keep_warm_s"],
    )  # fmt: skip
    assert run.summary.teardown.state is (
        TeardownState.SKIPPED if ending == "failed" else TeardownState.BLOCKED
    ), run.summary.teardown
    assert not any("fleetrun_warm.py" in c for n in run.fleet.nodes.values() for c in n.commands)
    job.nodes["n0"].fail_pull = False
    record = run.records.get("fake-run-1")
    pulled = lifecycle.pull_again(
        run.records, record, RecordingReporter(), port=run.fleet, transfers=run.fleet.transfers()
    )
    assert pulled.pull_errors == {}, pulled.pull_errors  # every run directory came back this time
    return Ended(pulled.teardown, run.folder, run.fleet, record.state)


END_BY = {"train": end_by_train, "sweep": end_by_sweep, "watch": end_by_watch, "pull": end_by_pull}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_ends_a_run_the_same_way(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    teardowns: list[str],
    timers: list[Path],
    command: str,
    ending: str,
) -> None:
    ended = END_BY[command](tmp_path, monkeypatch, ending)
    assert ended.record_state == ("failed" if ending == "failed" else "succeeded")
    armed = {name: node.warm_timers for name, node in ended.fleet.nodes.items()}
    ledger = sorted(warm.ledger().glob("*.json")) if warm.ledger().is_dir() else []
    if ending == "succeeded":
        assert ended.teardown.state is TeardownState.DONE and teardowns == ["frend"]
        assert armed == {"n0": [], "n1": []} and ledger == [] and timers == []
        return
    if ending == "failed":
        assert ended.teardown.state is TeardownState.SKIPPED and "on_success" in ended.teardown.message
        assert teardowns == [] and ledger == [] and timers == []
        return
    # kept warm: no teardown now; each node's timer, the laptop's deadline and its timer armed
    assert ended.teardown.state is TeardownState.SKIPPED, ended.teardown
    assert ended.teardown.message.startswith("kept warm for 60 s instead (teardown: always)")
    assert teardowns == [] and armed == {"n0": ["60"], "n1": ["60"]}
    assert len(ledger) == 1 and timers == ledger
    entry = warm.WarmEntry.load(ledger[0])
    assert entry.deadline == entry.armed_at + KEEP_WARM_S and entry.record_dir == ended.folder
    kept = json.loads((ended.folder / warm.RESULT_FILE).read_text())
    assert kept["state"] == "warm" and kept["deadline"] == entry.deadline
    say: list[str] = []
    warm.enforce_due(say.append, now=entry.deadline - 1)  # a command before the deadline
    assert teardowns == [] and ledger[0].exists()
    records = RunRecords(home / "runs.db")
    if ending == "warm_claimed":
        # the next run on the fleet, recorded by this laptop, claims it: the deadline stands down
        records.start(run_id="next-run", inventory=inventory().to_yaml_data(), started_at=entry.armed_at + 5)
        assert warm.enforce(ledger[0], records, say.append, now=entry.deadline) is None
        assert teardowns == [] and not ledger[0].exists()
        assert json.loads((ended.folder / warm.RESULT_FILE).read_text())["claimed_by"] == "next-run"
        return
    # the laptop was gone at the deadline (its timer never ran): the next command tears down
    warm.enforce_due(say.append, now=entry.deadline + 1)
    assert teardowns == ["frend"] and not ledger[0].exists()
    kept = json.loads((ended.folder / warm.RESULT_FILE).read_text())
    assert kept["state"] == "torn_down" and kept["teardown"]["state"] == "done"
    if command != "sweep":  # a sweep has no summary.json of its own
        summary = json.loads((ended.folder / "summary.json").read_text())
        assert summary["teardown"]["state"] == "done" and summary["kept_warm"] is True


# -- the laptop's keepers of the deadline ----------------------------------------------------------
def ledger_entry(folder: Path, armed_at: float, seconds: float = KEEP_WARM_S, owner: str = "run-a") -> Path:
    entry = warm.WarmEntry(owner, inventory(), armed_at, armed_at + seconds, folder)
    path = warm.entry_path(entry.inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry.to_json()))
    return path


def test_any_later_command_tears_down_a_fleet_past_its_deadline(
    tmp_path: Path, home: Path, teardowns: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from launch.cli.edge import keep_warm_deadlines
    from launch.settings import Settings

    keep_warm_deadlines(Settings.from_env())  # no ledger: nothing to do
    path = ledger_entry(tmp_path, armed_at=1_000.0)  # long past
    keep_warm_deadlines(Settings.from_env())
    assert teardowns == ["frend"] and not path.exists()
    assert "the warm fleet of run-a is past its deadline: tearing it down" in capsys.readouterr().err
    assert json.loads((tmp_path / warm.RESULT_FILE).read_text())["state"] == "torn_down"


def test_a_ledger_file_fleetrun_did_not_write_is_said_and_removed(
    tmp_path: Path, home: Path, teardowns: list[str]
) -> None:
    bad = warm.ledger() / "0123456789abcdef.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        '{"owner": "x", "inventory": {"hosts": []}, "armed_at": 1, "deadline": 2, "record_dir": "/"}'
    )
    said: list[str] = []
    warm.enforce_due(said.append)
    assert teardowns == [] and not bad.exists()
    assert len(said) == 1 and "is not a warm fleet fleetrun wrote" in said[0]


def test_the_laptop_timer_steps_aside_for_a_later_arming(
    tmp_path: Path, home: Path, teardowns: list[str], timers: list[Path]
) -> None:
    import time

    path = ledger_entry(tmp_path, armed_at=time.time(), seconds=3600)
    later = tmp_path / "later"
    later.mkdir()

    def rearmed(_seconds: float) -> None:  # while the first timer sleeps, a later run re-arms
        ledger_entry(later, armed_at=time.time() - 7200, seconds=1, owner="run-b")

    assert warm.backstop(path, sleep=rearmed) == 0
    assert teardowns == [], "the later arming's own timer keeps its deadline"
    assert warm.WarmEntry.load(path).owner == "run-b"


def test_the_laptop_timer_tears_down_at_its_deadline(
    tmp_path: Path, home: Path, teardowns: list[str]
) -> None:
    path = ledger_entry(tmp_path, armed_at=1_000.0)
    assert warm.backstop(path, sleep=lambda _s: None) == 0
    assert teardowns == ["frend"] and not path.exists()
