"""The run life cycle (Runner -> Watcher -> wrap-up) on the fake fleet: every outcome, no root.

Each test runs the real ``Runner`` with its real ``Watcher``, stop rules, wrap-up, run folder and
run records; only the transport (``tests/fakefleet.py``) and the clock are fakes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from launch.errors import SpecError
from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LocalFleetRef, StackFleetRef
from launch.job.spec import JobSpec
from launch.reports.views import render_text, runs_table, show_run
from launch.rules.stoprules import Teardown
from launch.run import closing, opening
from launch.run.records import RunRecords
from launch.run.reporter import RichReporter
from launch.run.summary import TRACEBACK_FILE
from launch.run.transfers import Transfers
from launch.run.watching import CRASH_RULE
from tests.fakefleet import FakeClock, JobScript, NodeScript, fake_inventory, run_on_fake_fleet

STOP_COMMAND = " stop "


def stopped_nodes(run: Any) -> list[str]:
    return [name for name, node in run.fleet.nodes.items() if any(STOP_COMMAND in c for c in node.commands)]


@pytest.fixture
def teardowns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Local-fleet teardowns, recorded instead of run (they need root)."""
    calls: list[str] = []

    def fake_tear_down(self: LocalFleetKind, say: Any) -> TeardownOutcome:
        calls.append(self.ref.prefix)
        return TeardownOutcome(
            TeardownState.DONE, f"local fleet {self.ref.prefix} removed; nothing left behind"
        )

    monkeypatch.setattr(LocalFleetKind, "tear_down", fake_tear_down)
    return calls


def local_inventory() -> Any:
    return fake_inventory(2, fleet=LocalFleetRef(prefix="frz"))


# -- outcomes ---------------------------------------------------------------------------------------


def test_succeeded_run_is_stopped_pulled_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=4))
    s = run.summary
    assert (s.outcome, s.rule) == ("succeeded", "completed") and s.ok
    assert s.exit_codes == {"n0": 0, "n1": 0}
    assert s.last_metrics["step"] == 4 and s.rank0_node == "n0"
    assert sorted(stopped_nodes(run)) == ["n0", "n1"] and run.fleet.pulled == ["n0", "n1"]
    assert s.teardown.state is TeardownState.SKIPPED  # teardown: never
    assert (run.folder / "loss.png").exists() and not (run.folder / TRACEBACK_FILE).exists()
    saved = json.loads((run.folder / "summary.json").read_text())
    assert saved["outcome"] == "succeeded" and saved["teardown"]["state"] == "skipped"
    record = run.records.get(s.run_id)
    assert record.state == "succeeded" and record.exit_codes == {"n0": 0, "n1": 0}
    assert record.last_metrics["step"] == 4 and "summary.json" not in record.artifacts


def test_rank_failure_names_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = JobScript(steps=10, nodes={"n1": NodeScript(exit_at_step=2, exit_code=137)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job)
    assert (run.summary.outcome, run.summary.rule, run.summary.failed_node) == ("failed", "rank_failed", "n1")
    assert run.summary.exit_codes["n1"] == 137
    assert run.records.get(run.summary.run_id).stop_rule == "rank_failed"


def test_nan_loss_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=10, nan_at_step=3))
    assert (run.summary.outcome, run.summary.rule) == ("failed", "nan_loss")
    assert sorted(stopped_nodes(run)) == ["n0", "n1"]


def test_stall_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, JobScript(steps=10, stall_at_step=2), stop={"stall_timeout_s": 60}
    )
    assert (run.summary.outcome, run.summary.rule) == ("failed", "stalled")
    assert run.summary.last_metrics["step"] == 2


def test_unreachable_node_fails_the_run_and_blocks_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teardowns: list[str]
) -> None:
    job = JobScript(steps=50, nodes={"n1": NodeScript(unreachable_from_step=2)})
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        job,
        inventory=local_inventory(),
        teardown="always",
        stop={"unreachable_timeout_s": 30},
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", "unreachable")
    assert "n1" in s.stop_errors and "n1" in s.pull_errors
    assert s.teardown.state is TeardownState.BLOCKED and teardowns == []


def test_hung_node_costs_its_timeouts_never_forever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    start = clock.now
    job = JobScript(steps=50, nodes={"n1": NodeScript(hang_from_step=2)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, clock=clock, stop={"unreachable_timeout_s": 30})
    assert (run.summary.outcome, run.summary.rule) == ("failed", "unreachable")
    assert "n1" in run.summary.stop_errors  # the stop on the hung node timed out, reported
    assert clock.now - start >= 30


def test_garbage_answers_read_as_unreachable_and_print_no_control_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = io.StringIO()
    reporter = RichReporter(Console(file=buffer, width=200, force_terminal=False))
    job = JobScript(steps=50, nodes={"n1": NodeScript(garbage_from_step=1)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, reporter=reporter, stop={"unreachable_timeout_s": 30})
    assert (run.summary.outcome, run.summary.rule) == ("failed", "unreachable")
    assert "\x1b" not in buffer.getvalue() and "\x07" not in buffer.getvalue()


def test_operator_stop_wraps_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    clock.interrupt_at = clock.now + 12
    asked: list[str] = []

    def ask(run_id: str) -> bool:
        asked.append(run_id)
        return False

    run = run_on_fake_fleet(
        tmp_path, monkeypatch, JobScript(steps=50), clock=clock, teardown="on_success", ask_keep_running=ask
    )
    assert (run.summary.outcome, run.summary.rule) == ("stopped", "operator")
    assert asked == ["fake-run-1"] and sorted(stopped_nodes(run)) == ["n0", "n1"]
    assert run.summary.teardown.state is TeardownState.SKIPPED
    assert run.records.get("fake-run-1").state == "stopped"


def test_operator_keeps_the_job_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    clock.interrupt_at = clock.now + 12
    with pytest.raises(KeyboardInterrupt):
        run_on_fake_fleet(
            tmp_path, monkeypatch, JobScript(steps=50), clock=clock, ask_keep_running=lambda _r: True
        )
    records = RunRecords(tmp_path / "runs.db")
    assert records.get("fake-run-1").state == "running"  # re-attachable; nothing stopped or recorded as ended


@pytest.mark.parametrize(
    ("node_script", "rule"),
    [
        (NodeScript(fail_preflight=True), "preflight_failed"),
        (NodeScript(fail_sync=True), "sync_failed"),
        (NodeScript(fail_setup=True), "setup_failed"),
    ],
)
def test_pre_launch_failure_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teardowns: list[str], node_script: NodeScript, rule: str
) -> None:
    job = JobScript(nodes={"n1": node_script})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=local_inventory(), teardown="always")
    assert (run.summary.outcome, run.summary.rule, run.summary.failed_nodes) == ("failed", rule, ("n1",))
    assert not any(node.launched for node in run.fleet.nodes.values()) and stopped_nodes(run) == []
    assert run.summary.teardown.state is TeardownState.DONE and teardowns == [
        "frz"
    ]  # the policy still applies
    assert run.records.get("fake-run-1").state == "failed"


def test_preflight_names_the_doctor_verdict_and_skip_doctor_bypasses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = JobScript(nodes={"n1": NodeScript(fail_preflight=True)})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    refused = run_on_fake_fleet(tmp_path / "a", monkeypatch, job)
    assert refused.summary.rule == "preflight_failed"
    assert "n1: rsync: rsync not found on the node's PATH" in refused.summary.reason
    launched = run_on_fake_fleet(tmp_path / "b", monkeypatch, job, skip_doctor=True)
    assert launched.summary.outcome == "succeeded"


def test_pull_failure_blocks_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teardowns: list[str]
) -> None:
    job = JobScript(nodes={"n1": NodeScript(fail_pull=True)})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=local_inventory(), teardown="always")
    assert run.summary.outcome == "succeeded" and list(run.summary.pull_errors) == ["n1"]
    assert run.summary.teardown.blocked and teardowns == []
    assert json.loads((run.folder / "summary.json").read_text())["teardown"]["state"] == "blocked"


@pytest.mark.parametrize(
    ("policy", "fail", "torn_down"),
    [
        ("always", False, True),
        ("always", True, True),
        ("on_success", False, True),
        ("on_success", True, False),
        ("never", False, False),
        ("never", True, False),
    ],
)
def test_teardown_policy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    teardowns: list[str],
    policy: str,
    fail: bool,
    torn_down: bool,
) -> None:
    job = JobScript(steps=5, nodes={"n1": NodeScript(exit_at_step=2)} if fail else {})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=local_inventory(), teardown=policy)
    assert run.summary.ok is not fail
    assert teardowns == (["frz"] if torn_down else [])
    expected = TeardownState.DONE if torn_down else TeardownState.SKIPPED
    assert run.summary.teardown.state is expected


def test_teardown_never_on_the_command_line_is_refused_beside_a_playbooks_keep_warm() -> None:
    """The playbook alone may not pair them (``launch.job.coherence``); ``--teardown never`` comes
    after the playbook is read and must be refused the same way, before anything starts."""
    spec = JobSpec.model_validate(
        {"name": "warm", "workdir": ".", "entrypoint": "python train.py", "keep_warm_s": 600}
    )
    with pytest.raises(SpecError, match=r"^--teardown never: the playbook's field 'keep_warm_s' \(600 s\)"):
        opening.teardown_policy(spec, "never")
    assert opening.teardown_policy(spec, "on_success").teardown is Teardown.ON_SUCCESS
    assert (
        opening.teardown_policy(spec.model_copy(update={"keep_warm_s": None}), "never").teardown
        is Teardown.NEVER
    )


# -- fleetrun's own failures -----------------------------------------------------------------------


class HeartbeatFails(RunRecords):
    def heartbeat(self, run_id: str, now: float, **fields: Any) -> Any:
        raise RuntimeError("disk full [/var/lib]")


def test_exception_in_the_watcher_is_a_failed_run_still_wrapped_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teardowns: list[str]
) -> None:
    records = HeartbeatFails(tmp_path / "runs.db")
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        JobScript(steps=50),
        inventory=local_inventory(),
        teardown="always",
        records=records,
    )
    s = run.summary
    assert (s.outcome, s.rule) == ("failed", CRASH_RULE) and "RuntimeError" in s.reason
    trace = (run.folder / TRACEBACK_FILE).read_text()
    assert "RuntimeError: disk full [/var/lib]" in trace and "heartbeat" in trace
    assert sorted(stopped_nodes(run)) == ["n0", "n1"] and run.fleet.pulled == ["n0", "n1"]
    assert teardowns == ["frz"] and s.traceback == TRACEBACK_FILE
    assert records.get("fake-run-1").state == "failed"


def test_exception_before_the_launch_is_a_failed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_sync(*_a: Any, **_k: Any) -> Any:
        raise KeyError("workdir")

    run = run_on_fake_fleet(tmp_path, monkeypatch, transfers=Transfers(sync=broken_sync))
    assert (run.summary.outcome, run.summary.rule) == ("failed", CRASH_RULE)
    assert "KeyError" in (run.folder / TRACEBACK_FILE).read_text()
    assert stopped_nodes(run) == [] and run.records.get("fake-run-1").state == "failed"


def test_exception_in_the_pull_blocks_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teardowns: list[str]
) -> None:
    def broken_pull(*_a: Any, **_k: Any) -> Any:
        raise OSError(28, "No space left on device")

    def sync(*_a: Any, **_k: Any) -> Any:
        return {h: None for h in ("n0", "n1")}

    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        inventory=local_inventory(),
        teardown="always",
        transfers=Transfers(sync=sync, pull=broken_pull),
    )
    assert run.summary.outcome == "succeeded" and sorted(run.summary.pull_errors) == ["n0", "n1"]
    assert run.summary.teardown.blocked and teardowns == []
    assert "No space left on device" in (run.folder / TRACEBACK_FILE).read_text()
    assert run.records.get("fake-run-1").state == "succeeded"


# -- remote text is data ------------------------------------------------------------------------------


def test_job_message_with_brackets_and_malformed_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    job = JobScript(
        steps=2,
        finish_status="failed",
        finish_message="could not open [/data/shard-7]\x1b]0;owned\x07",
        finish_exit_code=0,  # the status record, not an exit code, says it failed
        world={"world_size": "[bold]", "ranks": [1, {"rank": "[/x]", "host": "\x1b[2J"}, "zz"]},
    )
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, reporter=RichReporter(console))
    assert (run.summary.outcome, run.summary.rule) == ("failed", "reported_failed")
    closing.report(run.summary, RichReporter(console))
    out = buffer.getvalue()
    assert "could not open [/data/shard-7]" in out and "world size [bold]" in out and "[/x]@?[2J" in out
    assert "\x1b" not in out and "\x07" not in out


@pytest.mark.parametrize("world", [None, "x", {"ranks": "x"}, {"ranks": [None]}, {"world_size": {}}])
def test_world_line_takes_any_shape(world: object) -> None:
    line = closing.world_line(world)
    assert line is None or line.plain.startswith("  world size")


# -- fleet kinds in a run ------------------------------------------------------------------------------


def test_lab_run_never_powers_anything_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, teardown="always")
    assert run.summary.teardown.state is TeardownState.KEPT
    for node in run.fleet.nodes.values():
        hook = node.files[".fleetrun/poweroff"]
        assert "not powered off" in hook and "shutdown" not in hook and "poweroff-request" not in hook
        assert node.guard is not None and node.guard["upload_argv"] == []
    assert run.fleet.uploads == []


@pytest.mark.parametrize(
    ("cloud", "argv0", "url"),
    [
        ("aws", ["aws", "s3", "sync"], "s3://fr-x-art/runs/fake-run-1/n1"),
        ("gcp", ["gcloud", "storage", "rsync"], "gs://fr-x-art/runs/fake-run-1/n1"),
    ],
)
def test_stack_run_uploads_with_its_clouds_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cloud: str, argv0: list[str], url: str
) -> None:
    fleet_ref = StackFleetRef(cluster_id="fr-x", cloud=cloud, bucket="fr-x-art")  # type: ignore[arg-type]
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, inventory=fake_inventory(2, fleet=fleet_ref), teardown="always"
    )
    uploads = dict(run.fleet.uploads)
    assert uploads["n1"][: len(argv0)] == argv0
    assert uploads["n1"][-2:] == [".fleetrun/runs/fake-run-1", url]
    guard = run.fleet.nodes["n1"].guard
    assert guard is not None and guard["upload_argv"][-1] == url
    assert "shutdown -h now" in run.fleet.nodes["n1"].files[".fleetrun/poweroff"]
    # an outputs-file inventory has no stack name: fleetrun says so instead of guessing
    assert (
        run.summary.teardown.state is TeardownState.FAILED
        and "fab down --stack" in run.summary.teardown.message
    )


# -- records written by a run, read back by fab show / fab runs -----------------------------------------


def test_records_of_a_priced_run_show_nodes_and_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, JobScript(steps=4), inventory=fake_inventory(2, "g5.xlarge")
    )
    launched_at = json.loads((run.folder / "watch.json").read_text())["started_at"]
    expected = 2 * 1.006 * (run.summary.ended_at - launched_at) / 3600
    record = run.records.get("fake-run-1")
    assert expected > 0 and record.cost_usd == pytest.approx(expected)
    shown = render_text(show_run(record), width=160)
    assert "2: n0, n1" in shown and f"${expected:,.2f}" in shown
    assert f"${expected:,.2f}" in render_text(runs_table(run.records.list()), width=200)


def test_records_of_an_unpriced_run_say_n_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=2))
    record = run.records.get("fake-run-1")
    assert record.cost_usd is None and "n/a" in render_text(runs_table([record]), width=200)
    assert "2: n0, n1" in render_text(show_run(record), width=160)


def test_cost_cap_warning_uses_the_real_price(tmp_path: Path) -> None:
    from launch.job.spec import JobSpec

    spec = JobSpec(name="j", workdir=tmp_path, entrypoint="python t.py", stop={"max_cost_usd": 5})  # type: ignore[arg-type]
    assert opening.launch_warnings(spec, fake_inventory(1, "p4d.24xlarge")) == []
    unpriced = opening.launch_warnings(spec, fake_inventory(1))
    assert len(unpriced) == 1 and "cannot fire" in unpriced[0]


def test_keep_warm_on_a_fleet_that_cannot_keep_it_is_said_at_launch(tmp_path: Path) -> None:
    """``keep_warm_s`` on lab machines or a Slurm allocation was ignored without a word."""
    from launch.fleets.kinds.refs import LocalFleetRef
    from launch.job.spec import JobSpec

    spec = JobSpec(name="j", workdir=tmp_path, entrypoint="python t.py", keep_warm_s=600)  # type: ignore[arg-type]
    (line,) = opening.launch_warnings(spec, fake_inventory(1))
    assert line.startswith("keep_warm_s 600: a lab fleet is not kept warm") and "(always)" in line
    assert opening.launch_warnings(spec, fake_inventory(1, fleet=LocalFleetRef(prefix="frw"))) == []


def test_fab_show_runs_and_logs_read_back_a_fake_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launch.cli import runs as history

    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))  # the commands open $FLEETRUN_HOME/runs.db
    job = JobScript(
        steps=2, finish_status="failed", finish_message="could not open [/data/shard-7]", finish_exit_code=0
    )
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=fake_inventory(2, "p4d.24xlarge"))
    assert run.summary.cost_usd is not None and run.summary.cost_usd >= 0.01
    buffer = io.StringIO()
    console = Console(file=buffer, width=220, force_terminal=False)
    history.show("last", console)
    history.list_runs(console)
    history.logs("fake-run-1", console)
    out = buffer.getvalue()
    assert "2: n0, n1" in out and "could not open [/data/shard-7]" in out and "reported_failed" in out
    assert out.count(f"${run.summary.cost_usd:,.2f}") == 2 and "n/a" not in out  # fab show's panel, fab runs
    assert "[bold]not markup[/bold]" in out and "\x1b" not in out
    # a pulled node.log that is a symlink is never followed
    secret = tmp_path / "secret.txt"
    secret.write_text("API_TOKEN=hunter2\n")
    log = run.folder / "nodes" / "n1" / "node.log"
    log.unlink()
    log.symlink_to(secret)
    buffer.seek(0)
    buffer.truncate(0)
    history.logs("fake-run-1", console, node="n1")
    assert "hunter2" not in buffer.getvalue() and "node.log: not read" in buffer.getvalue()


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_the_end_of_a_run_says_its_outcome_and_teardown_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """The wrap-up's progress lines and the summary (``closing.report``, the life cycle's last
    stages) both printed the outcome line and the teardown line; the summary says them, once."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    job = JobScript(steps=2, finish_status=status, finish_message="done or not", finish_exit_code=0)
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, reporter=RichReporter(console))  # reports at its end
    out = buffer.getvalue()
    assert run.summary.outcome == status
    assert out.count(f"{status} ({run.summary.rule})") == 1, out
    assert out.count("  teardown: ") == 1, out
    assert "skipped: skipped" not in out
    assert out.rstrip().splitlines()[-1].strip().startswith("run folder:")


def test_the_live_tables_node_row_keeps_its_step_and_loss_after_the_node_exited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=2), reporter=RichReporter(console))
    assert run.summary.outcome == "succeeded"
    rows = [line for line in buffer.getvalue().splitlines() if line.startswith("│ n0 ")]
    cells = [c.strip() for c in rows[-1].split("│")[1:-1]]  # the last table: the node has exited
    assert cells[:4] == ["n0", "exited 0", "2", "1"], rows[-1]
