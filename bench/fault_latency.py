"""For each real fault on a local fleet: seconds from the fault to the stop decision, from the
decision to the ``fab train`` process exiting, and to the start of teardown, next to SkyPilot's autostop
check interval (60 s).

Usage (root): .venv/bin/python bench/fault_latency.py
Prints a table and writes bench/results/fault_latency.json. The rules' own thresholds are part of
each figure (a stall can only be called after stall_timeout_s), so they are printed beside it;
the goal is a decision within the threshold + 2 s and the exit within 5 s of the decision.
Environment: FLEETRUN_BENCH_PREFIX / FLEETRUN_BENCH_SUBNET (fleet name and subnet, so a bench
does not collide with a test run), FAULT_LATENCY_TRIALS (repeats of each
fault kind, interleaved; the table shows medians, default 3),
FAULT_LATENCY_ONLY (comma-separated keys: kill,stop,link,nan,wall,laptop; default all).
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALLOW = ("--allow-path", str(REPO / "examples" / "digits"))
"""The job's code is outside the generated playbook's folder: each ``fab train`` names it."""
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.paths import runs_dir  # noqa: E402
from tests.faultkit import first_metrics, first_worker, wait_for  # noqa: E402

PREFIX = os.environ.get("FLEETRUN_BENCH_PREFIX", "frl")
SUBNET = int(os.environ.get("FLEETRUN_BENCH_SUBNET", "7"))
DECISION_SLACK_S = 2.0
EXIT_GOAL_S = 5.0
SKYPILOT_AUTOSTOP_CHECK_S = 60.0


def playbook(tmp: Path, args: str, **stop: object) -> Path:
    path = tmp / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench-fault",
                "workdir": str(REPO / "examples" / "digits"),
                "nodes": 2,
                "procs_per_node": 1,
                "entrypoint": f"python -m trainer.task {args}",
                "env": {"OMP_NUM_THREADS": "1"},
                "teardown": "always",
                "stop": {"watcher_lost_after_s": 300, **stop},
            }
        )
    )
    return path


def fab_train_with_fault(
    book: Path, fleet: LocalFleet, fault: Callable[[], None] | None, marks: dict[str, float]
) -> tuple[Path, float]:
    """``fab train`` as its own process, as a user runs it; the fault once rank 0 logged a step.

    The exit is when that process has ended: its wrap-up, its printed report, and the
    interpreter's own exit (which joins every worker thread still open) all count."""
    before = set(runs_dir().iterdir()) if runs_dir().exists() else set()
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(book), "--inventory", f"local:{PREFIX}", *ALLOW],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if fault is not None:
            wait_for(lambda: first_metrics(fleet) or fab.poll() is not None, 180, "the first metrics")
            marks["fault"] = time.time()
            fault()
        fab.wait(600)
        exited = time.time()
    finally:
        if fab.poll() is None:
            fab.kill()
    (folder,) = set(runs_dir().iterdir()) - before
    return folder, exited


def scenario(name: str, tmp: Path, book: Path, fault: object, limit_s: float = 0.0) -> dict[str, object]:
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(2, say=lambda _m: None)
    marks: dict[str, float] = {}
    try:
        fault_fn = fault(fleet) if callable(fault) else None
        folder, exited = fab_train_with_fault(book, fleet, fault_fn, marks)
    finally:
        subprocess.run(["ip", "link", "set", fleet.veth(1), "up"], check=False, capture_output=True)
        fleet.down(say=lambda _m: None)
    summary = json.loads((folder / "summary.json").read_text())
    t0 = marks.get("fault")
    if t0 is None:  # faults carried by the job itself: from the first step, or the first NaN loss
        records = [
            json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if '"step"' in x
        ]
        nan = [r for r in records if isinstance(r.get("loss"), float) and not math.isfinite(r["loss"])]
        t0 = float((nan or records)[0]["time"])
    if "max_wall_time_s" in name:  # the wall-time limit counts from the launch, not a fault
        t0 = started_at(folder)
    to_decision = summary["decided_at"] - t0
    return {
        "fault": name,
        "rule": summary["rule"],
        "limit_s": limit_s,
        "to_decision_s": to_decision,
        "decision_goal_met": to_decision <= limit_s + DECISION_SLACK_S,
        "decision_to_exit_s": exited - summary["decided_at"],
        "exit_goal_met": exited - summary["decided_at"] <= EXIT_GOAL_S,
        "to_teardown_s": (summary["teardown_started_at"] - t0) if summary["teardown_started_at"] else None,
        "teardown": f"{summary['teardown']['state']}: {summary['teardown']['message']}"[:200],
        # where the decision -> exit time went: the wrap-up's steps (summary timings), and what
        # came after the summary was built (the record, summary.json, the printed report)
        "wrapup_steps_s": {
            k.removeprefix("wrapup "): round(v, 3)
            for k, v in summary.get("timings", {}).items()
            if k.startswith("wrapup ")
        },
        "summary_to_exit_s": exited - summary["ended_at"],
    }


def started_at(folder: Path) -> float:
    """The launch time the watcher counts wall time from (``watch.json`` in the run folder)."""
    return float(json.loads((folder / "watch.json").read_text())["started_at"])


def laptop_killed(tmp: Path) -> dict[str, object]:
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(2, say=lambda _m: None)
    book = playbook(tmp, "--epochs 400 --step-sleep 0.05", watcher_lost_after_s=10, max_wall_time_s=25)
    try:
        fab = subprocess.Popen(
            [
                str(REPO / ".venv" / "bin" / "fab"),
                "train",
                str(book),
                "--inventory",
                f"local:{PREFIX}",
                *ALLOW,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: first_metrics(fleet), 180, "first metrics")
        killed = time.time()
        fab.kill()
        fab.wait()
        wait_for(lambda: all(fleet.powered_off(i) for i in range(2)), 300, "power-off")
        off = max(float((fleet.node_dir(i) / "powered-off").read_text()) for i in range(2))
    finally:
        fleet.down(say=lambda _m: None)
    return {
        "fault": "laptop watcher killed (wall time 25 s)",
        "rule": "watchdog",
        "to_decision_s": None,
        "to_teardown_s": off - killed,
        "teardown": "nodes powered off by their watchdogs",
    }


def row_line(row: dict[str, object]) -> str:
    steps = ", ".join(f"{k} {v:.2f}" for k, v in row["wrapup_steps_s"].items() if v >= 0.05)  # type: ignore[attr-defined]
    return (
        f"decision {row['to_decision_s']:.1f} s, exit {row['decision_to_exit_s']:.1f} s after "
        f"(wrap-up: {steps}; after the summary {row['summary_to_exit_s']:.2f} s)"
    )


def median_row(rows: list[dict[str, object]]) -> dict[str, object] | None:
    """The kind's medians (decision, exit, teardown); goals judged on the medians."""
    if not rows:
        return None

    def med(key: str) -> float | None:
        values = [float(r[key]) for r in rows if r.get(key) is not None]  # type: ignore[arg-type]
        return statistics.median(values) if values else None

    first = rows[0]
    limit = float(first["limit_s"])  # type: ignore[arg-type]
    to_decision, to_exit = med("to_decision_s"), med("decision_to_exit_s")
    return {
        "fault": first["fault"],
        "rule": first["rule"],
        "limit_s": limit,
        "trials": len(rows),
        "rules_seen": sorted({str(r["rule"]) for r in rows}),
        "to_decision_s": to_decision,
        "decision_goal_met": to_decision is not None and to_decision <= limit + DECISION_SLACK_S,
        "decision_to_exit_s": to_exit,
        "exit_goal_met": to_exit is not None and to_exit <= EXIT_GOAL_S,
        "decision_to_exit_max_s": max(float(r["decision_to_exit_s"]) for r in rows),  # type: ignore[arg-type]
        "to_teardown_s": med("to_teardown_s"),
        "teardown": first["teardown"],
    }


def main() -> int:
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        long = "--epochs 400 --step-sleep 0.05"

        def kill_rank(fleet: LocalFleet):  # noqa: ANN202
            return lambda: os.kill(first_worker(fleet.node_name(1)), signal.SIGKILL)

        def sigstop(fleet: LocalFleet):  # noqa: ANN202
            return lambda: os.kill(first_worker(fleet.node_name(1)), signal.SIGSTOP)

        def partition(fleet: LocalFleet):  # noqa: ANN202
            return lambda: subprocess.run(["ip", "link", "set", fleet.veth(1), "down"], check=True)

        only = set(filter(None, os.environ.get("FAULT_LATENCY_ONLY", "").split(","))) or {
            "kill",
            "stop",
            "link",
            "nan",
            "wall",
            "laptop",
        }
        trials = int(os.environ.get("FAULT_LATENCY_TRIALS", "3"))
        kinds: list[tuple[str, str, str, dict[str, object], object, float]] = [
            ("kill", "kill -9 one rank", long, {}, kill_rank, 0.0),
            ("stop", "SIGSTOP one rank (stall_timeout_s=10)", long, {"stall_timeout_s": 10}, sigstop, 10.0),
            (
                "link",
                "link down (unreachable_timeout_s=10)",
                long,
                {"unreachable_timeout_s": 10},
                partition,
                10.0,
            ),
            ("nan", "NaN loss at step 20", long + " --nan-at-step 20", {}, None, 0.0),
            ("wall", "max_wall_time_s=20", long, {"max_wall_time_s": 20}, None, 20.0),
        ]
        # trials interleaved (kind after kind, then again), so a change of load hits every kind
        for i in range(trials):
            for key, fault, args, stop, inject, limit in kinds:
                if key in only:
                    row = scenario(fault, tmp, playbook(tmp, args, **stop), inject, limit)
                    rows.append({**row, "kind": key, "trial": i + 1, "load_after": os.getloadavg()[0]})
                    print(f"  {fault} #{i + 1}: {row_line(row)}", flush=True)
        if "laptop" in only:
            rows.append(laptop_killed(tmp))
    medians = {key: median_row([r for r in rows if r.get("kind") == key]) for key, *_ in kinds if key in only}
    print(
        f"{'fault (median of ' + str(trials) + ')':44} {'rule':12} {'limit':>6} {'fault->decision':>16} "
        f"{'decision->exit':>15} {'to teardown':>12}"
    )
    for row in [m for m in medians.values() if m] + [r for r in rows if "kind" not in r]:
        dec = "-" if row["to_decision_s"] is None else f"{row['to_decision_s']:.1f} s"
        ex = "-" if row.get("decision_to_exit_s") is None else f"{row['decision_to_exit_s']:.1f} s"
        td = "blocked" if row["to_teardown_s"] is None else f"{row['to_teardown_s']:.1f} s"
        lim = f"{row.get('limit_s') or 0:.0f} s"
        print(f"{row['fault']:44} {row['rule']:12} {lim:>6} {dec:>16} {ex:>15} {td:>12}")
    print(f"goal: decision within limit + {DECISION_SLACK_S:.0f} s, exit within {EXIT_GOAL_S:.0f} s of it")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"reference: SkyPilot's autostop checks every {SKYPILOT_AUTOSTOP_CHECK_S:.0f} s (plus a >= 1 min idle threshold)"
    )
    out = REPO / "bench" / "results" / "fault_latency.json"
    out.write_text(
        json.dumps(
            {
                "medians": medians,
                "trials": trials,
                "rows": rows,
                "skypilot_autostop_check_s": SKYPILOT_AUTOSTOP_CHECK_S,
                "load": os.getloadavg(),
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
