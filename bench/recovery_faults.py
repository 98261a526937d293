"""Four faults, one table (issue 19): seconds from the fault to the first resumed step, and steps
recomputed, on one 3-node local fleet, measured from outside.

| fault                                           | goal: fault -> first resumed step | goal: recomputed |
| rank process killed                             | <= 15 s                           | <= 1 interval    |
| worker silent (link down), unreachable 10 s     | <= 25 s                           | <= 1 interval    |
| head silent, no bucket                          | <= 25 s                           | <= 1 interval    |
| spot notice on the head (bucket)                | <= 20 s after the notice          | 0                |
| spot notice on the head, no bucket (extra row)  | <= 20 s after the notice          | 0                |
| head lost with a bucket, 0.5 s after a save     | (none)                            | <= 1 interval    |

Usage (root): .venv/bin/python bench/recovery_faults.py [--trials 3] [--only NAME ...]
Prints a table (medians over the trials) and writes bench/results/recovery_faults.json.

The fleet is made as a user makes it (``local.up --bucket --spot``); the three faults without a
bucket run with the fleet's bucket taken out of its inventory. Faults: the rank's trainer process
on node 2 SIGKILLed (``recovery.on`` lists ``rank_failed``); a node's link taken down (its
processes run on, it answers nothing: a machine gone silent, no reset) and brought back up only
once fleetrun replaces the node (its host key changes: a new machine); ``fab local.preempt``'s
notice on node 0 (without a bucket the laptop copies the post-notice checkpoint off the head
before it goes). "First resumed step": this process (root) reads the nodes' run directories
until a metrics record of attempt 2 appears. The job checkpoints every 5 steps, 0.25 s a step.
Another engineer's peer copy (issue 19) is what makes "head silent, no bucket" resume from a
recent step; without it the run starts over (recomputed = every step done).

"Head lost with a bucket" (issue 33): once rank 0 records a save of step 10 or later
(``checkpoint_saved`` in its metrics), 0.5 s later its node's link goes down and every process of
it is killed; the link comes back for the replacement. With a bucket the step's upload (several
``aws`` calls) and the laptop's peer copy race; the run resumes from the newest of either that
ended. The load average is recorded before and after each row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.cli import runs as history  # noqa: E402
from launch.fleets.local import LocalFleet  # noqa: E402
from launch.fleets.local.spot import serve_notice  # noqa: E402
from tests.faultkit import run_with_fault, wait_for  # noqa: E402

TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
PREFIX = f"frf{TAG}"[:6]
SUBNET = 1 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
STEPS, EVERY, SLEEP, FAULT_AT = 40, 5, 0.25, 12
SCENARIOS: dict[str, tuple[str, float | None, int]] = {
    "rank_killed": ("rank process killed", 15.0, EVERY),
    "worker_silent": ("worker silent (link down), unreachable 10 s", 25.0, EVERY),
    "head_silent": ("head silent, no bucket", 25.0, EVERY),
    "spot_head": ("spot notice on the head (bucket)", 20.0, 0),
    "spot_head_nobucket": ("spot notice on the head, no bucket", 20.0, 0),
    "head_lost_bucket": ("head lost with a bucket, 0.5 s after a save", None, EVERY),
}
WITH_BUCKET = ("spot_head", "head_lost_bucket")
RANK_START = {"value": "fork"}
"""The playbooks' ``rank_start`` (``--rank-start``): ``exec`` measures torchrun's own rank start."""


def playbook(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"bench-{name.replace('_', '-')}",
                "workdir": str(REPO / "tests" / "recovery_job"),
                "nodes": 3,
                "procs_per_node": 1,
                "entrypoint": f"python ckpt_trainer.py --steps {STEPS} --ckpt-every {EVERY} --step-sleep {SLEEP}",
                "env": {"OMP_NUM_THREADS": "1"},
                "rank_start": RANK_START["value"],
                "teardown": "never",
                "recovery": {
                    "max_restarts": 2,
                    "on": ["node_lost", "preempted", "rank_failed"],
                    "grace_s": 5,
                    "confirm_s": 2,
                },
                "stop": {"watcher_lost_after_s": 300, "unreachable_timeout_s": 10},
            }
        )
    )
    return path


def run_dirs(fleet: LocalFleet) -> set[Path]:
    return {p for u in fleet.existing_users() for p in Path(f"/home/{u}/.fleetrun/runs").glob("*")}


def steps_of(fleet: LocalFleet, old: set[Path], later_than: int) -> list[int]:
    """Steps rank 0 logged in attempts after ``later_than`` (wherever rank 0 ran)."""
    found = []
    for run_dir in run_dirs(fleet) - old:
        for path in run_dir.glob("metrics.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    r = json.loads(line)
                    attempt, step = r.get("attempt"), r.get("step")
                    if isinstance(attempt, int) and attempt > later_than and isinstance(step, int):
                        found.append(step)
    return found


def reached(fleet: LocalFleet, old: set[Path], attempt: int, step: int = 1) -> bool:
    """Rank 0 logged ``step`` (or later) in attempt ``attempt`` or a later one."""
    return any(s >= step for s in steps_of(fleet, old, attempt - 1))


def set_bucket(fleet: LocalFleet, saved: dict[str, object], on: bool) -> None:
    """The fleet's bucket in its inventory, or taken out (the no-bucket faults)."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    for key in ("bucket", "s3_endpoint"):
        if on:
            data["fleet"][key] = saved[key]
        else:
            data["fleet"].pop(key, None)
    fleet.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))


def silence(fleet: LocalFleet, i: int) -> None:
    """Take node i's link down; up again once fleetrun replaced it (a new machine), or at the end."""
    key = fleet.node_dir(i) / "ssh_host_ed25519_key.pub"
    before = key.stat().st_mtime_ns
    subprocess.run(["ip", "link", "set", fleet.veth(i), "down"], check=True)

    def replaced() -> bool:
        with contextlib.suppress(OSError):
            return key.stat().st_mtime_ns != before
        return False

    try:
        wait_for(replaced, 300, "the replacement of the silent node")
    finally:
        subprocess.run(["ip", "link", "set", fleet.veth(i), "up"], check=False)


def saves_of(fleet: LocalFleet, old: set[Path]) -> list[tuple[int, int]]:
    """(node, step) of every ``checkpoint_saved`` rank 0 recorded in the new run (attempt 1 only:
    the first run directory holding them)."""
    found = []
    for i in range(3):
        for run_dir in set(Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs").glob("*")) - old:
            path = run_dir / "metrics.jsonl"
            for line in path.read_bytes().splitlines() if path.exists() else []:
                with contextlib.suppress(ValueError, RecursionError):
                    r = json.loads(line)
                    if (
                        isinstance(r, dict)
                        and r.get("event") == "checkpoint_saved"
                        and isinstance(r.get("step"), int)
                    ):
                        found.append((i, r["step"]))
    return found


def lose_head_after_save(fleet: LocalFleet, old: set[Path], marks: dict[str, float]) -> None:
    """0.5 s after rank 0 records a save of step 10+, its node's link down and its processes
    killed; the link up again once fleetrun replaced the node (a new machine)."""
    wait_for(lambda: any(step >= 2 * EVERY for _i, step in saves_of(fleet, old)), 600, "a save of step 10+")
    node, saved = max(((i, s) for i, s in saves_of(fleet, old)), key=lambda x: x[1])
    time.sleep(0.5)
    marks["fault"] = time.time()
    marks["saved_before_fault"] = saved
    key = fleet.node_dir(node) / "ssh_host_ed25519_key.pub"
    before = key.stat().st_mtime_ns
    subprocess.run(["ip", "link", "set", fleet.veth(node), "down"], check=True)
    fleet.stop_node(node)

    def replaced() -> bool:
        with contextlib.suppress(OSError):
            return key.stat().st_mtime_ns != before
        return False

    import threading

    def link_back() -> None:
        try:
            wait_for(replaced, 300, "the replacement of the lost head")
        finally:
            subprocess.run(["ip", "link", "set", fleet.veth(node), "up"], check=False)

    threading.Thread(target=link_back, daemon=True).start()


def kill_rank(fleet: LocalFleet, i: int) -> None:
    """SIGKILL node i's rank (the trainer torchrun started: it carries ``LOCAL_RANK``), not torchrun."""
    pids = subprocess.run(["pgrep", "-u", fleet.node_name(i)], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            if (
                any(v.startswith(b"LOCAL_RANK=") for v in env)
                and b"ckpt_trainer.py" in argv
                and b"torchrun" not in argv
            ):
                os.kill(int(pid), 9)


def one(tmp: Path, fleet: LocalFleet, name: str) -> dict[str, object]:
    old = run_dirs(fleet)
    marks: dict[str, float] = {}
    faults: dict[str, Callable[[], None]] = {
        "rank_killed": lambda: kill_rank(fleet, 2),
        "worker_silent": lambda: silence(fleet, 2),
        "head_silent": lambda: silence(fleet, 0),
        "spot_head": lambda: None if serve_notice(fleet, fleet.node_name(0), 120) else None,
        "spot_head_nobucket": lambda: None if serve_notice(fleet, fleet.node_name(0), 120) else None,
    }

    def fault() -> None:
        if name == "head_lost_bucket":
            lose_head_after_save(fleet, old, marks)
            wait_for(lambda: reached(fleet, old, 2), 300, "the first resumed step")
            marks["resumed"] = time.time()
            marks["first_resumed_step"] = min(steps_of(fleet, old, 1))
            return
        # generous: on a loaded machine torch's start-up alone has taken minutes
        wait_for(lambda: reached(fleet, old, 1, FAULT_AT), 600, f"step {FAULT_AT}")
        marks["fault"] = time.time()
        if name in ("worker_silent", "head_silent"):
            import threading

            threading.Thread(target=faults[name], daemon=True).start()
        else:
            faults[name]()
        wait_for(lambda: reached(fleet, old, 2), 300, "the first resumed step")
        marks["resumed"] = time.time()
        marks["first_resumed_step"] = min(steps_of(fleet, old, 1))

    result = run_with_fault(playbook(tmp, name), fleet, fault)
    with history.open_records() as db:
        record = db.get(result.run_id)
    attempts = record.attempts if record is not None else []
    row: dict[str, object] = {"fault": name, "outcome": result.outcome, "attempts": len(attempts) or 1}
    if "saved_before_fault" in marks:
        row["saved_before_fault"] = int(marks["saved_before_fault"])
    if "resumed" in marks:
        row["fault_to_first_resumed_step_s"] = round(marks["resumed"] - marks["fault"], 1)
    if len(attempts) > 1:
        # rank 0's first step after the fault against the last one before it (any attempt after
        # the first counts: a retry that failed in between still resumed from somewhere)
        last_before = attempts[0].get("last_step")
        if isinstance(last_before, int) and "first_resumed_step" in marks:
            row["steps_recomputed"] = max(0, last_before - (int(marks["first_resumed_step"]) - 1))
        row["recovery_steps_s"] = attempts[1].get("recovery_s")
        row["attempt1_end_after_fault_s"] = round(float(attempts[0]["ended_at"]) - marks["fault"], 1)
        row["launch_to_first_step_s"] = round(marks["resumed"] - float(attempts[1]["started_at"]), 1)
        row["drained"] = attempts[0].get("drained")
        row["resumed_from"] = attempts[1].get("resumed_from")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "recovery_faults.json")
    parser.add_argument("--rank-start", choices=("fork", "exec"), default="fork")
    args = parser.parse_args()
    RANK_START["value"] = args.rank_start
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-faults-"))
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(3, say=lambda _m: None, bucket=True, spot_notices=True)
    saved = dict(yaml.safe_load(fleet.inventory_path.read_text())["fleet"])
    rows: list[dict[str, object]] = []
    try:
        with tempfile.TemporaryDirectory() as name:
            for trial in range(args.trials):
                for scenario in args.only:
                    set_bucket(fleet, saved, on=scenario in WITH_BUCKET)
                    load_before = os.getloadavg()
                    try:
                        row = one(Path(name), fleet, scenario)
                    except Exception as exc:  # noqa: BLE001 - recorded; the other faults still run
                        row = {"fault": scenario, "error": str(exc)[:500]}
                        for i in range(3):  # a fault that timed out may have left a link down
                            subprocess.run(["ip", "link", "set", fleet.veth(i), "up"], check=False)
                    row["trial"] = trial + 1
                    row["load_before"], row["load_after"] = load_before, os.getloadavg()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for i in range(3):
            subprocess.run(["ip", "link", "set", fleet.veth(i), "up"], check=False, capture_output=True)
        fleet.down(say=lambda _m: None)
    table = []
    print(f"{'fault':46} {'n':>2} {'fault->1st resumed step':>24} {'goal':>7} {'recomputed':>10} {'goal':>5}")
    for scenario in args.only:
        label, goal_s, goal_steps = SCENARIOS[scenario]
        mine = [r for r in rows if r["fault"] == scenario]
        times = [t for r in mine if isinstance(t := r.get("fault_to_first_resumed_step_s"), float)]
        steps = [n for r in mine if isinstance(n := r.get("steps_recomputed"), int)]
        median_s = statistics.median(times) if times else None
        median_steps = statistics.median(steps) if steps else None
        table.append(
            {
                "fault": label,
                "trials": len(mine),
                "median_fault_to_first_resumed_step_s": median_s,
                "goal_s": goal_s,
                "median_steps_recomputed": median_steps,
                "goal_steps": goal_steps,
                "met": median_s is not None
                and (goal_s is None or median_s <= goal_s)
                and median_steps is not None
                and median_steps <= goal_steps,
            }
        )
        shown_s = "-" if median_s is None else f"{median_s:.1f} s"
        shown_steps = "-" if median_steps is None else f"{median_steps:g}"
        shown_goal = "-" if goal_s is None else f"{goal_s:.0f} s"
        print(f"{label:46} {len(mine):>2} {shown_s:>24} {shown_goal:>7} {shown_steps:>10} {goal_steps:>5}")
    args.out.write_text(
        json.dumps(
            {
                "table": table,
                "rows": rows,
                "nodes": 3,
                "checkpoint_every_steps": EVERY,
                "step_sleep_s": SLEEP,
                "grace_s": 5,
                "confirm_s": 2,
                "unreachable_timeout_s": 10,
                "load": os.getloadavg(),
                "command": "python bench/recovery_faults.py " + " ".join(sys.argv[1:]),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
