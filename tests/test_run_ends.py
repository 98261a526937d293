"""Every command ends a run the same way (the fake fleet, no root).

{``fab train``, a ``fab sweep`` variant, ``fab watch`` re-attached mid-run, ``fab pull``} x
{succeeded, failed, kept warm then claimed, kept warm with the laptop gone}: the same teardown
outcome, the same keep-warm timers on the nodes, the same laptop ledger and the same record of
how the fleet finally went, for the same playbook. Only the transport and the clock are fakes;
the local fleet's teardown is recorded instead of run (it needs root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LocalFleetRef
from launch.rules.stoprules import Teardown
from launch.run import lifecycle, sweeps, warm
from launch.run.records import RunRecords
from launch.run.reporter import RecordingReporter
from tests.fakefleet import FakeClock, JobScript, NodeScript, fake_inventory, run_on_fake_fleet

COMMANDS = ("train", "sweep", "watch", "pull")
ENDINGS = ("succeeded", "failed", "warm_claimed", "laptop_gone")
KEEP_WARM_S = 60.0
HOOK = 'echo "$FLEETRUN_OUTCOME" >> "$FLEETRUN_RUN_DIR/hook-ran"'
"""The playbook's on_end: it leaves the outcome it was told, once per time it ran."""


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
        "on_end": [HOOK],
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
        keep_warm_s=book["keep_warm_s"], on_end=book["on_end"],
    )  # fmt: skip
    record = run.records.get("fake-run-1")
    return Ended(run.summary.teardown, run.folder, run.fleet, record.state)


def sweep_file(home: Path, sweep_id: str, variants: list[dict[str, Any]], *, state: str = "running") -> Path:
    """The sweep's ``sweep.json`` as ``fab sweep`` writes it while it runs (this process as the
    sweep's own)."""
    folder = home / "sweeps" / sweep_id
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"index": i, "sets": [], **v} for i, v in enumerate(variants)]
    data = {
        "sweep_id": sweep_id,
        "playbook": "job.yaml",
        "state": state,
        "pid": os.getpid(),
        "variants": rows,
    }
    (folder / sweeps.SWEEP_FILE).write_text(json.dumps(data))
    return folder


def end_by_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> Ended:
    """The sweep's last variant (the one before it succeeded), with the playbook's own teardown
    and keep-warm, as ``fab sweep`` starts it: it ends the fleet as ``fab train`` does."""
    book = playbook_of(ending)
    sweep_file(tmp_path, "sw-1", [{"state": "succeeded"}, {"state": "running", "pid": os.getpid()}])
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, book["job"], inventory=inventory(), teardown=book["teardown"],
        keep_warm_s=book["keep_warm_s"], on_end=book["on_end"], sweep_id="sw-1",
    )  # fmt: skip
    record = run.records.get("fake-run-1")
    assert record.sweep_id == "sw-1"
    return Ended(run.summary.teardown, run.folder, run.fleet, record.state)


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
            keep_warm_s=book["keep_warm_s"], on_end=book["on_end"], clock=clock, ask_keep_running=lambda _run_id: True,
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
        keep_warm_s=book["keep_warm_s"], on_end=book["on_end"],
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
    # the on_end hook ran once, told the run's outcome, whichever command ended the run
    assert (ended.folder / "hook-ran").read_text().split() == [ended.record_state], command
    (hook,) = json.loads((ended.folder / "hooks.json").read_text())
    assert hook["ok"] and hook["command"] == HOOK
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


# -- a sweep's variants share the fleet -----------------------------------------------------------
def test_a_variant_keeps_the_fleet_for_the_next_and_the_last_ends_it_as_train_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path, teardowns: list[str], timers: list[Path]
) -> None:
    """A sweep of two variants, one after another, of a playbook with ``teardown: always`` and
    ``keep_warm_s``: the first keeps the fleet for the second (no teardown, no warm timer), the
    second keeps it warm as ``fab train`` would. (Before, every variant ran ``teardown: never``
    and only the sweep's own end, in the command layer, decided.)"""
    book = playbook_of("warm_claimed")
    folder = sweep_file(home, "sw-2", [{"state": "running", "pid": os.getpid()}, {"state": "pending"}])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = run_on_fake_fleet(
        tmp_path / "a", monkeypatch, book["job"], inventory=inventory(), teardown="always",
        keep_warm_s=KEEP_WARM_S, sweep_id="sw-2",
    )  # fmt: skip
    kept = first.summary.teardown
    assert kept.state is TeardownState.SKIPPED and kept.message.startswith(
        "kept for sweep sw-2 (1 variant(s) to start"
    )
    assert teardowns == [] and timers == []
    # its nodes have no run now: each gets its own idle timer, claimed by the next variant's start
    assert {n: node.warm_timers for n, node in first.fleet.nodes.items()} == {"n0": ["60"], "n1": ["60"]}
    assert kept.message.endswith(
        "this run's 2 idle node(s) power themselves off after 60 s unless a run claims them"
    )
    sweep_file(home, "sw-2", [{"state": "succeeded"}, {"state": "running", "pid": os.getpid()}])
    second = run_on_fake_fleet(
        tmp_path / "b", monkeypatch, playbook_of("warm_claimed")["job"], inventory=inventory(),
        teardown="always", keep_warm_s=KEEP_WARM_S, sweep_id="sw-2",
    )  # fmt: skip
    assert second.summary.teardown.message.startswith("kept warm for 60 s instead (teardown: always)")
    assert {n: node.warm_timers for n, node in second.fleet.nodes.items()} == {"n0": ["60"], "n1": ["60"]}
    assert len(timers) == 1 and teardowns == []
    assert sorted(p.name for p in (folder / "ended").iterdir()) == [str(os.getpid())]


def test_two_variants_ending_together_leave_the_fleet_to_the_last(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variant A ends while B still runs: A keeps the fleet for B; B, ending next, finds A's mark
    and decides (neither keeps it for the other). A variant whose process is gone, or pending
    variants of a sweep that stopped or whose process is gone, hold nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = os.getpid()
        sweep_file(home, "sw-3", [{"state": "running", "pid": me}, {"state": "running", "pid": other.pid}])
        assert "1 variant(s) still running" in (sweeps.leave("sw-3", "run-a") or "")
        monkeypatch.setattr(sweeps.os, "getpid", lambda: other.pid)  # B's process ends its run
        assert sweeps.leave("sw-3", "run-b") is None
    finally:
        other.kill()
        other.wait()
    monkeypatch.undo()
    sweep_file(
        home, "sw-4", [{"state": "running", "pid": other.pid}, {"state": "running", "pid": os.getpid()}]
    )
    assert sweeps.leave("sw-4", "run-c") is None, "a variant whose process is gone holds nothing"
    sweep_file(
        home, "sw-5", [{"state": "running", "pid": os.getpid()}, {"state": "pending"}], state="stopping"
    )
    assert sweeps.leave("sw-5", "run-d") is None, "a stopped sweep starts nothing more"
    folder = sweep_file(home, "sw-6", [{"state": "running", "pid": os.getpid()}, {"state": "pending"}])
    data = json.loads((folder / sweeps.SWEEP_FILE).read_text())
    (folder / sweeps.SWEEP_FILE).write_text(json.dumps({**data, "pid": other.pid}))
    assert sweeps.leave("sw-6", "run-e") is None, "a sweep process that is gone starts nothing more"
    assert sweeps.leave("../sw-6", "run-f") is None and sweeps.leave(None, "run-g") is None


def test_a_sweep_variant_is_prepared_with_the_playbooks_own_teardown_and_keep_warm(
    tmp_path: Path, home: Path
) -> None:
    """``fab sweep`` starts each variant as ``fab train --sweep ID``: its run keeps the playbook's
    teardown and keep-warm (it was forced to ``never``, so a sweep ignored ``keep_warm_s``)."""
    import yaml

    from launch.run import opening
    from tests.fakefleet import fake_spec

    playbook, _spec = fake_spec(tmp_path, 2, teardown="on_success", keep_warm_s=KEEP_WARM_S)
    lab = tmp_path / "lab.yaml"
    lab.write_text(yaml.safe_dump({"hosts": inventory().to_yaml_data()["hosts"]}))
    request = opening.RunRequest.of(playbook, inventory=str(lab), sweep_id="sw-7", hosts=["n1", "n0"])
    prepared = opening.prepare(request, RecordingReporter(), dry_run=True)
    assert prepared.spec.teardown is Teardown.ON_SUCCESS and prepared.spec.keep_warm_s == KEEP_WARM_S
    assert [h.name for h in prepared.inventory.hosts] == ["n1", "n0"] and request.sweep_id == "sw-7"


# -- another run on the same fleet --------------------------------------------------------------
def test_a_run_ending_while_another_runs_on_its_fleet_leaves_the_fleet_to_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path, teardowns: list[str], timers: list[Path]
) -> None:
    """Two runs on disjoint hosts of one fleet (``fab train --hosts``, a sweep's two slots): the
    first to end does not tear the fleet down under the other (a teardown removes the whole
    fleet), nor does a warm deadline passed while the other still runs, but arms its own nodes'
    idle timers (nothing else would end them without the laptop); a watcher that is gone holds
    nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        records = RunRecords(tmp_path / "runs.db")
        # the other run shares n1 with this one (two runs on one node) and runs on n2 too
        shared = fake_inventory(3, fleet=LocalFleetRef(prefix="frend"))
        shared = shared.model_copy(update={"hosts": shared.hosts[1:]})
        records.start(run_id="other-run", inventory=shared.to_yaml_data(), watcher_pid=other.pid)
        run = run_on_fake_fleet(
            tmp_path,
            monkeypatch,
            JobScript(steps=4),
            inventory=inventory(),
            teardown="always",
            records=records,
        )
        kept = run.summary.teardown
        assert (
            kept.state is TeardownState.SKIPPED and "run other-run still runs on this fleet" in kept.message
        )
        assert teardowns == []
        # with the laptop gone, the other run's watchdog ends only its own nodes: n0 has a timer
        # (no keep_warm_s: the watchdog's time for a lost laptop, at least HOLD_MIN_S); n1, which
        # the other run still uses, has none (it would power off under that run)
        assert {n: node.warm_timers for n, node in run.fleet.nodes.items()} == {"n0": ["600"], "n1": []}
        armed_at = records.get("other-run").started_at + 1  # kept warm after the other run started
        entry = warm.WarmEntry("fake-run-1", inventory(), armed_at, armed_at + KEEP_WARM_S, run.folder)
        assert warm.claimed_by(entry, records) == "other-run", "started before the arming, still running"
    finally:
        other.kill()
        other.wait()
    assert warm.run_still_on(inventory(), "fake-run-1", records) is None
    assert warm.claimed_by(entry, records) is None


def test_a_labs_machines_kept_for_another_run_get_no_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path, teardowns: list[str]
) -> None:
    """Lab machines are never powered off: ending beside another run on them arms nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        records = RunRecords(tmp_path / "runs.db")
        records.start(run_id="other-run", inventory=fake_inventory(2).to_yaml_data(), watcher_pid=other.pid)
        run = run_on_fake_fleet(
            tmp_path,
            monkeypatch,
            JobScript(steps=4),
            inventory=fake_inventory(2),
            teardown="always",
            records=records,
        )
    finally:
        other.kill()
        other.wait()
    assert "run other-run still runs on this fleet" in run.summary.teardown.message
    assert "power themselves off" not in run.summary.teardown.message
    assert not any(node.warm_timers for node in run.fleet.nodes.values()) and teardowns == []


def test_the_sweep_says_how_its_fleet_ended_in_the_last_variants_words(tmp_path: Path, home: Path) -> None:
    records = RunRecords(home / "runs.db")
    for name, ended_at, message in (
        ("v0", 10.0, "kept for sweep sw-8 (...)"),
        ("v1", 20.0, "kept warm for 60 s"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.json").write_text(
            json.dumps({"teardown": {"state": "skipped", "message": message}})
        )
        records.start(run_id=name, sweep_id="sw-8", run_dir=str(folder), started_at=ended_at - 5)
        records.finish(name, state="succeeded", ended_at=ended_at)
    records.start(run_id="v2", sweep_id="sw-8", run_dir=str(tmp_path / "nowhere"), started_at=1.0)
    records.finish("v2", state="failed", ended_at=30.0)  # refused before its wrap-up: no summary
    assert sweeps.fleet_end("sw-8", records) == "kept warm for 60 s (run v1, the last variant to end)"
    assert sweeps.fleet_end("sw-none", records) is None
