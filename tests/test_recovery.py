"""Recovery (issue 11), without a fleet: the playbook's ``recovery:`` section, the plan, the pure
decisions (what counts as a lost node, what the next attempt runs on), the evidence gathering
with a fake clock, the Pulumi replacement with a fake stack, and attempts in the record and views."""

from __future__ import annotations

import contextlib
import copy
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch.errors import FleetrunError, SpecError
from launch.fleets import stack_replace
from launch.fleets.kinds.lab import LabKind
from launch.fleets.kinds.refs import LabFleet
from launch.fleets.kinds.stack import inventory_from_stack_outputs
from launch.job.spec import JobSpec, load_job_spec
from launch.planning.launchers import launcher_class
from launch.reports.views import render_text, show_run
from launch.rules.recovery import (
    Loss,
    NodeEvidence,
    RecoveryPolicy,
    classify,
    confirmed_lost,
    plan_recovery,
    steps_recomputed,
)
from launch.rules.stoprules import StopDecision
from launch.run.checkpoints import newest, parse_steps
from launch.run.records import RunRecords
from tests.conftest import SAMPLE_HOST_KEYS, sample_inventory
from tests.test_inventory import stack_outputs

RANK_FAILED = StopDecision("failed", "rank_failed", "n1 exited with exit code 1", ("n1",))


def playbook(tmp_path: Path, **fields: Any) -> Path:
    data = {"name": "job", "workdir": ".", "entrypoint": "python train.py", "nodes": 3, **fields}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- the playbook ---------------------------------------------------------------------------------
def test_recovery_defaults_keep_todays_behaviour(tmp_path: Path) -> None:
    spec = load_job_spec(playbook(tmp_path))
    assert spec.recovery.max_restarts == 0 and not spec.recovery.enabled
    assert spec.recovery.on == ["node_lost", "preempted"] and spec.recovery.replace_lost_nodes
    assert spec.min_nodes is None


def test_recovery_section_and_elastic_nodes(tmp_path: Path) -> None:
    recovery = {
        "max_restarts": 3,
        "on": ["node_lost", "rank_failed"],
        "replace_lost_nodes": False,
        "grace_s": 20,
    }
    spec = load_job_spec(playbook(tmp_path, nodes="2:3", recovery=recovery))
    assert (spec.min_nodes, spec.nodes) == (2, 3)
    assert spec.recovery.on == ["node_lost", "rank_failed"] and spec.recovery.grace_s == 20.0


def test_unquoted_on_key_in_yaml(tmp_path: Path) -> None:
    """PyYAML reads ``on:`` as true; the playbook still means the list of losses."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: job\nworkdir: .\nentrypoint: python train.py\nnodes: 2:3\n"
        "recovery:\n  max_restarts: 1\n  on: [preempted, rank_failed]\n"
    )
    spec = load_job_spec(path)
    assert spec.recovery.on == ["preempted", "rank_failed"] and (spec.min_nodes, spec.nodes) == (2, 3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"recovery": {"on": ["node_lost", "cosmic_ray"]}},
            "field 'recovery.on[1]': expected one of 'node_lost', 'preempted', 'rank_failed', 'gpu_fault' or 'straggler'",
        ),
        ({"recovery": {"max_restarts": -1}}, "field 'recovery.max_restarts'"),
        ({"recovery": {"max_restarts": 2, "retry": True}}, "field 'recovery.retry'"),
        ({"recovery": {"on": ["preempted", "preempted"]}}, "lists a loss kind twice"),
        ({"recovery": {"grace_s": "soon"}}, "field 'recovery.grace_s'"),
        ({"nodes": "3:2"}, "MIN <= MAX"),
        ({"nodes": "two:3"}, "field 'nodes'"),
        (
            {"nodes": "2:3", "launcher": "horovod"},
            "field 'nodes': nodes: MIN:MAX (elastic) needs launcher: torchrun",
        ),
    ],
)
def test_bad_recovery_fields_are_named(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_job_spec(playbook(tmp_path, **fields))
    assert message in str(err.value)


# -- the plan ---------------------------------------------------------------------------------------
def test_plan_shows_the_policy_and_elastic_torchrun(tmp_path: Path) -> None:
    spec = JobSpec(
        name="job",
        workdir=tmp_path,
        entrypoint="python train.py",
        nodes=3,
        min_nodes=2,
        procs_per_node=1,
        recovery=RecoveryPolicy(max_restarts=2),
    )
    plan = launcher_class("torchrun")().plan(spec, sample_inventory(3), "job-1")
    text = plan.render()
    assert "# recovery: up to 2 restart(s) on node_lost, preempted; lost nodes replaced" in text
    assert "elastic 2:3 nodes" in text
    assert "--nnodes=2:3" in plan.nodes[0].command
    assert plan.nodes[0].env["FLEETRUN_CHECKPOINT_DIR"] == "$HOME/.fleetrun/runs/job-1/checkpoints"
    plain = launcher_class("torchrun")().plan(
        spec.model_copy(update={"min_nodes": None}), sample_inventory(3), "j"
    )
    assert "--nnodes=3 " in plain.nodes[0].command
    assert "# recovery: up to 2" in plain.render()
    assert (
        "# recovery: none (max_restarts: 0)"
        in launcher_class("torchrun")()
        .plan(spec.model_copy(update={"recovery": RecoveryPolicy()}), sample_inventory(3), "j")
        .render()
    )


def test_launch_script_exports_attempt_and_resume(tmp_path: Path) -> None:
    """The attempt number and the resume path come from files sent with each start."""
    from launch.planning.launchers.base import attempt_lines

    run_dir = tmp_path / ".fleetrun" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    script = "\n".join([*attempt_lines("r1"), 'echo "A=$FLEETRUN_ATTEMPT R=${FLEETRUN_RESUME_FROM-unset}"'])

    def run() -> str:
        env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout

    assert run().strip() == "A=1 R=unset"
    (run_dir / "attempt").write_text("3")
    (run_dir / "resume_from").write_text(".fleetrun/runs/r1/checkpoints/step-40")
    assert run().strip() == f"A=3 R={tmp_path}/.fleetrun/runs/r1/checkpoints/step-40"
    (run_dir / "attempt").write_text("3; rm -rf /")
    (run_dir / "resume_from").write_text("s3://bucket/runs/r1/checkpoints/step-40")
    assert run().strip() == "A=1 R=s3://bucket/runs/r1/checkpoints/step-40"


# -- evidence -----------------------------------------------------------------------------------------
def test_one_failed_check_is_not_a_lost_node() -> None:
    assert not confirmed_lost(NodeEvidence("n1", (False,), 0.0), 5.0)
    assert not confirmed_lost(NodeEvidence("n1", (False, False), 2.0), 5.0), "too short a window"
    assert not confirmed_lost(NodeEvidence("n1", (False, False, True), 6.0), 5.0), "it answered"
    assert confirmed_lost(NodeEvidence("n1", (False,) * 6, 5.0), 5.0)
    assert confirmed_lost(NodeEvidence("n1", (), 0.0, cloud_gone=True), 5.0)


def evidence(**checks: tuple[bool, ...]) -> dict[str, NodeEvidence]:
    return {n: NodeEvidence(n, c, span_s=6.0 if len(c) > 1 else 0.0) for n, c in checks.items()}


def test_classify() -> None:
    lost = classify(RANK_FAILED, evidence(n0=(True,), n1=(True,), n2=(False,) * 6), 5.0)
    assert lost == Loss("node_lost", ("n2",), lost.reason if lost else "") and lost and "n2" in lost.reason
    assert classify(RANK_FAILED, evidence(n0=(True,), n1=(True,), n2=(True,)), 5.0) == Loss(
        "rank_failed", ("n1",), RANK_FAILED.reason
    )
    assert classify(RANK_FAILED, evidence(n0=(False,) * 6, n1=(False,) * 6, n2=(False,) * 6), 5.0) is None
    unreachable = StopDecision("failed", "unreachable", "cannot reach n2", ("n2",))
    assert classify(unreachable, evidence(n0=(True,), n1=(True,), n2=(False, True)), 5.0) is None
    stalled = StopDecision("failed", "stalled", "no metrics")
    assert classify(stalled, evidence(n0=(True,), n1=(True,), n2=(False,) * 6), 5.0) is None
    done = StopDecision("succeeded", "completed", "done")
    assert classify(done, evidence(n0=(True,)), 5.0) is None
    pre = {"n0": NodeEvidence("n0", (True,)), "n2": NodeEvidence("n2", (False,) * 3, 6.0, preempted=True)}
    assert classify(RANK_FAILED, pre, 5.0) == Loss("preempted", ("n2",), "n2 preempted")


def test_a_node_the_fleet_took_is_lost_though_it_answers_and_its_processes_are_to_stop() -> None:
    """Slurm set n2 DOWN (``node_down``): it answers every check, yet the fleet's word makes it
    lost, and as it answers its processes are named for stopping (``Loss.answering``)."""
    down = StopDecision("failed", "node_down", "the fleet took node(s) from the run (n2: down).", ("n2",))
    taken = {**evidence(n0=(True,), n1=(True,)), "n2": NodeEvidence("n2", (True,), cloud_gone=True)}
    loss = classify(down, taken, 5.0)
    assert loss is not None and (loss.kind, loss.nodes, loss.answering) == ("node_lost", ("n2",), ("n2",))
    assert classify(down, evidence(n0=(True,), n1=(True,), n2=(True,)), 5.0) is None, "no word, no loss"
    silent = {
        **evidence(n0=(True,), n1=(True,)),
        "n2": NodeEvidence("n2", (False,) * 3, 6.0, cloud_gone=True),
    }
    assert classify(down, silent, 5.0) == Loss("node_lost", ("n2",), silent_reason(down, silent))


def silent_reason(decision: StopDecision, found: dict[str, NodeEvidence]) -> str:
    loss = classify(decision, found, 5.0)
    assert loss is not None and loss.answering == (), "a node that does not answer has nothing to stop"
    return loss.reason


def test_unreachable_node_that_answers_again_is_watched_on() -> None:
    from launch.rules.recovery import answered_again

    unreachable = StopDecision("failed", "unreachable", "cannot reach n2", ("n2",))
    assert answered_again(unreachable, evidence(n0=(True,), n1=(True,), n2=(False, True))) == ("n2",)
    assert answered_again(unreachable, evidence(n0=(True,), n1=(True,), n2=(False,) * 6)) == ()
    assert answered_again(RANK_FAILED, evidence(n0=(True,), n1=(True,), n2=(True,))) == ()


# -- what the next attempt runs on --------------------------------------------------------------------
def test_plan_recovery() -> None:
    nodes = ["n0", "n1", "n2"]
    lost = Loss("node_lost", ("n2",), "lost n2")
    policy = RecoveryPolicy(max_restarts=2)
    assert plan_recovery(RecoveryPolicy(), lost, 1, nodes, None).stop
    assert plan_recovery(policy, lost, 1, nodes, None).replace == ("n2",)
    assert plan_recovery(policy, None, 1, nodes, None).stop == "not a recoverable loss"
    given_up = plan_recovery(policy, lost, 3, nodes, None).stop
    assert given_up is not None and "max_restarts (2) reached" in given_up
    rank = Loss("rank_failed", ("n1",), "n1 exited with exit code 3")
    hint = plan_recovery(policy, rank, 1, nodes, None).stop
    assert hint is not None and "list rank_failed under recovery.on" in hint
    retry = plan_recovery(RecoveryPolicy(max_restarts=1, on=["rank_failed"]), rank, 1, nodes, None)
    assert retry.stop is None and not retry.replace and not retry.drop
    keep = RecoveryPolicy(max_restarts=2, replace_lost_nodes=False)
    assert plan_recovery(keep, lost, 1, nodes, 2).drop == ("n2",)
    not_elastic = plan_recovery(keep, lost, 1, nodes, None).stop
    assert not_elastic is not None and "not elastic" in not_elastic
    too_few = plan_recovery(keep, Loss("node_lost", ("n1", "n2"), "x"), 1, nodes, 2).stop
    assert too_few is not None and "fewer than the elastic minimum 2" in too_few


def test_steps_recomputed() -> None:
    assert steps_recomputed(12, 11) == 2
    assert steps_recomputed(10, 11) == 0
    assert steps_recomputed(None, 11) is None


def test_checkpoint_answers_are_untrusted() -> None:
    assert parse_steps("[40, 35, 30]\n") == [40, 35, 30]
    assert parse_steps("garbage") == [] and parse_steps('{"a": 1}') == []
    assert parse_steps('[1, "2", true, -3, 1e999]') == [1]
    assert newest({"n0": [35, 30], "n1": [], "n2": [40]}) == (40, "n2")
    assert newest({"n0": [], "n1": []}) is None


# -- fleet kinds ---------------------------------------------------------------------------------------
class FakeStack:
    """The Automation API's Stack as a replacement uses it: refresh, up, outputs; no CLI."""

    def __init__(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        self.before, self.after, self.calls = before, after, []

    def outputs(self) -> dict[str, Any]:
        self.calls.append("outputs")
        return self.before

    def refresh(self, **kwargs: Any) -> None:
        self.calls.append("refresh")

    def cancel(self) -> None:
        self.calls.append("cancel")

    def up(self, **kwargs: Any) -> Any:
        self.calls.append("up")

        class Result:
            outputs = {k: type("OutputValue", (), {"value": v})() for k, v in self.after.items()}

        return Result()


def test_stack_replacement_recreates_only_the_lost_node(tmp_path: Path) -> None:
    before = stack_outputs()
    after = copy.deepcopy(before)
    lost = next(n for n in after["nodes"] if n["name"] == "n1")
    lost.update(public_ip="203.0.113.9", instance_id="i-9", host_key=SAMPLE_HOST_KEYS[2])
    inventory = inventory_from_stack_outputs(before, tmp_path / "key", stack="dev")
    host = next(h for h in inventory.hosts if h.name == "n1")
    fake = FakeStack(before, after)
    new = stack_replace.replace_node("dev", host, stack=fake, on_output=lambda _m: None)
    assert fake.calls == ["outputs", "refresh", "up"]
    assert new is not None and new.host_key == SAMPLE_HOST_KEYS[2] and new.address == "203.0.113.9"
    hosts = [new if h.name == "n1" else h for h in inventory.hosts]
    known = inventory.model_copy(update={"hosts": hosts}).write_known_hosts(tmp_path / "known_hosts")
    text = known.read_text()
    assert SAMPLE_HOST_KEYS[2] in text and host.host_key not in text

    drifted = copy.deepcopy(after)
    next(n for n in drifted["nodes"] if n["name"] == "n0")["host_key"] = SAMPLE_HOST_KEYS[3]
    with pytest.raises(FleetrunError, match="replacing n1 also changed n0"):
        stack_replace.replace_node("dev", host, stack=FakeStack(before, drifted), on_output=lambda _m: None)
    gone = copy.deepcopy(before)
    gone["nodes"] = [n for n in gone["nodes"] if n["name"] != "n1"]
    assert (
        stack_replace.replace_node("dev", host, stack=FakeStack(before, gone), on_output=lambda _m: None)
        is None
    )


def test_stack_replacement_that_outlives_its_timeout_is_cancelled(tmp_path: Path) -> None:
    """A cloud that cannot provision in time: the update is cancelled and the node not replaced."""
    before = stack_outputs()
    host = next(
        h for h in inventory_from_stack_outputs(before, tmp_path / "key", stack="dev").hosts if h.name == "n1"
    )
    release = threading.Event()

    class StuckStack(FakeStack):
        def up(self, **kwargs: Any) -> Any:
            self.calls.append("up")
            release.wait(30)
            raise RuntimeError("cancelled")

    stuck = StuckStack(before, before)
    said: list[str] = []
    assert stack_replace.replace_node("dev", host, stack=stuck, on_output=said.append, timeout_s=0.2) is None
    assert stuck.calls == ["outputs", "refresh", "up", "cancel"]
    assert any("took longer than 0 s" in m and "cancelling" in m for m in said), said
    release.set()
    quick = FakeStack(before, before)
    new = stack_replace.replace_node("dev", host, stack=quick, on_output=said.append, timeout_s=30)
    assert quick.calls == ["outputs", "refresh", "up"] and new is not None and new.name == "n1"


def test_lab_replacement_waits_for_the_host() -> None:
    """The host counts as back when its port sends an SSH banner; gone when nothing answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve_banners() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    threading.Thread(target=serve_banners, daemon=True).start()
    base = sample_inventory(1).hosts[0]
    host = base.model_copy(update={"address": "127.0.0.1", "port": port})
    kind = LabKind(LabFleet())
    assert kind.replace(host, lambda _m: None, 5.0) == host
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the banner thread
    listener.close()
    assert kind.replace(host, lambda _m: None, 0.3) is None


# -- the record and the views ----------------------------------------------------------------------------
def test_attempts_in_the_record_and_show(tmp_path: Path) -> None:
    attempts = [
        {
            "attempt": 1,
            "nodes": ["n0", "n1", "n2"],
            "outcome": "failed",
            "rule": "rank_failed",
            "loss": "node_lost",
            "reason": "lost n2",
            "first_step": 1,
            "last_step": 12,
            "replaced": ["n2"],
            "renewed": [{"node": "n2", "old_address": "10.0.0.3", "new_address": "10.0.0.9"}, "junk"],
        },
        {
            "attempt": 2,
            "nodes": ["n0", "n1", "n2"],
            "outcome": "succeeded",
            "rule": "completed",
            "reason": "done",
            "first_step": 11,
            "last_step": 45,
            "steps_recomputed": 2,
        },
        "not a mapping",
    ]
    with RunRecords(tmp_path / "runs.db") as records:
        rid = records.start(playbook_name="job").id
        assert records.get(rid).attempts == []  # type: ignore[union-attr]
        records.update(rid, attempts=attempts)
        record = records.get(rid)
    assert record is not None and record.attempts[1]["steps_recomputed"] == 2
    text = render_text(show_run(record), width=200)
    assert "attempts" in text and "node_lost: lost n2" in text and "+n2" in text and "11..45" in text
    assert "(n2 renewed: 10.0.0.3 -> 10.0.0.9)" in text


# -- the attempts loop on the in-memory fleet ----------------------------------------------------------
def test_rank_failing_by_itself_is_not_retried_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch.run import recheck as recheck_module
    from tests.fakefleet import JobScript, NodeScript, run_on_fake_fleet

    checked: list[str] = []
    monkeypatch.setattr(recheck_module, "sshd_answers", lambda host, *_: checked.append(host.name) or True)
    job = JobScript(steps=10, nodes={"n1": NodeScript(exit_at_step=3, exit_code=3)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, recovery={"max_restarts": 2})
    assert run.summary.outcome == "failed" and run.summary.rule == "rank_failed"
    assert "Not recovered: rank_failed is not in recovery.on" in run.summary.reason
    assert sorted(checked) == ["n0", "n1"], "every node re-checked once (all answered)"
    record = run.records.get(run.summary.run_id)
    assert [a["loss"] for a in record.attempts] == ["rank_failed"]
    assert run.fleet.nodes["n0"].stopped and run.fleet.nodes["n1"].stopped


def test_unreachable_but_answering_node_is_watched_on_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshd answers but the agent never does: the watcher goes on MAX_RECHECKS times, then the
    unreachable decision stands (no recovery, no endless loop)."""
    from launch.run import attempts as attempts_module
    from launch.run import recheck as recheck_module
    from launch.run.reporter import RecordingReporter
    from tests.fakefleet import JobScript, NodeScript, run_on_fake_fleet

    monkeypatch.setattr(recheck_module, "sshd_answers", lambda host, *_: True)
    reporter = RecordingReporter()
    job = JobScript(steps=1000, nodes={"n1": NodeScript(unreachable_from_step=3)})
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        job,
        recovery={"max_restarts": 2},
        stop={"unreachable_timeout_s": 30},
        reporter=reporter,
    )
    assert run.summary.outcome == "failed" and run.summary.rule == "unreachable", run.summary.reason
    said = "\n".join(reporter.lines)
    assert said.count("answered again; not lost, watching on") == attempts_module.MAX_RECHECKS
    assert [a["attempt"] for a in run.records.get(run.summary.run_id).attempts] == [1]


class _LocalNode:
    """A node that is this machine, its home ``home``: each command runs under ``sh -c``."""

    def __init__(self, host: Any, home: Path) -> None:
        self.host, self.home, self.commands = host, home, []  # type: ignore[var-annotated]

    def run(self, command: str, timeout: float | None = None) -> Any:
        from launch.transport.ssh import CommandResult

        self.commands.append(command)
        env = {"HOME": str(self.home), "PATH": "/nonexistent"}  # no python3 on this node's PATH
        proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
        return CommandResult(self.host.name, proc.returncode, proc.stdout, proc.stderr)


def test_checkpoint_listing_runs_the_inventorys_python(tmp_path: Path) -> None:
    """The laptop asks each node for its complete checkpoints with the inventory's interpreter
    (``python:``), as the doctor's probe and the claim do, and reads only complete saves (the
    manifest's sizes match), newest first."""
    import json
    import sys

    from launch.run.checkpoints import checkpoint_dir, complete_steps
    from tests.fakefleet import fake_hosts

    host = fake_hosts(1)[0].model_copy(update={"python": sys.executable})
    for step, complete in ((10, True), (20, True), (30, False)):
        folder = tmp_path / checkpoint_dir("r1") / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(b"x" * 8)
        size = 8 if complete else 9  # a size that does not match: an incomplete save
        (folder / "MANIFEST.json").write_text(
            json.dumps({"step": step, "files": {"model.pt": {"size": size}}})
        )
    node = _LocalNode(host, tmp_path)

    class OneNodeFleet:
        def map(self, fn: Any, hosts: list[Any], deadline: float) -> dict[str, Any]:
            return {h.name: fn(node) for h in hosts}

    assert complete_steps(OneNodeFleet(), [host], "r1") == {host.name: [20, 10]}  # type: ignore[arg-type]
    assert node.commands[0].startswith(sys.executable + " -c ")


def test_renewals_read_back_from_the_record_are_untrusted() -> None:
    """``attempts.json`` is read back on re-attach: only well-formed ``renewed`` entries survive."""
    from launch.run.attempts import attempt_end_from_json

    good = {"node": "n1", "reason": "ECC", "old_address": "a", "new_address": "b", "host_key_changed": True}
    data = {
        "attempt": 1,
        "renewed": [good, {**good, "host_key_changed": "yes"}, {**good, "node": 7}, "n1", None],
    }
    end = attempt_end_from_json(data)
    assert end is not None and [r.to_json() for r in end.renewed] == [good]
    assert attempt_end_from_json({"attempt": 1, "renewed": {"n1": "x"}}).renewed == ()  # type: ignore[union-attr]
