"""``fab sweep``: the grid, the slots, and sweeps on the session's local fleet (3 nodes): four
1-node variants two at a time on disjoint nodes, one sweep id, the compare table; and Ctrl-C in
the middle of one, which stops every variant, records them, and starts no other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.planning.sweep_plan import parse_grid, sample_size, slots_of, variants_of
from launch.run.records import RunRecords
from tests.conftest import (
    REPO,
    STEPS_JOB,
    TEST_PREFIX,
    assert_nothing_running,
    fab,
    needs_root,
    write_playbook,
)


def test_the_grid_makes_every_combination_or_a_random_few() -> None:
    grid = parse_grid(["hyperparameters.lr=0.1,0.01", "nodes=1,2,3"])
    combos = variants_of(grid)
    assert len(combos) == 6 and combos[0] == ["hyperparameters.lr=0.1", "nodes=1"]
    assert combos[-1] == ["hyperparameters.lr=0.01", "nodes=3"]
    drawn = variants_of(grid, sample=4, seed=7)
    assert len(drawn) == 4 and len({tuple(c) for c in drawn}) == 4 and all(c in combos for c in drawn)
    assert drawn == variants_of(grid, sample=4, seed=7), "a seed repeats the draw"
    assert len(variants_of(grid, sample=50)) == 6


def test_a_value_given_twice_runs_once_with_a_warning() -> None:
    """``--grid hyperparameters.lr=0.1,0.1`` ran the same variant twice without a word; values
    are compared as read (``0.10`` is ``0.1``; ``1`` and ``1.0`` are not the same value)."""
    grid = parse_grid(["hyperparameters.lr=0.1,0.1,0.10,0.2", "hyperparameters.width=1,1.0"])
    assert variants_of(grid) == [
        ["hyperparameters.lr=0.1", "hyperparameters.width=1"],
        ["hyperparameters.lr=0.1", "hyperparameters.width=1.0"],
        ["hyperparameters.lr=0.2", "hyperparameters.width=1"],
        ["hyperparameters.lr=0.2", "hyperparameters.width=1.0"],
    ]
    assert grid.repeated == (
        "--grid hyperparameters.lr: 0.1 is the same value as 0.1; that variant runs once",
        "--grid hyperparameters.lr: 0.10 is the same value as 0.1; that variant runs once",
    )


def test_random_on_a_huge_grid_draws_without_building_every_combination() -> None:
    """``--random 2`` over 10^8 combinations built all of them first (MemoryError). In a process
    limited to 1 GiB of address space: a draw from 10^8, and from 100^12 (past a machine integer),
    repeatable with the seed, distinct, and each a real combination of the grid."""
    code = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from launch.planning.sweep_plan import parse_grid, variants_of
small = parse_grid([f"hyperparameters.k{i}=" + ",".join(str(v) for v in range(10)) for i in range(8)])
assert small.size == 10**8
drawn = variants_of(small, 2, seed=5)
assert drawn == variants_of(small, 2, seed=5) and drawn[0] != drawn[1], drawn
assert all(len(c) == 8 and c[i].startswith(f"hyperparameters.k{i}=") for c in drawn for i in range(8)), drawn
huge = parse_grid([f"hyperparameters.h{i}=" + ",".join(str(v) for v in range(100)) for i in range(12)])
assert huge.size == 100**12
many = variants_of(huge, 1000, seed=1)
assert len({tuple(c) for c in many}) == 1000 and many == variants_of(huge, 1000, seed=1)
print("OK", drawn)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), proc.stdout + proc.stderr[-2000:]


def test_the_grid_decodes_an_index_as_the_product_orders_it() -> None:
    grid = parse_grid(["a=1,2", "b=x,y,z"])
    every = [grid.combination(i) for i in range(grid.size)]
    assert every == [[f"a={a}", f"b={b}"] for a in ("1", "2") for b in ("x", "y", "z")]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--random", "0"], "fleetrun: error: --random 0: expected a number of variants >= 1"),
        (["--random", "-1"], "fleetrun: error: --random -1: expected a number of variants >= 1"),
        (["--random", "two"], "fleetrun: error: --random 'two': expected a whole number of variants >= 1"),
        (["--max-failures", "-1"], "fleetrun: error: --max-failures -1: expected 0 (no limit) or more"),
    ],
)
def test_random_zero_and_negative_max_failures_are_refused(
    tmp_path: Path, option: list[str], message: str
) -> None:
    """``--random 0`` ran every combination (and connected to the hosts); ``--max-failures -1``
    read as no limit. Both are one line and exit code 2 before anything is read or reached."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1)
    proc = fab(
        "sweep", str(playbook), "--grid", "hyperparameters.lr=0.1,0.2", "--inventory",
        str(tmp_path / "no-such-inventory.yaml"), *option, home=tmp_path / "home",
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == message, proc.stderr
    assert sample_size(None) is None and sample_size("3") == 3


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "at least one --grid"),
        (["lr"], "expected name=v1,v2"),
        (["lr=0.1,,0.2"], "expected name=v1,v2"),
        (["a..b=1,2"], "dotted path"),
        (["nodes=1,2", "nodes=3"], "given twice"),
    ],
)
def test_a_bad_grid_is_one_line(items: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_grid(items)


def test_slots_are_disjoint_and_must_fit() -> None:
    assert slots_of(["a", "b", "c", "d", "e"], 2, 2) == [["a", "b"], ["c", "d"]]
    with pytest.raises(SpecError, match="need 6 hosts; the inventory has 5"):
        slots_of(["a", "b", "c", "d", "e"], 2, 3)


def test_train_hosts_picks_named_hosts_in_order() -> None:
    from launch.cli.app import only_hosts
    from tests.conftest import sample_inventory

    inv = sample_inventory(3)
    assert [h.name for h in only_hosts(inv, ["n2", "n0"]).hosts] == ["n2", "n0"]
    assert only_hosts(inv, []) is inv
    with pytest.raises(SpecError, match="--hosts: 'n9' is not a host of inventory"):
        only_hosts(inv, ["n9"])


def test_a_bad_variant_stops_the_sweep_before_anything_starts(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1)
    proc = fab("sweep", str(playbook), "--grid", "nodes=1,zero", home=tmp_path / "home")
    assert proc.returncode == 2 and "--set nodes=zero: field 'nodes'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_allow_local_hooks_is_remembered_once_for_every_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fab sweep --allow-local-hooks`` allows the playbook's ``on_end`` as ``fab train`` does
    (its bytes remembered under ``$FLEETRUN_HOME/allowed-hooks``), once, before any variant
    starts; without it nothing is remembered. The variants stand in as a Python that exits 0."""
    import yaml

    from launch.cli import sweep as sweeping
    from launch.run.hooks import playbook_digest
    from tests.fakefleet import fake_inventory

    home = tmp_path / "home"
    monkeypatch.setenv("FLEETRUN_HOME", str(home))
    monkeypatch.setattr(sweeping, "_fab", lambda: [sys.executable, "-c", "pass"])
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1, on_end=["echo done"])
    inventory = tmp_path / "inventory.yaml"
    hosts = fake_inventory(2).to_yaml_data()["hosts"]
    inventory.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    allowance = home / "allowed-hooks" / playbook_digest(playbook)
    said: list[str] = []
    grid = ["hyperparameters.lr=0.1,0.2"]
    plain = sweeping.run_sweep(str(playbook), grid, inventory=str(inventory), say=said.append)
    assert [v.state for v in plain.variants] == ["succeeded", "succeeded"]
    assert not allowance.exists() and not any("on_end" in line for line in said)
    said.clear()
    allowed = sweeping.run_sweep(
        str(playbook), grid, inventory=str(inventory), allow_local_hooks=True, say=said.append
    )
    assert [v.state for v in allowed.variants] == ["succeeded", "succeeded"]
    assert allowance.read_text().strip() == str(playbook.resolve())
    (line,) = [line for line in said if "on_end" in line]
    assert "allowed (--allow-local-hooks, remembered for this file's bytes)" in line, said


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@needs_root()
def test_four_variants_two_at_a_time_on_disjoint_nodes(
    fleet: object, fleetrun_home: Path, tmp_path: Path
) -> None:
    """The job is the torch-free trainer (its final loss falls with the learning rate): the sweep's
    orchestration and records are the subject, not training."""
    playbook = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-sweep",
        nodes=1,
        entrypoint="python steps.py --steps 20",
    )
    runs = tmp_path / "runs"
    proc = fab(
        "sweep", str(playbook), "--inventory", f"local:{TEST_PREFIX}", "--grid", "hyperparameters.lr=0.2,0.1,0.05,0.02",
        "--parallel", "2", home=fleetrun_home, runs=runs, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep_id = proc.stdout.split("sweep ", 1)[1].split(":", 1)[0]
    with RunRecords(fleetrun_home / "runs.db") as records:
        mine = [r for r in records.list(limit=1000) if r.sweep_id == sweep_id]
    assert len(mine) == 4 and all(r.state == "succeeded" for r in mine)
    assert sorted(r.hyperparameters["lr"] for r in mine) == [0.02, 0.05, 0.1, 0.2]
    hosts = {r.id: tuple(h["name"] for h in r.inventory["hosts"]) for r in mine}
    assert all(len(h) == 1 for h in hosts.values()) and len(set(hosts.values())) == 2, hosts
    for a in mine:
        for b in mine:
            if a.id < b.id and hosts[a.id] == hosts[b.id]:
                assert not _overlap((a.started_at, a.ended_at or 0), (b.started_at, b.ended_at or 0)), (
                    "one slot runs its variants one after another"
                )
    listed = fab("runs", "--sweep", sweep_id, "--json", home=fleetrun_home, runs=runs)
    assert {r["id"] for r in json.loads(listed.stdout)} == {r.id for r in mine}
    compare = fab(
        "compare", f"sweep:{sweep_id}", "--plot", str(tmp_path / "c.png"), home=fleetrun_home, runs=runs
    )
    assert compare.returncode == 0, compare.stderr
    assert "fab compare: 4 run(s)" in compare.stdout and (tmp_path / "c.png").stat().st_size > 1000
    rows = json.loads(
        fab("compare", f"sweep:{sweep_id}", "--plot", "", "--json", home=fleetrun_home, runs=runs).stdout
    )
    finals = [row["final"]["loss"] for row in rows]
    assert finals == sorted(finals), "best (lowest final loss) first"


@needs_root()
def test_ctrl_c_stops_the_whole_sweep_and_records_it(
    fleet: object, fleetrun_home: Path, tmp_path: Path
) -> None:
    playbook = write_playbook(
        tmp_path / "job.yaml", STEPS_JOB, name="t-sweep-int", nodes=1,
        entrypoint="python steps.py --steps 100000",
    )  # fmt: skip
    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "FLEETRUN_RUNS": str(tmp_path / "runs")}
    sweep = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "sweep", str(playbook), "--inventory", f"local:{TEST_PREFIX}",
         "--grid", "hyperparameters.lr=0.2,0.1,0.05,0.02", "--parallel", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    sweeps = fleetrun_home / "sweeps"
    deadline = time.monotonic() + 300
    state: dict = {}
    while time.monotonic() < deadline and sweep.poll() is None:
        files = list(sweeps.glob("sw-*/sweep.json")) if sweeps.exists() else []
        files = [f for f in files if "t-sweep-int" in f.read_text() or "job.yaml" in f.read_text()]
        if files:
            state = json.loads(max(files, key=lambda f: f.stat().st_mtime).read_text())
            logs = [Path(v["log"]) for v in state["variants"] if v["state"] == "running" and v["log"]]
            if len(logs) == 2 and all(p.exists() and "first step logged" in p.read_text() for p in logs):
                break
        time.sleep(1)
    assert sweep.poll() is None, sweep.communicate()[0][-3000:]
    sweep.send_signal(signal.SIGINT)
    out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 1, out[-3000:]
    assert "interrupted: no new variant starts" in out
    final = json.loads((sweeps / state["sweep_id"] / "sweep.json").read_text())
    assert final["state"] == "interrupted"
    with RunRecords(fleetrun_home / "runs.db") as records:
        mine = [r for r in records.list(limit=1000) if r.sweep_id == final["sweep_id"]]
    assert len(mine) == 2 and all(r.state in ("stopped", "interrupted", "failed") for r in mine), [
        (r.state, r.stop_rule) for r in mine
    ]
    states = sorted(v["state"] for v in final["variants"])
    assert states == sorted([r.state for r in mine] + ["not started", "not started"]), "as the records say"
    assert all(r.ended_at is not None or r.state == "interrupted" for r in mine)
    assert_nothing_running(fleet)  # type: ignore[arg-type]


FAKE_TRAIN = """
import sys, time
args = sys.argv[1:]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
hosts = args[args.index("--hosts") + 1]
with open(sys.argv[0] + ".calls", "a") as out:
    out.write(hosts + " " + " ".join(sets) + "\\n")
time.sleep(0.2)
sys.exit(1 if "hyperparameters.lr=0.2" in sets or "hyperparameters.lr=0.1" in sets else 0)
"""


def test_a_failure_budget_stops_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestration alone, each variant a stand-in for ``fab train`` that fails for two of the
    learning rates: with --max-failures 2 the sweep stops there and starts nothing more."""
    from launch.cli import sweep as sweeping
    from tests.conftest import SAMPLE_HOST_KEYS

    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    monkeypatch.setattr(sweeping, "_fab", lambda: [__import__("sys").executable, str(fake)])
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1)
    hosts = [
        {"name": f"n{i}", "address": f"203.0.113.{i + 1}", "user": "u", "host_key": SAMPLE_HOST_KEYS[i]}
        for i in range(2)
    ]
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(json.dumps({"hosts": hosts}))
    said: list[str] = []
    result = sweeping.run_sweep(
        str(playbook), ["hyperparameters.lr=0.2,0.2,0.1,0.05,0.02,0.01"], inventory=str(inventory),
        max_failures=2, say=said.append,
    )  # fmt: skip
    assert result.state == "stopped" and any("--max-failures 2" in line for line in said)
    assert "warning: --grid hyperparameters.lr: 0.2 is the same value as 0.2; that variant runs once" in said
    states = [v.state for v in result.variants]
    assert states == ["failed", "failed", "not started", "not started", "not started"], states
    calls = (tmp_path / "fake_train.py.calls").read_text().splitlines()
    assert calls == ["n0 hyperparameters.lr=0.2", "n0 hyperparameters.lr=0.1"], "one slot, in order"
    saved = json.loads((tmp_path / "home" / "sweeps" / result.sweep_id / "sweep.json").read_text())
    assert saved["state"] == "stopped" and [v["state"] for v in saved["variants"]] == states


SLOW_TRAIN = """
import os, signal, sys, time
from pathlib import Path
from launch.job.overrides import overrides_record, parse_overrides
from launch.run.records import RunRecords
args = sys.argv[1:]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
db = Path(os.environ["FLEETRUN_HOME"]) / "runs.db"
with RunRecords(db) as records:  # as fab train records its run
    run = records.start(sweep_id=args[args.index("--sweep") + 1], overrides=overrides_record(parse_overrides(sets)))
with open(sys.argv[0] + ".started", "a") as out:
    out.write("x\\n")
def interrupted(*_args):
    time.sleep(1)  # wrapping up
    with RunRecords(db) as records:
        records.finish(run.id, state="stopped", stop_rule="interrupt")
    with open(sys.argv[0] + ".wrapped", "a") as out:
        out.write("x\\n")
    sys.exit(1)
signal.signal(signal.SIGINT, interrupted)
time.sleep(120)
"""

DRIVER = """
import sys
from launch.cli import sweep
sweep._fab = lambda: [sys.executable, sys.argv[1]]
result = sweep.run_sweep(sys.argv[2], ["hyperparameters.lr=0.2,0.1,0.05,0.02"], inventory=sys.argv[3], parallel=2)
print("STATES", ",".join(v.state for v in result.variants), result.state)
"""


def test_ctrl_c_waits_for_every_running_variant_to_wrap_up(tmp_path: Path) -> None:
    """The orchestration alone: Ctrl-C while two stand-ins for ``fab train`` run (each records its
    run, and records it ``stopped`` when interrupted, as ``fab train`` does); the sweep passes it on
    and ends only after both wrapped up (a Ctrl-C landing in ``Thread.join`` once let it end with
    a variant still running), and ``sweep.json`` says what their records say (it said ``failed``)."""
    from tests.conftest import SAMPLE_HOST_KEYS

    fake = tmp_path / "slow_train.py"
    fake.write_text(SLOW_TRAIN)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1)
    hosts = [
        {"name": f"n{i}", "address": f"203.0.113.{i + 1}", "user": "u", "host_key": SAMPLE_HOST_KEYS[i]}
        for i in range(2)
    ]
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(json.dumps({"hosts": hosts}))
    env = {**os.environ, "FLEETRUN_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(fake), str(playbook), str(inventory)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    started = tmp_path / "slow_train.py.started"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (started.exists() and len(started.read_text().split()) == 2):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "STATES stopped,stopped,not started,not started interrupted" in out, out
    assert len((tmp_path / "slow_train.py.wrapped").read_text().split()) == 2, "both wrapped up first"
    (saved,) = (tmp_path / "home" / "sweeps").glob("*/sweep.json")
    states = [v["state"] for v in json.loads(saved.read_text())["variants"]]
    assert states == ["stopped", "stopped", "not started", "not started"], states


LEAVING_TRAIN = """
import sys, time
from launch.run import sweeps
args = sys.argv[1:]
sweep = args[args.index("--sweep") + 1]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
time.sleep(0.3)
held = sweeps.leave(sweep, "run-" + sets[0])  # what the variant's wrap-up asks at its end
with open(sys.argv[0] + ".ends", "a") as out:
    out.write(f"{sets[0]}|{held}\\n")
"""


@pytest.mark.parametrize("parallel", [1, 2])
def test_each_variant_leaves_the_fleet_to_the_sweep_and_the_last_one_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int
) -> None:
    """The orchestration with its real sweep.json: each stand-in for ``fab train`` asks at its end,
    as a variant's wrap-up does, whether the sweep still needs the fleet; every variant but the
    one that ends last is told to keep it (for the variants to start, or the other slot's still
    running), and exactly one, the last, decides as the playbook says."""
    from launch.cli import sweep as sweeping
    from tests.conftest import SAMPLE_HOST_KEYS

    fake = tmp_path / "leaving_train.py"
    fake.write_text(LEAVING_TRAIN)
    monkeypatch.setattr(sweeping, "_fab", lambda: [sys.executable, str(fake)])
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    workdir = tmp_path / "work"
    workdir.mkdir()
    playbook = write_playbook(tmp_path / "job.yaml", workdir, nodes=1, teardown="always")
    hosts = [
        {"name": f"n{i}", "address": f"203.0.113.{i + 1}", "user": "u", "host_key": SAMPLE_HOST_KEYS[i]}
        for i in range(2)
    ]
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(json.dumps({"hosts": hosts}))
    grid = ["hyperparameters.lr=0.1,0.2,0.3,0.4"]
    result = sweeping.run_sweep(
        str(playbook), grid, inventory=str(inventory), parallel=parallel, say=lambda _l: None
    )
    assert [v.state for v in result.variants] == ["succeeded"] * 4
    ends = [line.split("|", 1) for line in (tmp_path / "leaving_train.py.ends").read_text().splitlines()]
    assert len(ends) == 4 and [held for _sets, held in ends].count("None") == 1, ends
    kept = [held for _sets, held in ends if held != "None"]
    assert all(h.startswith(f"kept for sweep {result.sweep_id} (") for h in kept), kept
    if parallel == 1:  # one after another: the last to start is the last to end
        assert ends[-1] == ["hyperparameters.lr=0.4", "None"] and "3 variant(s) to start" in ends[0][1]
