"""The same digits job with ``launcher: horovod`` and ``launcher: torchrun`` on a local fleet.

What a user switching launchers would notice: wall time of ``fab train`` end to end, time from
launch to the first logged step (horovodrun's SSH fan-out and Gloo rendezvous vs torchrun's c10d
rendezvous), and setup time, first (environment built) and again (skipped by its hash).

Runs on a fleet of its own (prefix ``bhv``, subnet 9), so it never touches the test fleet, and
removes it at the end. Needs root, and Horovod in the fleet image (``make horovod``). The machine
has 2 cores: run it alone, as concurrent work skews every number.

    .venv/bin/python bench/horovod_vs_torchrun.py            # table + bench/results/horovod_vs_torchrun.json
    .venv/bin/python bench/horovod_vs_torchrun.py --nodes 2 --epochs 3 --repeats 2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "horovod_vs_torchrun.json"
ENTRYPOINTS = {
    "torchrun": "python -m trainer.task --epochs {epochs}",
    "horovod": "python -m trainer.task_horovod --epochs {epochs}",
}


def one_run(playbook: Path, prefix: str) -> dict[str, Any]:
    from launch.cli import app
    from launch.run.wrapup import RunResult

    console = Console(file=io.StringIO(), width=200)
    started = time.monotonic()
    result = app.train(playbook, inventory=f"local:{prefix}", console=console, poll_interval=0.5)
    wall = time.monotonic() - started
    assert isinstance(result, RunResult)
    if not result.ok:
        raise SystemExit(f"{playbook.name}: {result.outcome}: {result.reason}")
    return {
        "wall_s": round(wall, 2),
        "first_step_after_launch_s": round(result.first_step_after_s or float("nan"), 2),
        "setup_s": round(result.timings.get("setup", float("nan")), 2),
        "last_loss": result.last_metrics.get("loss"),
        "world_size": (result.world or {}).get("world_size"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="runs per launcher after the first")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="fleetrun-bench-"))
    os.environ["FLEETRUN_HOME"] = str(home)
    os.environ["FLEETRUN_RUNS"] = str(home / "runs")
    from launch.fleets.local import LocalFleet

    fleet = LocalFleet(prefix="bhv", subnet=9)
    fleet.up(args.nodes, say=lambda _m: None)
    results: dict[str, Any] = {}
    try:
        work = home / "digits"
        shutil.copytree(REPO / "examples" / "digits", work, ignore=shutil.ignore_patterns("__pycache__"))
        for launcher, entry in ENTRYPOINTS.items():
            playbook = home / f"{launcher}.yaml"
            playbook.write_text(
                yaml.safe_dump(
                    {
                        "name": f"bench-{launcher}",
                        "workdir": str(work),
                        "launcher": launcher,
                        "nodes": args.nodes,
                        "procs_per_node": 1,
                        "entrypoint": entry.format(epochs=args.epochs),
                        "env": {"OMP_NUM_THREADS": "1"},
                        "teardown": "never",
                    }
                )
            )
            first = one_run(playbook, fleet.prefix)
            again = [one_run(playbook, fleet.prefix) for _ in range(args.repeats)]
            results[launcher] = {
                "first_run": first,
                "later_runs": again,
                "median_wall_s": statistics.median(r["wall_s"] for r in again),
                "median_first_step_s": statistics.median(r["first_step_after_launch_s"] for r in again),
                "median_setup_skipped_s": statistics.median(r["setup_s"] for r in again),
            }
    finally:
        fleet.down(say=lambda _m: None)
        shutil.rmtree(home, ignore_errors=True)

    report = {
        "what": f"digits MLP, {args.nodes} nodes x 1 process, {args.epochs} epochs, local fleet, Gloo on CPU",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{'launcher':<10} {'first wall':>10} {'first setup':>11} {'wall (med)':>10} {'1st step (med)':>14} {'setup (med)':>11}"
    )
    for launcher, r in results.items():
        print(
            f"{launcher:<10} {r['first_run']['wall_s']:>10.1f} {r['first_run']['setup_s']:>11.1f} "
            f"{r['median_wall_s']:>10.1f} {r['median_first_step_s']:>14.1f} {r['median_setup_skipped_s']:>11.1f}"
        )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
