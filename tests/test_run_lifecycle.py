"""The life cycle's recovery and re-attach paths on the fake fleet: no root, seconds.

The real stages, watcher, recovery, wrap-up, run folder and run records run; the machines are
``tests/fakefleet.py`` (a ``FleetPort``) and the clock is a ``FakeClock``, both passed in through
the run context. What the fleet tests show on real nodes (``test_recovery_fleet.py``), these
show for every outcome of a recovery, fast enough to run on every change.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LocalFleetRef
from launch.job.inventory import Host
from launch.run import attempts as attempts_module
from launch.run import lifecycle
from launch.run import recheck as recheck_module
from launch.run.reporter import RecordingReporter
from tests.fakefleet import FakeClock, JobScript, NodeScript, fake_inventory, run_on_fake_fleet

RECOVERY = {"max_restarts": 2, "grace_s": 5, "confirm_s": 3}
LOST_AFTER = {"unreachable_timeout_s": 30}


@pytest.fixture
def sshd(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The nodes whose sshd does not answer the recovery's re-check (fill in per test)."""
    down: set[str] = set()
    monkeypatch.setattr(recheck_module, "sshd_answers", lambda host, *_: host.name not in down)
    return down


def attempts_of(run: Any) -> list[dict[str, Any]]:
    return run.records.get(run.summary.run_id).attempts


def lost_in_attempt_1(**script: Any) -> JobScript:
    """A 12-step job checkpointing every 2 steps; n1 drops off the network at step 5 of attempt 1."""
    return JobScript(
        steps=12,
        checkpoint_every=2,
        nodes={"n1": NodeScript(unreachable_from_step=5, in_attempt=1, **script)},
    )


def fresh_machine(host: Host) -> Host:
    """A local fleet's replacement of ``host``: a new machine at a new address."""
    return host.model_copy(update={"address": "203.0.113.99"})


def lost_on_a_local_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reporter: RecordingReporter | None = None
) -> Any:
    """``lost_in_attempt_1`` on a 2-node local fleet (its lost node replaced by the kind)."""
    return run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        lost_in_attempt_1(),
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        recovery=RECOVERY,
        stop=LOST_AFTER,
        reporter=reporter,
    )


def test_lost_lab_node_comes_back_and_the_run_resumes_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n1")
    reporter = RecordingReporter()
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        lost_in_attempt_1(comes_back=True),
        recovery=RECOVERY,
        stop=LOST_AFTER,
        reporter=reporter,
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("succeeded", "completed"), s.reason
    first, second = attempts_of(run)
    assert (first["attempt"], first["loss"], first["replaced"]) == (1, "node_lost", ["n1"])
    assert second["attempt"] == 2 and second["outcome"] == "succeeded"
    assert set(second["recovery_s"]) >= {"recheck", "stop_survivors", "replace", "sync_setup", "claim_start"}
    # only the node that came back is synced and set up again; every node starts attempt 2,
    # resumed from the newest checkpoint (n0's, copied to n1, which missed the later ones)
    assert run.fleet.synced == [["n0", "n1"], ["n1"]]
    assert run.fleet.nodes["n0"].attempts == ["1", "2"] and run.fleet.nodes["n1"].attempts == ["1", "2"]
    said = "\n".join(reporter.lines)
    assert "checkpoint step 10 copied from n0 to n1" in said, said
    for node in ("n0", "n1"):
        assert run.fleet.nodes[node].files["resume_from"].endswith("/step-10")
    assert (first["last_step"], second["first_step"], second["last_step"]) == (10, 11, 12)
    saved = json.loads((run.folder / "attempts.json").read_text())
    assert [a["attempt"] for a in saved["attempts"]] == [1, 2]
    watch = json.loads((run.folder / "watch.json").read_text())
    assert watch["attempt"] == 2


def test_replaced_machine_gets_the_checkpoint_and_only_it_is_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    """A local fleet's lost node is replaced by a fresh machine (new address, new host key): it is
    a new node of the fake fleet, with nothing on its disk, and gets the checkpoint copied."""
    sshd.add("n1")
    fresh: list[Host] = []

    def replace(self: LocalFleetKind, host: Host, say: Any, timeout_s: float, probe: Any = None) -> Host:
        new = fresh_machine(host)
        fresh.append(new)
        return new

    monkeypatch.setattr(LocalFleetKind, "replace", replace)
    reporter = RecordingReporter()
    run = lost_on_a_local_fleet(tmp_path, monkeypatch, reporter)
    assert run.summary.outcome == "succeeded", run.summary.reason
    assert run.fleet.replaced == fresh and len(fresh) == 1
    new_node = run.fleet.nodes["n1"]
    assert new_node.host.address == "203.0.113.99" and new_node.attempts == ["2"]
    assert "checkpoint step 10 copied from n0 to n1" in "\n".join(reporter.lines)
    assert 10 in new_node.checkpoints
    assert "setup.sh" in new_node.files and run.fleet.synced[-1] == ["n1"]
    assert [a["replaced"] for a in attempts_of(run)] == [["n1"], []]


def test_a_lost_machine_is_replaced_while_the_survivors_are_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    """The replacement does not wait for the survivors' stop (their grace, their wrapper's end):
    here the stop waits for the replacement to begin, which would time out one after the other."""
    sshd.add("n1")
    began = threading.Event()
    seen: dict[str, bool] = {}
    real_stop = attempts_module.stop_survivors

    def stop(*args: Any, **kwargs: Any) -> Any:
        seen.setdefault("replacing during the stop", began.wait(20))
        return real_stop(*args, **kwargs)

    def replace(self: LocalFleetKind, host: Host, say: Any, timeout_s: float, probe: Any = None) -> Host:
        began.set()
        return fresh_machine(host)

    monkeypatch.setattr(attempts_module, "stop_survivors", stop)
    monkeypatch.setattr(LocalFleetKind, "replace", replace)
    run = lost_on_a_local_fleet(tmp_path, monkeypatch)
    assert run.summary.outcome == "succeeded", run.summary.reason
    assert seen == {"replacing during the stop": True}
    assert [a["replaced"] for a in attempts_of(run)] == [["n1"], []]
    assert run.fleet.nodes["n1"].host.address == "203.0.113.99"


def test_elastic_job_goes_on_without_a_node_that_cannot_be_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n2")
    job = JobScript(steps=10, checkpoint_every=2, nodes={"n2": NodeScript(unreachable_from_step=4)})
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        job,
        inventory=fake_inventory(3),
        recovery={**RECOVERY, "replace_timeout_s": 1},
        stop=LOST_AFTER,
        min_nodes=2,
    )
    assert run.summary.outcome == "succeeded", run.summary.reason
    first, second = attempts_of(run)
    assert first["dropped"] == ["n2"] and first["replaced"] == []
    assert second["nodes"] == ["n0", "n1"]
    assert run.summary.nodes == ["n0", "n1"]


def test_a_node_that_cannot_be_replaced_ends_a_fixed_size_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n1")
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        lost_in_attempt_1(),
        recovery={**RECOVERY, "replace_timeout_s": 1},
        stop=LOST_AFTER,
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert "Not recovered: could not replace n1" in s.reason
    assert [a["attempt"] for a in attempts_of(run)] == [1]


def test_restarts_run_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]) -> None:
    """A rank that fails in every attempt: recovered once (``rank_failed`` is on), then the
    restarts are spent and the run fails with the reason."""
    job = JobScript(steps=10, checkpoint_every=2, nodes={"n1": NodeScript(exit_at_step=5, exit_code=3)})
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        job,
        recovery={**RECOVERY, "max_restarts": 1, "on": ["rank_failed"]},
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "rank_failed")
    assert "Not recovered" in s.reason and "restart" in s.reason, s.reason
    assert [(a["attempt"], a["loss"]) for a in attempts_of(run)] == [(1, "rank_failed"), (2, "rank_failed")]
    assert run.fleet.nodes["n0"].attempts == ["1", "2"]


def test_survivors_that_cannot_be_stopped_end_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n1")
    job = lost_in_attempt_1(comes_back=True)
    job.nodes["n0"] = NodeScript(fail_stop=True)
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, recovery=RECOVERY, stop=LOST_AFTER)
    assert run.summary.outcome == "failed"
    assert "Not recovered: could not stop the attempt on n0" in run.summary.reason
    assert run.fleet.nodes["n0"].attempts == ["1"]


def test_without_recovery_the_first_loss_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n1")
    run = run_on_fake_fleet(tmp_path, monkeypatch, lost_in_attempt_1(comes_back=True), stop=LOST_AFTER)
    assert (run.summary.outcome, run.summary.rule) == ("failed", "unreachable")
    assert attempts_of(run) == [] and run.fleet.nodes["n0"].attempts == ["1"]


# -- re-attaching ----------------------------------------------------------------------------------
def detached_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: JobScript) -> Any:
    """A run whose watcher went away during attempt 1 (Ctrl-C, 'keep the job running')."""
    clock = FakeClock()
    clock.interrupt_at = clock.now + 12
    with pytest.raises(KeyboardInterrupt):
        run_on_fake_fleet(
            tmp_path,
            monkeypatch,
            job,
            recovery=RECOVERY,
            stop=LOST_AFTER,
            clock=clock,
            ask_keep_running=lambda _run_id: True,
        )
    return clock


def reattach(tmp_path: Path, clock: FakeClock, fleet: Any) -> Any:
    from launch.run.records import RunRecords

    records = RunRecords(tmp_path / "runs.db")
    records.update("fake-run-1", watcher_pid=0)  # the watcher is gone
    reporter = RecordingReporter()
    record = records.get("fake-run-1")
    assert record is not None and record.state == "running"
    summary = lifecycle.reattach(
        records,
        record,
        reporter,
        poll_interval=5.0,
        port=fleet,
        transfers=fleet.transfers(),
        clock=clock,
    )
    return summary, records, reporter


def test_reattached_watcher_follows_the_run_through_a_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    sshd.add("n1")
    fleets: list[Any] = []
    import tests.fakefleet as fakefleet

    real = fakefleet.FakeFleet

    def keep(*args: Any, **kwargs: Any) -> Any:
        fleets.append(real(*args, **kwargs))
        return fleets[-1]

    monkeypatch.setattr(fakefleet, "FakeFleet", keep)
    clock = detached_run(tmp_path, monkeypatch, lost_in_attempt_1(comes_back=True))
    fleet = fleets[0]
    assert fleet.step < 5 and fleet.nodes["n0"].attempts == ["1"], "detached before the loss"
    summary, records, reporter = reattach(tmp_path, clock, fleet)
    assert (summary.outcome, summary.rule) == ("succeeded", "completed"), summary.reason
    record = records.get("fake-run-1")
    assert record.state == "succeeded"
    assert [(a["attempt"], a["loss"]) for a in record.attempts] == [(1, "node_lost"), (2, None)]
    assert fleet.nodes["n0"].attempts == ["1", "2"]
    assert "re-attached to run fake-run-1" in "\n".join(str(x) for x in reporter.lines)


def test_reattach_with_a_changed_playbook_follows_without_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    """The recorded hash no longer matches: no next attempt is planned from a playbook the run
    did not start with; the current attempt is followed to its end, as ``fab watch`` always did."""
    sshd.add("n1")
    fleets: list[Any] = []
    import tests.fakefleet as fakefleet

    real = fakefleet.FakeFleet

    def keep(*args: Any, **kwargs: Any) -> Any:
        fleets.append(real(*args, **kwargs))
        return fleets[-1]

    monkeypatch.setattr(fakefleet, "FakeFleet", keep)
    clock = detached_run(tmp_path, monkeypatch, lost_in_attempt_1(comes_back=True))
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(playbook.read_text() + "\n# edited\n")
    summary, records, reporter = reattach(tmp_path, clock, fleets[0])
    assert (summary.outcome, summary.rule) == ("failed", "unreachable")
    assert "changed since the run started: following it without recovery" in "\n".join(
        str(x) for x in reporter.lines
    )
    assert fleets[0].nodes["n0"].attempts == ["1"]


def test_summary_says_where_the_start_and_the_stop_spent_their_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stage's seconds go into the state's timings, and from there into ``summary.json``."""
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=3))
    timings = json.loads((run.folder / "summary.json").read_text())["timings"]
    assert {"connect", "sync", "setup", "claim", "start"} <= set(timings), timings
    assert {"wrapup stopping the run", "wrapup pulling artifacts", "wrapup close"} <= set(timings), timings


# -- gpu_fault: spare, else a renewed machine, else shrink or fail ------------------------------------
GPU_RECOVERY = {**RECOVERY, "on": ["gpu_fault"]}


def gpu_fault_on_n1() -> JobScript:
    """A 12-step job checkpointing every 2 steps; n1's GPU reports uncorrectable ECC from step 5."""
    return JobScript(
        steps=12, checkpoint_every=2, nodes={"n1": NodeScript(gpu_fault_from_step=5, in_attempt=1)}
    )


def test_gpu_fault_without_a_spare_relaunches_on_a_renewed_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind that renews (the local fleet: a fresh node; a stack: a new instance) gives the bad
    node a new machine under its name; the run resumes there, and both records say so."""
    renewed: list[Host] = []

    def renew(self: LocalFleetKind, host: Host, say: Any, timeout_s: float, probe: Any = None) -> Host:
        new = host.model_copy(update={"address": "203.0.113.99"})
        renewed.append(new)
        say(f"{host.name}: powered off and renewed as a fresh node")
        return new

    monkeypatch.setattr(LocalFleetKind, "renew", renew)
    reporter = RecordingReporter()
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        gpu_fault_on_n1(),
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        recovery=GPU_RECOVERY,
        reporter=reporter,
    )
    assert (run.summary.outcome, run.summary.rule) == ("succeeded", "completed"), run.summary.reason
    first, second = attempts_of(run)
    assert (first["loss"], first["replaced"], first["dropped"]) == ("gpu_fault", ["n1"], [])
    assert first["renewed"] == [
        {
            "node": "n1",
            "reason": first["renewed"][0]["reason"],
            "old_address": "203.0.113.2",
            "new_address": "203.0.113.99",
            "host_key_changed": False,
        }
    ]
    assert "uncorrectable ECC 0 -> 2" in first["renewed"][0]["reason"]
    assert second["nodes"] == ["n0", "n1"] and second["renewed"] == []
    assert run.fleet.replaced == renewed and run.fleet.nodes["n1"].host.address == "203.0.113.99"
    assert run.fleet.nodes["n1"].attempts == ["2"] and run.fleet.synced[-1] == ["n1"]
    hosts = json.loads((run.folder / "hosts.json").read_text())
    assert "n1" not in hosts.get("excluded", {})  # the name now stands for the new machine
    assert [(r["node"], r["old_address"], r["new_address"]) for r in hosts["renewed"]] == [
        ("n1", "203.0.113.2", "203.0.113.99")
    ]
    lines = [line for line in reporter.lines if "renewed by" in line]
    assert len(lines) == 1 and "local fleet lfz: 203.0.113.2 -> 203.0.113.99" in lines[0], reporter.lines
    saved = json.loads((run.folder / "attempts.json").read_text())["attempts"]
    assert attempts_module.attempt_end_from_json(saved[0]).renewed[0].new_address == "203.0.113.99"


def test_gpu_fault_takes_a_spare_before_renewing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakefleet import fake_hosts

    monkeypatch.setattr(
        LocalFleetKind, "renew", lambda *a, **k: pytest.fail("renewed while a spare was left")
    )
    spare = fake_hosts(3)[2]
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        gpu_fault_on_n1(),
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        recovery=GPU_RECOVERY,
        spares=(spare,),
    )
    assert run.summary.outcome == "succeeded", run.summary.reason
    first, second = attempts_of(run)
    assert first["renewed"] == [] and second["nodes"] == ["n0", "n2"]
    assert "n1" in json.loads((run.folder / "hosts.json").read_text())["excluded"]


def test_gpu_fault_on_lab_machines_without_a_spare_ends_a_fixed_size_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lab machines are never renewed: no spare and a fixed size end the run, saying why."""
    reporter = RecordingReporter()
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, gpu_fault_on_n1(), recovery=GPU_RECOVERY, reporter=reporter
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "gpu_fault")
    assert "Not recovered: could not replace n1" in s.reason, s.reason
    said = "\n".join(reporter.lines)
    assert "lab machine; fleetrun never renews" in said and "no spare host left and no new machine" in said
    assert "n1" in json.loads((run.folder / "hosts.json").read_text())["excluded"]


# -- the fleet port ----------------------------------------------------------------------------------
def test_node_results_sort_themselves_into_ok_and_failed() -> None:
    from launch.errors import HostError
    from launch.transport.port import NodeResults

    results = NodeResults[int]({"n0": 1, "n1": HostError("n1", "gone"), "n2": 3})
    assert list(results) == ["n0", "n1", "n2"] and isinstance(results, dict)
    assert results.ok == {"n0": 1, "n2": 3}
    assert list(results.failed) == ["n1"] and results.errors() == {"n1": "n1: gone"}


def test_ssh_pool_subset_shares_the_open_connections(tmp_path: Path) -> None:
    """A step on fewer nodes narrows the pool; it never opens, swaps or closes connections."""
    from launch.transport.ssh import SshPool
    from tests.fakefleet import fake_hosts

    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    pool = SshPool(fake_hosts(3), known_hosts)
    part = pool.subset(["n2", "n0"])
    assert [h.name for h in part.hosts] == ["n0", "n2"] and [h.name for h in pool.hosts] == ["n0", "n1", "n2"]
    assert part.connections["n1"] is pool.connections["n1"]
    seen = part.map(lambda conn: conn.host.name)
    assert seen.ok == {"n0": "n0", "n2": "n2"} and not seen.failed
    pool.close()


def run_with_two_spares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: JobScript, **options: Any
) -> Any:
    """``run_on_fake_fleet`` with ``gpu_fault`` recovery and two spares (n2, n3) beside n0, n1."""
    from tests.fakefleet import fake_hosts

    return run_on_fake_fleet(
        tmp_path, monkeypatch, script, recovery=GPU_RECOVERY, spares=tuple(fake_hosts(4)[2:]), **options
    )


def test_a_spare_bad_at_its_check_is_excluded_and_the_next_one_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare gets the pre-launch GPU check before it is taken: bad from its first boot (which
    ``gpu_fault``, comparing with the attempt's own first reading, would never flag), it is
    excluded with its reason, said in one line, and the next spare takes the node's place."""

    monkeypatch.setattr(
        LocalFleetKind, "renew", lambda *a, **k: pytest.fail("renewed while a spare was left")
    )
    script = gpu_fault_on_n1()
    script.nodes["n2"] = NodeScript(bad_gpu_at_probe=True)
    reporter = RecordingReporter()
    run = run_with_two_spares(
        tmp_path,
        monkeypatch,
        script,
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        reporter=reporter,
    )
    assert (run.summary.outcome, run.summary.rule) == ("succeeded", "completed"), run.summary.reason
    first, second = attempts_of(run)
    assert second["nodes"] == ["n0", "n3"] and first["replaced"] == ["n1"]
    assert list(first["not_taken"]) == ["n2"] and "uncorrectable ECC" in first["not_taken"]["n2"]
    excluded = json.loads((run.folder / "hosts.json").read_text())["excluded"]
    assert set(excluded) == {"n1", "n2"}
    assert "uncorrectable ECC 0 -> 2" in excluded["n1"] and "uncorrectable ECC 2" in excluded["n2"]
    skipped = [line for line in reporter.lines if "spare n2: not taken" in line]
    assert len(skipped) == 1 and "trying the next" in skipped[0], reporter.lines
    assert any("spare n3 takes its place" in line for line in reporter.lines)
    assert [h.name for h in run.fleet.visited] == ["n2", "n3"]  # each checked once
    assert run.fleet.nodes["n3"].attempts == ["2"] and "n2" not in run.fleet.nodes  # never trained on


class _Hold:
    """The run's ``QueueHold`` as recovery meets it: ``held`` names the spares another run holds."""

    def __init__(self, held: dict[str, str]) -> None:
        self.held, self.asked, self.followed = held, list[str](), list[list[str]]()
        self.released = False

    def refused(self, host: Any, known_hosts: Path) -> str | None:
        self.asked.append(host.name)
        return self.held.get(host.name)

    def follow(self, hosts: list[Any], known_hosts: Path) -> None:
        self.followed.append([h.name for h in hosts])

    def release(self) -> None:
        self.released = True


def test_a_spare_another_run_holds_is_passed_over_not_excluded_and_the_hold_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare is a shared machine: recovery holds it before taking it (``QueueHold.refused``);
    one another run holds is passed over (said, recorded as not taken) but not excluded (it is
    not bad: free again later); the next attempt's hosts are what the run then holds."""
    monkeypatch.setattr(
        LocalFleetKind, "renew", lambda *a, **k: pytest.fail("renewed while a spare was left")
    )
    hold = _Hold({"n2": "held by another run (n2: behind run-x (ann@lap))"})
    reporter = RecordingReporter()
    run = run_with_two_spares(
        tmp_path,
        monkeypatch,
        gpu_fault_on_n1(),
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        reporter=reporter,
        hold=hold,
    )
    assert (run.summary.outcome, run.summary.rule) == ("succeeded", "completed"), run.summary.reason
    first, second = attempts_of(run)
    assert second["nodes"] == ["n0", "n3"] and "held by another run" in first["not_taken"]["n2"]
    assert hold.asked == ["n2", "n3"] and hold.followed == [["n0", "n3"]]
    excluded = json.loads((run.folder / "hosts.json").read_text())["excluded"]
    assert set(excluded) == {"n1"}, "a held spare is not bad: not excluded"
    assert any("spare n2: not taken, held by another run" in line for line in reporter.lines)
    assert "n2" not in run.fleet.nodes, "never trained on"
    assert hold.released, "let go once the run's teardown is over"


def test_every_spare_bad_and_a_fixed_size_ends_the_run_naming_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lab machines (never renewed), both spares bad, a fixed size: the run ends, its reason
    naming each spare and why; every one is excluded; nothing was started on them."""
    from launch.reports.views import attempts_table

    script = gpu_fault_on_n1()
    script.nodes["n2"] = NodeScript(bad_gpu_at_probe=True)
    script.nodes["n3"] = NodeScript(bad_gpu_at_probe=True)
    run = run_with_two_spares(tmp_path, monkeypatch, script)
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "gpu_fault"), s.reason
    assert "Not recovered: could not replace n1 (n2: GPU check: gpu0: uncorrectable ECC" in s.reason, s.reason
    assert "; n3: GPU check: gpu0: uncorrectable ECC" in s.reason and "not elastic" in s.reason
    excluded = json.loads((run.folder / "hosts.json").read_text())["excluded"]
    assert set(excluded) == {"n1", "n2", "n3"}
    assert [h.name for h in run.fleet.visited] == ["n2", "n3"]
    assert "n2" not in run.fleet.nodes and "n3" not in run.fleet.nodes
    (only,) = attempts_of(run)
    assert list(only["not_taken"]) == ["n2", "n3"]
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(attempts_table([only]))
    assert "(not taken: n2, n3)" in console.export_text()


def test_a_renewed_machine_bad_again_is_not_renewed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spare; the kind's new machine fails its GPU check: it is not taken, the kind is not
    asked again, and the elastic job goes on without the node (both records say why)."""
    calls: list[Host] = []

    def renew(self: LocalFleetKind, host: Host, say: Any, timeout_s: float, probe: Any = None) -> Host:
        calls.append(host)
        return host.model_copy(update={"address": "203.0.113.99"})

    monkeypatch.setattr(LocalFleetKind, "renew", renew)
    script = gpu_fault_on_n1()
    script.nodes["n1"].bad_gpu_at_probe = True  # the new machine under n1's name: bad too
    reporter = RecordingReporter()
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        script,
        inventory=fake_inventory(2, fleet=LocalFleetRef(prefix="lfz")),
        recovery=GPU_RECOVERY,
        min_nodes=1,
        skip_doctor=True,  # n1's first machine would fail the pre-launch check as well
        reporter=reporter,
    )
    assert (run.summary.outcome, run.summary.rule) == ("succeeded", "completed"), run.summary.reason
    assert len(calls) == 1
    first, second = attempts_of(run)
    assert first["dropped"] == ["n1"] and second["nodes"] == ["n0"]
    assert list(first["not_taken"]) == ["n1 at 203.0.113.99"]
    assert [r["new_address"] for r in first["renewed"]] == ["203.0.113.99"]
    hosts = json.loads((run.folder / "hosts.json").read_text())
    assert "n1" in hosts["excluded"] and hosts["renewed"][0]["new_address"] == "203.0.113.99"
    assert any("the new machine 203.0.113.99 not taken" in line for line in reporter.lines), reporter.lines


def test_a_spare_that_does_not_answer_is_not_taken_and_the_next_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare that is down (or whose host key changed) fails its check over SSH before it is
    taken: excluded with the connection's error, and the next spare takes the node's place, where
    taking it would have failed the sync and ended the recovery."""

    script = gpu_fault_on_n1()
    script.nodes["n2"] = NodeScript(unreachable_from_step=0)
    reporter = RecordingReporter()
    run = run_with_two_spares(tmp_path, monkeypatch, script, reporter=reporter)
    assert (run.summary.outcome, run.summary.rule) == ("succeeded", "completed"), run.summary.reason
    first, second = attempts_of(run)
    assert second["nodes"] == ["n0", "n3"]
    assert (
        first["not_taken"]["n2"].startswith("not reachable: ")
        and "fake link down" in first["not_taken"]["n2"]
    )
    excluded = json.loads((run.folder / "hosts.json").read_text())["excluded"]
    assert "not reachable" in excluded["n2"]
    assert any("spare n2: not taken, not reachable" in line for line in reporter.lines), reporter.lines
    assert run.fleet.nodes["n3"].attempts == ["2"] and "n2" not in run.fleet.nodes


def test_survivors_killed_without_their_grace_are_named_in_the_ended_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: set[str]
) -> None:
    """n1 is lost; n0's ranks have not stepped since (blocked with n1): its agent kills them at
    once, and the record and ``fab show``'s attempts table say so, for that attempt only."""
    from rich.console import Console

    from launch.reports.views import attempts_table

    sshd.add("n1")
    script = lost_in_attempt_1(comes_back=True)
    script.nodes["n0"] = NodeScript(blocked_at_stop=True, in_attempt=1)
    reporter = RecordingReporter()
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, script, recovery=RECOVERY, stop=LOST_AFTER, reporter=reporter
    )
    assert run.summary.outcome == "succeeded", run.summary.reason
    first, second = attempts_of(run)
    assert first["grace_cut"] == ["n0"] and second["grace_cut"] == [], (first, second)
    assert any("killed without the grace" in line for line in reporter.lines), reporter.lines
    saved = json.loads((run.folder / "attempts.json").read_text())["attempts"]
    assert attempts_module.attempt_end_from_json(saved[0]).grace_cut == ("n0",)
    console = Console(record=True, width=300)
    console.print(attempts_table([first, second]))
    assert "(no grace: n0)" in console.export_text()
