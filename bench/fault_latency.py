"""For each real fault on a local fleet: seconds from the fault to the stop decision, from the
decision to ``fab train`` returning, and to the start of teardown, next to SkyPilot's autostop
check interval (60 s).

Usage (root): .venv/bin/python bench/fault_latency.py
Prints a table and writes bench/results/fault_latency.json. The rules' own thresholds are part of
each figure (a stall can only be called after stall_timeout_s), so they are printed beside it;
the goal is a decision within the threshold + 2 s and the exit within 5 s of the decision.
Environment: FLEETRUN_BENCH_PREFIX / FLEETRUN_BENCH_SUBNET (fleet name and subnet, so a bench
does not collide with a test run), FAULT_LATENCY_TRIALS (link-down repeats, default 3),
FAULT_LATENCY_ONLY (comma-separated keys: kill,stop,link,nan,wall,laptop; default all).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from tests.faultkit import first_metrics, run_with_fault, wait_for, worker_pids  # noqa: E402

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


def scenario(name: str, tmp: Path, book: Path, fault: object, limit_s: float = 0.0) -> dict[str, object]:
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    fleet.up(2, say=lambda _m: None)
    marks: dict[str, float] = {}
    try:
        fault_fn = fault(fleet) if callable(fault) else None
        result = run_with_fault(book, fleet, fault_fn, on_fault=lambda t: marks.__setitem__("fault", t))
        exited = time.time()  # ``fab train`` (app.train) has returned: the user gets the prompt back
    finally:
        subprocess.run(["ip", "link", "set", fleet.veth(1), "up"], check=False, capture_output=True)
        fleet.down(say=lambda _m: None)
    summary = json.loads((result.folder / "summary.json").read_text())
    t0 = marks.get("fault")
    if t0 is None:  # faults carried by the job itself (NaN, plateau, wall time): from the first step
        first = next(
            json.loads(x)["time"]
            for x in (result.folder / "metrics.jsonl").read_text().splitlines()
            if '"step"' in x
        )
        t0 = float(first)
    if "max_wall_time_s" in name:  # the wall-time limit counts from the launch, not a fault
        t0 = started_at(result.folder)
    to_decision = summary["decided_at"] - t0
    return {
        "fault": name,
        "rule": result.rule,
        "limit_s": limit_s,
        "to_decision_s": to_decision,
        "decision_goal_met": to_decision <= limit_s + DECISION_SLACK_S,
        "decision_to_exit_s": exited - summary["decided_at"],
        "exit_goal_met": exited - summary["decided_at"] <= EXIT_GOAL_S,
        "to_teardown_s": (summary["teardown_started_at"] - t0) if summary["teardown_started_at"] else None,
        "teardown": str(result.teardown),
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
            [str(REPO / ".venv" / "bin" / "fab"), "train", str(book), "--inventory", f"local:{PREFIX}"],
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


def main() -> int:
    os.environ.setdefault("FLEETRUN_HOME", tempfile.mkdtemp(prefix="fleetrun-bench-"))
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        long = "--epochs 400 --step-sleep 0.05"

        def kill_rank(fleet: LocalFleet):  # noqa: ANN202
            return lambda: os.kill(worker_pids(fleet.node_name(1))[0], signal.SIGKILL)

        def sigstop(fleet: LocalFleet):  # noqa: ANN202
            return lambda: os.kill(worker_pids(fleet.node_name(1))[0], signal.SIGSTOP)

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
        if "kill" in only:
            rows.append(scenario("kill -9 one rank", tmp, playbook(tmp, long), kill_rank))
        if "stop" in only:
            rows.append(
                scenario(
                    "SIGSTOP one rank (stall_timeout_s=10)",
                    tmp,
                    playbook(tmp, long, stall_timeout_s=10),
                    sigstop,
                    10.0,
                )
            )
        for i in range(trials if "link" in only else 0):
            rows.append(
                scenario(
                    f"link down (unreachable_timeout_s=10) #{i + 1}",
                    tmp,
                    playbook(tmp, long, unreachable_timeout_s=10),
                    partition,
                    10.0,
                )
            )
        if "nan" in only:
            rows.append(scenario("NaN loss at step 20", tmp, playbook(tmp, long + " --nan-at-step 20"), None))
        if "wall" in only:
            rows.append(
                scenario("max_wall_time_s=20", tmp, playbook(tmp, long, max_wall_time_s=20), None, 20.0)
            )
        if "laptop" in only:
            rows.append(laptop_killed(tmp))
    print(
        f"{'fault':44} {'rule':12} {'limit':>6} {'fault->decision':>16} {'decision->exit':>15} "
        f"{'to teardown':>12}"
    )
    for row in rows:
        dec = "-" if row["to_decision_s"] is None else f"{row['to_decision_s']:.1f} s"
        ex = "-" if row.get("decision_to_exit_s") is None else f"{row['decision_to_exit_s']:.1f} s"
        td = "blocked" if row["to_teardown_s"] is None else f"{row['to_teardown_s']:.1f} s"
        limit = f"{row.get('limit_s') or 0:.0f} s"
        print(f"{row['fault']:44} {row['rule']:12} {limit:>6} {dec:>16} {ex:>15} {td:>12}")
    print(f"goal: decision within limit + {DECISION_SLACK_S:.0f} s, exit within {EXIT_GOAL_S:.0f} s of it")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"reference: SkyPilot's autostop checks every {SKYPILOT_AUTOSTOP_CHECK_S:.0f} s (plus a >= 1 min idle threshold)"
    )
    out = REPO / "bench" / "results" / "fault_latency.json"
    out.write_text(
        json.dumps(
            {"rows": rows, "skypilot_autostop_check_s": SKYPILOT_AUTOSTOP_CHECK_S, "load": os.getloadavg()},
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
