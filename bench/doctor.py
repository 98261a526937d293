"""``fab doctor`` wall time on N local-fleet nodes (issue 12: 64 nodes <= 10 s, 256 <= 60 s).

For each size N: a fresh local fleet of N nodes, then the whole ``fab doctor --inventory
local:<prefix>`` process timed ``--repeat`` times (Python start-up, inventory, one probe per node,
the two-step rendezvous port test, the table), healthy fleet so every check runs to the end.

Usage (root): .venv/bin/python bench/doctor.py [--sizes 16 64] [--full] [--repeat 3]
              [--prefix frgd] [--subnet 86] [--out bench/results/doctor.json]
``--full`` adds 256 nodes. Prints a table and writes JSON; goals are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.fleets.local import LocalFleet  # noqa: E402

GOALS_S = {64: 10.0, 256: 60.0}


def time_doctor(prefix: str, env: dict[str, str]) -> tuple[float, int]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), "doctor", "--inventory", f"local:{prefix}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.monotonic() - started
    if proc.returncode != 0:  # the verdict lines (not the table) say why
        lines = [line for line in proc.stdout.splitlines() if "ERROR" in line and "│" not in line]
        print("\n".join(lines[:40]), proc.stderr[-2000:], file=sys.stderr)
    return elapsed, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--full", action="store_true", help="also 256 nodes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prefix", default="frgd")
    parser.add_argument("--subnet", type=int, default=86)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "doctor.json"))
    args = parser.parse_args()
    sizes = list(args.sizes) + ([256] if args.full and 256 not in args.sizes else [])
    home = Path(tempfile.mkdtemp(prefix="fleetrun-bench-doctor-"))
    env = {**os.environ, "FLEETRUN_HOME": str(home), "COLUMNS": "200"}
    os.environ["FLEETRUN_HOME"] = str(home)
    results: list[dict[str, Any]] = []
    for n in sizes:
        fleet = LocalFleet(prefix=args.prefix, subnet=args.subnet)
        fleet.up(n, say=lambda _m: None)
        try:
            runs = [time_doctor(args.prefix, env) for _ in range(args.repeat)]
        finally:
            fleet.down(say=lambda _m: None)
        times = [t for t, _ in runs]
        goal = GOALS_S.get(n)
        results.append(
            {
                "nodes": n,
                "seconds": [round(t, 3) for t in times],
                "median_s": round(statistics.median(times), 3),
                "exit_codes": [rc for _, rc in runs],
                "goal_s": goal,
                "goal_met": None if goal is None else statistics.median(times) <= goal,
            }
        )
    table = Table(title="fab doctor wall time (whole process, healthy local fleet)")
    for column in ("nodes", "median s", "runs s", "exit codes", "goal"):
        table.add_column(column)
    for r in results:
        goal = "-" if r["goal_s"] is None else f"<= {r['goal_s']:g} s: {'met' if r['goal_met'] else 'MISSED'}"
        table.add_row(
            str(r["nodes"]),
            f"{r['median_s']:.2f}",
            ", ".join(f"{t:.2f}" for t in r["seconds"]),
            ", ".join(map(str, r["exit_codes"])),
            goal,
        )
    Console().print(table)
    out = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
