"""The Slurm fleet kind without a cluster: the inventory file, the exact commands, the parse of
real captured Slurm output (``tests/slurm_captures/``, each with a ``.source`` naming the command
and where it ran), hostile output as data, and the allocation's life against a scripted login
host replaying those captures. Pure, no root; the real slurmctld end-to-end tests are elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from launch.errors import FleetrunError, SpecError
from launch.fleets.kinds.base import TeardownState
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.kinds.slurm import (
    SlurmKind,
    add_extra_job,
    extra_jobs_file,
    load_slurm_inventory,
    read_extra_jobs,
)
from launch.fleets.select import load_inventory
from launch.fleets.slurm import answers, commands
from launch.fleets.slurm.allocation import QueueBusy, wait_granted
from launch.job.fleet_refs import SlurmFleetRef, time_limit_seconds
from launch.job.inventory import Inventory
from launch.reports.run_record import RunRecord
from launch.reports.views import runs_table
from launch.transport.port import CommandResult
from tests.conftest import SAMPLE_HOST_KEYS

CAPTURES = Path(__file__).resolve().parent / "slurm_captures"


def capture(name: str) -> str:
    assert (CAPTURES / f"{name}.source").is_file(), f"{name}: a capture without its source"
    return (CAPTURES / f"{name}.txt").read_text()


def cluster_file(tmp_path: Path, nodes: int = 3, **slurm: object) -> Path:
    login = {"address": "login.lab.example", "user": "alice", "host_key": SAMPLE_HOST_KEYS[3]}
    data = {
        "slurm": {"login": login, "partition": "gpu", "gres": "gpu:8", "time_limit": "04:00:00", **slurm},
        "defaults": {"user": "alice", "proxy_jump": login},
        "hosts": [
            {"name": f"gpu{i}", "address": f"10.1.0.{10 + i}", "host_key": SAMPLE_HOST_KEYS[i]}
            for i in range(nodes)
        ],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- the inventory ---------------------------------------------------------------------------
def test_a_slurm_inventory_loads_through_its_selector(tmp_path: Path) -> None:
    inventory = load_inventory(f"slurm:{cluster_file(tmp_path, exclude=['gpu9'], account='ml')}")
    ref = inventory.fleet
    assert isinstance(ref, SlurmFleetRef)
    assert (ref.partition, ref.account, ref.gres, ref.exclude, ref.job_ids) == (
        "gpu",
        "ml",
        "gpu:8",
        ("gpu9",),
        (),
    )
    assert [h.name for h in ref.nodes] == [h.name for h in inventory.hosts] == ["gpu0", "gpu1", "gpu2"]
    assert (
        inventory.hosts[0].proxy_jump is not None
        and inventory.hosts[0].proxy_jump.address == "login.lab.example"
    )
    assert isinstance(fleet_kind(ref), SlurmKind) and not fleet_kind(ref).can_power_off


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"time_limit": None}, "slurm.time_limit"),
        ({"time_limit": "0"}, "slurm.time_limit"),
        ({"time_limit": "UNLIMITED"}, "slurm.time_limit"),
        ({"partition": "gpu; rm -rf ~"}, "slurm.partition"),
        ({"gres": "gpu:eight"}, "slurm.gres"),
        ({"exclude": ["gpu1 gpu2"]}, "slurm.exclude[0]"),
        ({"login": {"address": "login.lab.example", "user": "alice"}}, "slurm.login.host_key"),
        ({"job_ids": [1]}, "slurm.job_ids"),
        ({"nodes": []}, "slurm.nodes"),
    ],
)
def test_a_bad_slurm_inventory_is_one_line_naming_the_file_and_field(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    path = cluster_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["slurm"].update(change)
    data["slurm"] = {k: v for k, v in data["slurm"].items() if v is not None}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_slurm_inventory(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: field '{field}") and "\n" not in message, message


def test_a_slurm_inventory_refuses_the_keys_that_decide_what_is_destroyed(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "teardown": "pulumi-stack"}))
    with pytest.raises(SpecError, match="field 'teardown': not allowed"):
        load_slurm_inventory(str(path))


def test_time_limits_in_slurms_formats() -> None:
    assert time_limit_seconds("90") == 5400
    assert time_limit_seconds("04:00:00") == 14400
    assert time_limit_seconds("1-02:00:00") == 93600
    assert time_limit_seconds("2-0") == 172800
    for bad in ("0", "00:00:00", "infinite", "-1", "1:2:3:4"):
        with pytest.raises(ValueError):
            time_limit_seconds(bad)


# -- the commands, exactly -------------------------------------------------------------------
def ref(tmp_path: Path, **slurm: object) -> SlurmFleetRef:
    fleet = load_slurm_inventory(str(cluster_file(tmp_path, **slurm))).fleet
    assert isinstance(fleet, SlurmFleetRef)
    return fleet


def test_the_holding_job_asks_for_everything_the_inventory_says(tmp_path: Path) -> None:
    r = ref(tmp_path, account="ml", qos="high", constraint="a100&ib", exclude=["gpu7"])
    assert commands.sbatch_argv(r, 3, "digits-ddp", exclude=("gpu2",)) == [
        "sbatch",
        "--parsable",
        "--job-name=fleetrun-digits-ddp",
        "--partition=gpu",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--exclusive",
        "--time=04:00:00",
        "--no-kill",
        "--no-requeue",
        "--output=/dev/null",
        "--chdir=/tmp",
        "--account=ml",
        "--qos=high",
        "--gres=gpu:8",
        "--constraint=a100&ib",
        "--exclude=gpu7,gpu2",
        "--wrap=exec sleep infinity",
    ]
    assert commands.squeue_job_argv(12) == ["squeue", "-h", "-j", "12", "-o", "%i|%T|%r|%N|%Q"]
    assert commands.scancel_argv((12, 14)) == ["scancel", "12", "14"]


# -- real captured output --------------------------------------------------------------------
def test_the_captured_answers_parse() -> None:
    assert answers.job_id_of_sbatch(capture("sbatch_parsable")) == 1
    assert answers.job_id_of_sbatch("1234;cluster-a\n") == 1234
    running = answers.job_state(capture("squeue_job_running"), 1)
    assert running is not None and running.running and running.nodelist == "capnode1"
    pending = answers.job_state(capture("squeue_job_pending"), 3)
    assert pending is not None and pending.pending and pending.reason == "Priority" and not pending.nodelist
    assert answers.job_state(capture("squeue_job_after_scancel"), 1) is None
    assert answers.queue_position(capture("squeue_partition_pending"), 3) == (2, 2)
    assert answers.queue_position(capture("squeue_partition_pending"), 2) == (1, 2)
    assert answers.hostnames(capture("scontrol_show_hostnames_range")) == [
        "gpu01",
        "gpu02",
        "gpu03",
        "login-a",
    ]
    assert not answers.node_states(capture("sinfo_nodes_allocated"))["capnode1"].lost
    for lost in ("sinfo_nodes_down", "sinfo_nodes_draining"):
        node = answers.node_states(capture(lost))["capnode1"]
        assert node.lost and node.partition == "gpu" and node.gres == "gpu:8"
    assert answers.node_states(capture("sinfo_partition_missing")) == {}


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (answers.hostnames, "gpu1\ngpu2;touch /tmp/pwned\n"),
        (answers.hostnames, "$(reboot)\n"),
        (answers.hostnames, "gpu1\ngpu1\n"),
        (answers.hostnames, "g" * 5000 + "\n"),
        (lambda t: answers.node_states(t), "gpu1`id`|idle|gpu:8|gpu\n"),
        (lambda t: answers.node_states(t), "gpu1|idle|gpu:8\n"),
        (lambda t: answers.job_state(t, 7), "7|RUNNING|None|gpu[1-2];id|1\n"),
        (lambda t: answers.job_state(t, 7), "7|RUNNING|None|a|b|c\n"),
        (answers.job_id_of_sbatch, "Submitted batch job 7; rm -rf /\n"),
        (answers.hostnames, "n\n" * (answers.MAX_ANSWER_BYTES // 2 + 1)),
    ],
)
def test_hostile_slurm_output_is_refused_as_data(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(answers.SlurmAnswerError) as info:
        parse(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_reason_naming_unavailable_nodes_in_slurms_compressed_form_is_read() -> None:
    state = answers.job_state(capture("squeue_job_pending_nodes_drained"), 3)
    assert state is not None and state.reason == "ReqNodeNotAvail, UnavailableNodes:frslmnode[1-2]"
    many = ",".join(f"node{i}" for i in range(500))
    long = answers.job_state(f"3|PENDING|ReqNodeNotAvail, UnavailableNodes:{many}||5\n", 3)
    assert long is not None and len(long.reason) == 200 and long.reason.endswith("...")


def test_an_odd_reason_is_shown_as_unreadable_not_printed() -> None:
    state = answers.job_state("7|PENDING|\x1b[31mowned\x1b[0m||5\n", 7)
    assert state is not None and state.reason == "(unreadable reason)"


# -- the allocation against a scripted login host -------------------------------------------
class ScriptedLogin:
    """The login host as a test double: each command's answer from a queue per command name
    (real captured text), every argv it was asked recorded. Slurm's parsing is what is tested."""

    def __init__(self, script: dict[str, list[CommandResult | str]]) -> None:
        self.script = script
        self.asked: list[list[str]] = []

    def run(self, argv: list[str], timeout: float = 60.0) -> CommandResult:
        self.asked.append(argv)
        key = argv[0] if argv[0] != "squeue" else ("squeue-p" if "-p" in argv else "squeue-j")
        queue = self.script[key]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return answer if isinstance(answer, CommandResult) else CommandResult("login", 0, answer, "")

    def close(self) -> None:
        return None

    def commands(self, name: str) -> list[list[str]]:
        return [a for a in self.asked if a[0] == name]


def running_line(job_id: int, nodelist: str) -> str:
    return capture("squeue_job_running").replace("1|", f"{job_id}|", 1).replace("capnode1", nodelist)


def slurm_inventory(tmp_path: Path) -> Inventory:
    return load_slurm_inventory(str(cluster_file(tmp_path)))


def test_acquire_waits_in_the_queue_and_gives_the_allocated_nodes(tmp_path: Path) -> None:
    inventory = slurm_inventory(tmp_path)
    login = ScriptedLogin(
        {
            "sbatch": ["41\n"],
            "squeue-j": [capture("squeue_job_pending").replace("3|", "41|"), running_line(41, "gpu[1-2]")],
            "squeue-p": ["40|10\n41|9\n"],
            "scontrol": ["gpu2\ngpu1\n"],
        }
    )
    assert isinstance(inventory.fleet, SlurmFleetRef)
    said: list[str] = []
    kind = SlurmKind(inventory.fleet, login)
    from launch.fleets.slurm import allocation

    granted = allocation.wait_granted(
        login,
        inventory.fleet,
        allocation.submit(login, inventory.fleet, 2, "j"),
        said.append,
        wait=True,
        sleep=lambda _s: None,
    )
    assert granted.nodes == ["gpu2", "gpu1"]
    assert said == ["slurm job 41: pending in partition gpu, position 2 of 2 (Priority)"]
    login.script["squeue-j"] = [running_line(41, "gpu[1-2]")]
    got = kind.acquire(inventory, 2, "digits", said.append, wait=True)
    assert [h.name for h in got.hosts] == ["gpu2", "gpu1"]  # Slurm's order: its first is the head
    assert isinstance(got.fleet, SlurmFleetRef) and got.fleet.job_ids == (41,)
    assert login.commands("scontrol")[-1] == ["scontrol", "show", "hostnames", "gpu[1-2]"]
    assert not login.commands("scancel")


def test_without_wait_a_queued_job_is_cancelled_and_the_run_refused(tmp_path: Path) -> None:
    inventory = slurm_inventory(tmp_path)
    assert isinstance(inventory.fleet, SlurmFleetRef)
    pending = capture("squeue_job_pending").replace("3|", "41|").replace("Priority", "Resources")
    login = ScriptedLogin(
        {"sbatch": ["41\n"], "squeue-j": [pending], "squeue-p": ["41|9\n"], "scancel": [""]}
    )
    with pytest.raises(QueueBusy, match=r"Resources, position 1 of 1\); fab train --wait"):
        SlurmKind(inventory.fleet, login).acquire(inventory, 2, "digits", lambda _l: None, wait=False)
    assert login.commands("scancel") == [["scancel", "41"]]


def test_a_node_the_inventory_does_not_pin_is_refused_and_the_job_cancelled(tmp_path: Path) -> None:
    inventory = slurm_inventory(tmp_path)
    assert isinstance(inventory.fleet, SlurmFleetRef)
    login = ScriptedLogin(
        {
            "sbatch": ["41\n"],
            "squeue-j": [running_line(41, "gpu[1,9]")],
            "scontrol": ["gpu1\ngpu9\n"],
            "scancel": [""],
        }
    )
    with pytest.raises(FleetrunError, match="Slurm allocated gpu9, which the inventory does not list"):
        SlurmKind(inventory.fleet, login).acquire(inventory, 2, "digits", lambda _l: None, wait=True)
    assert login.commands("scancel") == [["scancel", "41"]]


def test_a_job_the_scheduler_has_not_looked_at_yet_is_not_said_to_wait(tmp_path: Path) -> None:
    """Reason ``None`` (submitted, not yet scheduled) right after the submit is no queue position
    worth a line: the job usually starts at the next cycle; a real reason is said."""
    undecided = capture("squeue_job_pending").replace("3|", "41|").replace("Priority", "None")
    waiting = capture("squeue_job_pending").replace("3|", "41|").replace("Priority", "Resources")
    login = ScriptedLogin(
        {
            "squeue-j": [undecided, waiting, running_line(41, "gpu1")],
            "squeue-p": ["41|9\n"],
            "scontrol": ["gpu1\n"],
        }
    )
    said: list[str] = []
    wait_granted(
        login, ref(tmp_path), 41, said.append, wait=True, sleep=lambda _s: None, monotonic=lambda: 0.0
    )
    assert said == ["slurm job 41: pending in partition gpu, position 1 of 1 (Resources)"]


def test_a_job_that_ends_in_the_queue_is_an_error(tmp_path: Path) -> None:
    r = ref(tmp_path)
    login = ScriptedLogin({"squeue-j": [capture("squeue_job_after_scancel")]})
    with pytest.raises(FleetrunError, match="squeue no longer knows it"):
        wait_granted(login, r, 41, lambda _l: None, wait=True, sleep=lambda _s: None)


def held_kind(tmp_path: Path, login: ScriptedLogin, monkeypatch: pytest.MonkeyPatch) -> SlurmKind:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    r = ref(tmp_path)
    return SlurmKind(r.model_copy(update={"job_ids": (41,)}), login)


def test_teardown_cancels_only_its_own_job_and_confirms_it_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    login = ScriptedLogin(
        {"scancel": [capture("scancel")], "squeue-j": [capture("squeue_job_after_scancel")]}
    )
    outcome = held_kind(tmp_path, login, monkeypatch).tear_down(lambda _l: None)
    assert outcome.state is TeardownState.DONE
    assert login.commands("scancel") == [["scancel", "41"]]
    forgotten = CommandResult("login", 1, "", capture_source_stderr("squeue_job_unknown"))
    login = ScriptedLogin({"scancel": [""], "squeue-j": [forgotten]})
    assert held_kind(tmp_path, login, monkeypatch).tear_down(lambda _l: None).state is TeardownState.DONE


def capture_source_stderr(name: str) -> str:
    text = (CAPTURES / f"{name}.source").read_text()
    return text.split("stderr: ", 1)[1].strip().strip("'")


def test_teardown_fails_when_squeue_still_shows_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    login = ScriptedLogin({"scancel": [""], "squeue-j": [running_line(41, "gpu1")]})
    outcome = held_kind(tmp_path, login, monkeypatch).tear_down(lambda _l: None)
    assert outcome.state is TeardownState.FAILED and "squeue still shows job 41" in outcome.message


def test_teardown_asks_squeue_once_for_every_job_and_names_the_one_still_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two allocations (the run's and a replacement's): one ``squeue -j 41,4``; a purged id among
    several is left out by squeue with exit 0 (captured), so only the one it shows is held."""
    still = capture("squeue_jobs_one_purged")
    assert still.startswith("4|RUNNING|")
    login = ScriptedLogin({"scancel": [""], "squeue-j": [still]})
    kind = held_kind(tmp_path, login, monkeypatch)
    add_extra_job(41, 4)
    outcome = kind.tear_down(lambda _l: None)
    assert login.commands("squeue") == [["squeue", "-h", "-j", "41,4", "-o", "%i|%T|%r|%N|%Q"]]
    assert outcome.state is TeardownState.FAILED and "squeue still shows job 4" in outcome.message
    assert "job 41," not in outcome.message.split("shows", 1)[1]
    assert read_extra_jobs(41) == (4,)  # kept: the next teardown must still cancel the replacement


def test_the_watchdogs_hook_cancels_the_runs_allocations_and_powers_nothing_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = held_kind(tmp_path, ScriptedLogin({}), monkeypatch).poweroff_hook()
    assert "scancel 41 || true" in hook
    assert not any(word in hook for word in ("shutdown", "poweroff-request", "/sbin/poweroff"))


def test_a_lost_node_is_replaced_by_a_new_allocation_that_excludes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    login = ScriptedLogin(
        {
            "sbatch": ["42\n"],
            "squeue-j": [running_line(42, "gpu2"), capture("squeue_job_after_scancel")],
            "scontrol": ["gpu2\n"],
            "scancel": [""],
        }
    )
    kind = held_kind(tmp_path, login, monkeypatch)
    lost = kind.ref.nodes[1]
    new = kind.replace(lost, lambda _l: None, 60.0)
    assert new is not None and new.name == "gpu2" and new.host_key == SAMPLE_HOST_KEYS[2]
    assert "--exclude=gpu1" in login.commands("sbatch")[0] and "--nodes=1" in login.commands("sbatch")[0]
    assert read_extra_jobs(41) == (42,)
    assert "scancel 41 42 || true" in kind.poweroff_hook()  # the watchdogs end the replacement too
    login.script["squeue-j"] = [capture("squeue_job_after_scancel")]
    assert kind.tear_down(lambda _l: None).state is TeardownState.DONE
    assert login.commands("scancel")[-1] == ["scancel", "41", "42"]
    assert not extra_jobs_file(41).exists()  # every allocation gone: the file of replacements too


def test_a_replacement_slurm_answers_with_two_nodes_is_cancelled_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    login = ScriptedLogin(
        {
            "sbatch": ["42\n"],
            "squeue-j": [running_line(42, "gpu[1-2]")],
            "scontrol": ["gpu1\ngpu2\n"],
            "scancel": [""],
        }
    )
    said: list[str] = []
    kind = held_kind(tmp_path, login, monkeypatch)
    assert kind.replace(kind.ref.nodes[0], said.append, 60.0) is None
    assert login.commands("scancel") == [["scancel", "42"]]
    assert "gpu0: no replacement from Slurm: slurm job 42: 2 nodes for a 1-node job" in said
    assert kind.job_ids() == (41,) and kind.holding().job_ids == (41,), "it never held a node"


def test_a_replacement_allocation_goes_into_the_run_record_and_the_next_attempts_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``replace`` made a second allocation, the recovery's ``note_fleet_held`` puts the
    kind's ``holding()`` in the run's inventory, its watch target and its record: ``fab runs``
    and ``fab show`` name both jobs, and the next attempt's ``srun`` looks among both."""
    from types import SimpleNamespace

    from launch.job.spec import load_job_spec
    from launch.planning.launchers import launcher_class
    from launch.reports.views import render_text, show_run
    from launch.run.attempts import note_fleet_held
    from launch.run.lifecycle import state_for
    from launch.run.records import RunRecords
    from launch.run.reporter import RecordingReporter

    login = ScriptedLogin(
        {"sbatch": ["42\n"], "squeue-j": [running_line(42, "gpu2")], "scontrol": ["gpu2\n"]}
    )
    kind = held_kind(tmp_path, login, monkeypatch)
    assert kind.holding() is kind.ref, "nothing new held: the reference as given"
    fleet = kind.ref.model_copy(update={"ranks_via": "srun"})
    kind = SlurmKind(fleet, login)
    inventory = slurm_inventory(tmp_path).model_copy(update={"fleet": fleet})
    spec = load_job_spec("playbooks/digits-ddp.yaml").model_copy(update={"nodes": 2})
    plan = launcher_class(spec.launcher).for_inventory(inventory).plan(spec, inventory, "r1")
    state = state_for(spec, plan, inventory, tmp_path / "known_hosts", tmp_path)
    with RunRecords(tmp_path / "runs.db") as records:
        rid = records.start(run_id="r1", playbook_name="digits", inventory=inventory.to_yaml_data()).id
        ctx = SimpleNamespace(
            records=records, folder=SimpleNamespace(path=tmp_path), reporter=RecordingReporter()
        )
        assert note_fleet_held(ctx, state, kind.holding()) is state  # type: ignore[arg-type]
        assert kind.replace(kind.ref.nodes[1], lambda _l: None, 60.0) is not None
        after = note_fleet_held(ctx, state, kind.holding())  # type: ignore[arg-type]
        record = records.get(rid)
    assert record is not None and record.scheduler_jobs == "41,42"
    assert [h["name"] for h in record.inventory["hosts"]] == ["gpu0", "gpu1", "gpu2"], "hosts as started"
    assert "41,42" in render_text(show_run(record), width=200)
    for inv in (after.inventory, after.target.inventory):
        assert isinstance(inv.fleet, SlurmFleetRef) and inv.fleet.job_ids == (41, 42)
    next_plan = launcher_class(spec.launcher).for_inventory(after.inventory).plan(spec, after.inventory, "r1")
    assert all("-j 41,42 -w" in (n.launch_script or "") for n in next_plan.nodes)


def test_a_gpu_fault_drains_the_node_only_where_the_inventory_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script: dict[str, list[CommandResult | str]] = {
        "sbatch": ["42\n"],
        "squeue-j": [running_line(42, "gpu2")],
        "scontrol": ["gpu2\n"],
    }
    login = ScriptedLogin(dict(script))
    kind = held_kind(tmp_path, login, monkeypatch)
    assert kind.renew(kind.ref.nodes[1], lambda _l: None, 60.0) is not None
    assert not [a for a in login.commands("scontrol") if a[1] == "update"]
    login = ScriptedLogin({**script, "scontrol": ["", "gpu2\n"]})
    drain = SlurmKind(kind.ref.model_copy(update={"drain_on_fault": True}), login)
    assert drain.renew(kind.ref.nodes[1], lambda _l: None, 60.0) is not None
    assert login.commands("scontrol")[0] == [
        "scontrol",
        "update",
        "nodename=gpu1",
        "state=drain",
        "reason=fleetrun: gpu_fault in run job 41",
    ]


def test_doctor_checks_the_login_host_and_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sinfo = "gpu0|idle|gpu:8|gpu*\ngpu1|down*|gpu:8|gpu*\ngpu2|allocated|gpu:8|gpu*\ngpu3|idle|gpu:8|gpu*\n"
    login = ScriptedLogin({"sinfo": [capture("sinfo_version"), sinfo]})
    lines = held_kind(tmp_path, login, monkeypatch).health()
    assert lines[0] == (
        "ok",
        "login host alice@login.lab.example:22: reached with its pinned key (slurm-wlm 22.05.8)",
    )
    nodes = [(level, line) for level, line in lines if line.startswith("node ")]
    assert nodes == [  # each node the inventory gives, one line
        ("ok", "node gpu0: idle in partition gpu (gpu:8)"),
        ("warning", "node gpu1: down*: Slurm gives it to no run"),
        ("ok", "node gpu2: allocated in partition gpu (gpu:8)"),
    ]
    assert [level for level, line in lines if "gpu3" in line] == ["error"]  # no pinned key for it
    login = ScriptedLogin({"sinfo": [capture("sinfo_version"), "gpu0|idle|gpu:8|gpu*\n"]})
    lines = held_kind(tmp_path, login, monkeypatch).health()
    assert ("warning", "node gpu2: not in partition gpu: no run gets it") in lines
    login = ScriptedLogin({"sinfo": [capture("sinfo_version"), capture("sinfo_partition_missing")]})
    assert held_kind(tmp_path, login, monkeypatch).health()[-1][0] == "error"


# -- the record ------------------------------------------------------------------------------
def test_fab_runs_shows_the_slurm_job_id() -> None:
    base = dict(
        playbook_path=None,
        playbook_name="digits",
        playbook_hash=None,
        git_commit=None,
        launcher="torchrun",
        started_at=1.0,
        ended_at=2.0,
        state="succeeded",
        stop_rule="completed",
        stop_reason=None,
        exit_codes={},
        last_metrics={},
        cost_usd=None,
        run_dir=None,
    )
    slurm = RunRecord(id="r1", inventory={"fleet": {"kind": "slurm", "job_ids": [41, 42]}}, **base)  # type: ignore[arg-type]
    lab = RunRecord(id="r2", inventory={"fleet": {"kind": "lab"}}, **base)  # type: ignore[arg-type]
    assert (slurm.scheduler_jobs, lab.scheduler_jobs) == ("41,42", "")
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(runs_table([slurm, lab]))
    text = console.export_text()
    assert "job" in text.splitlines()[1] or "job" in text and "41,42" in text
    console = Console(width=200, record=True)
    console.print(runs_table([lab]))
    assert "41,42" not in console.export_text() and " job " not in console.export_text()


def test_ranks_via_srun_starts_each_nodes_launcher_as_a_step_of_its_allocation(tmp_path: Path) -> None:
    from launch.job.container import ContainerSpec
    from launch.job.spec import load_job_spec
    from launch.planning.launchers import launcher_class

    spec = load_job_spec("playbooks/digits-ddp.yaml")
    inventory = load_inventory(f"slurm:{cluster_file(tmp_path)}")
    assert isinstance(inventory.fleet, SlurmFleetRef)
    over_ssh = launcher_class(spec.launcher).for_inventory(inventory).plan(spec, inventory, "r1")
    assert all("srun" not in node.launch_script for node in over_ssh.nodes), "ssh is the default"
    srun_ref = inventory.fleet.model_copy(update={"ranks_via": "srun", "job_ids": (41,)})
    inventory = inventory.model_copy(update={"fleet": srun_ref})
    plan = launcher_class(spec.launcher).for_inventory(inventory).plan(spec, inventory, "r1")
    for node in plan.nodes:
        script = node.launch_script or ""
        last = script.strip().splitlines()[-1]
        assert last.startswith('exec srun --jobid="$FLEETRUN_SLURM_JOB" --overlap ')
        assert f"--nodelist={node.host.name} " in last and " sh -c 'python -m torch.distributed.run " in last
        assert "\nFLEETRUN_SLURM_JOB=41\n" in script, "the run's own allocation, never looked up by user"
        assert "squeue" not in script and "-u " not in script
    # after a replacement: the node's holder among the run's own allocations only
    replaced = inventory.model_copy(update={"fleet": srun_ref.model_copy(update={"job_ids": (41, 57)})})
    plan = launcher_class(spec.launcher).for_inventory(replaced).plan(spec, replaced, "r1")
    for node in plan.nodes:
        script = node.launch_script or ""
        assert f"squeue -h -t RUNNING -j 41,57 -w {node.host.name} -o %i | head -n 1" in script
        assert "id -un" not in script, "never the user's first running job on the node"
    boxed = spec.model_copy(update={"container": ContainerSpec(image="docker.io/library/python:3.12")})
    with pytest.raises(SpecError, match="slurm.ranks_via"):
        launcher_class(spec.launcher).for_inventory(inventory).plan(boxed, inventory, "r1")
