"""Lose a node, keep the run: seconds from a node's loss to the first step of the resumed attempt,
on a 3-node local fleet, measured from outside (goal: at most 30 s, torch start-up included),
next to the same job uninterrupted.

Usage (root): .venv/bin/python bench/recovery.py [--runs N] [--out PATH]
Prints a table and writes bench/results/recovery.json.

"From outside": this process powers node 2 off (every process of its user and its sshd killed,
``LocalFleet.stop_node``, as a preempted VM goes) and notes the time; it then reads the nodes'
run directories itself (root) until a metrics record of attempt 2 appears, and notes that time.
The figure includes noticing the loss, the re-checks that confirm it (``confirm_s``), the
survivors' grace period to checkpoint (``grace_s``), the replacement node (new host key), its
sync and setup (a fresh venv), the checkpoint copied to the nodes that lack it, the rendezvous
and torch's start-up. A cloud adds its provisioning time for the replacement instance.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.cli import runs as history  # noqa: E402
from launch.fleets.local import LocalFleet  # noqa: E402
from tests.faultkit import run_with_fault, wait_for  # noqa: E402

PREFIX, SUBNET = "frrb", 16
GOAL_S = 30.0
STEPS, EVERY, SLEEP = 60, 5, 0.25


def playbook(tmp: Path, grace_s: float, confirm_s: float) -> Path:
    path = tmp / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench-recovery",
                "workdir": str(REPO / "tests" / "recovery_job"),
                "nodes": 3,
                "procs_per_node": 1,
                "entrypoint": f"python ckpt_trainer.py --steps {STEPS} --ckpt-every {EVERY} --step-sleep {SLEEP}",
                "env": {"OMP_NUM_THREADS": "1"},
                "teardown": "never",
                "recovery": {"max_restarts": 2, "grace_s": grace_s, "confirm_s": confirm_s},
                "stop": {"watcher_lost_after_s": 300},
            }
        )
    )
    return path


def run_dirs(fleet: LocalFleet) -> set[Path]:
    return {p for u in fleet.existing_users() for p in Path(f"/home/{u}/.fleetrun/runs").glob("*")}


def records(paths: set[Path]) -> list[dict]:
    found = []
    for run_dir in paths:
        for path in run_dir.glob("metrics.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    return found


def attempt_step(fleet: LocalFleet, old: set[Path], attempt: int, step: int = 1) -> bool:
    return any(
        r.get("attempt") == attempt and isinstance(r.get("step"), int) and r["step"] >= step
        for r in records(run_dirs(fleet) - old)
    )


def one_run(tmp: Path, fleet: LocalFleet, lose: bool, grace_s: float, confirm_s: float) -> dict[str, object]:
    old = run_dirs(fleet)
    marks: dict[str, float] = {}

    def fault() -> None:
        wait_for(lambda: attempt_step(fleet, old, 1, 2 * EVERY + 2), 180, "step 12")
        marks["lost"] = time.time()
        fleet.stop_node(2)
        wait_for(lambda: attempt_step(fleet, old, 2), 180, "the first step of attempt 2")
        marks["resumed"] = time.time()

    started = time.time()
    result = run_with_fault(playbook(tmp, grace_s, confirm_s), fleet, fault if lose else None)
    wall = time.time() - started
    with history.open_records() as db:
        record = db.get(result.run_id)
    attempts = record.attempts if record is not None else []
    row: dict[str, object] = {
        "scenario": "node 2 powered off at step 12" if lose else "uninterrupted",
        "outcome": result.outcome,
        "wall_s": round(wall, 1),
        "first_step_after_launch_s": result.first_step_after_s,
        "attempts": len(attempts) or 1,
        "steps_recomputed": attempts[-1].get("steps_recomputed") if len(attempts) > 1 else 0,
    }
    if lose:
        row["loss_to_first_resumed_step_s"] = round(marks["resumed"] - marks["lost"], 1)
        row["attempt1_end_after_loss_s"] = round(float(attempts[0]["ended_at"]) - marks["lost"], 1)
        row["attempt2_launch_after_loss_s"] = round(float(attempts[1]["started_at"]) - marks["lost"], 1)
        row["recovery_steps_s"] = attempts[1].get("recovery_s")
        row["attempt2_launch_to_first_step_s"] = round(marks["resumed"] - float(attempts[1]["started_at"]), 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2, help="interrupted runs (median reported)")
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--confirm-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "recovery.json")
    args = parser.parse_args()
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(3, say=lambda _m: None)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            rows.append(one_run(tmp, fleet, False, args.grace_s, args.confirm_s))
            for _ in range(args.runs):
                rows.append(one_run(tmp, fleet, True, args.grace_s, args.confirm_s))
    finally:
        fleet.down(say=lambda _m: None)
    lost = [float(r["loss_to_first_resumed_step_s"]) for r in rows if "loss_to_first_resumed_step_s" in r]  # type: ignore[arg-type]
    median = statistics.median(lost) if lost else None
    print(
        f"{'scenario':30} {'outcome':10} {'tries':>5} {'wall':>7} {'loss->1st resumed step':>23} "
        f"{'of which launch->1st step':>26} {'launch->1st step':>17} {'recomputed':>10}"
    )
    for r in rows:
        gap = r.get("loss_to_first_resumed_step_s")
        start = r.get("attempt2_launch_to_first_step_s")
        first = r.get("first_step_after_launch_s")
        print(
            f"{r['scenario']:30} {r['outcome']:10} {r['attempts']:>5} {r['wall_s']:>6.1f}s "
            f"{('-' if gap is None else f'{gap:.1f} s'):>23} {('-' if start is None else f'{start:.1f} s'):>26} "
            f"{('-' if first is None else f'{first:.1f} s'):>17} {r['steps_recomputed']!s:>10}"
        )
    for r in rows:
        if r.get("recovery_steps_s"):
            steps = ", ".join(f"{k} {v:.1f} s" for k, v in r["recovery_steps_s"].items())  # type: ignore[union-attr]
            print(f"  recovery steps: {steps}")
    if median is not None:
        verdict = "meets" if median <= GOAL_S else "misses"
        print(
            f"median loss -> first resumed step: {median:.1f} s ({verdict} the {GOAL_S:.0f} s goal); "
            f"grace_s {args.grace_s:g}, confirm_s {args.confirm_s:g}, checkpoint every {EVERY} steps"
        )
    args.out.write_text(
        json.dumps(
            {
                "rows": rows,
                "median_loss_to_first_resumed_step_s": median,
                "goal_s": GOAL_S,
                "grace_s": args.grace_s,
                "confirm_s": args.confirm_s,
                "checkpoint_every_steps": EVERY,
                "step_sleep_s": SLEEP,
                "load": os.getloadavg(),
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
