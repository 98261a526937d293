"""Container start overhead (issue 34): from ``fab train`` to the first step, the ranks inside the
image vs. in the virtualenv, on the same local fleet. Goal: at most +1 s with the image already
on the nodes.

One ``--containers`` local fleet of ``--nodes`` nodes (``LocalFleet.up(containers=True)``: each
node user's rootless podman, the fleet's image (``launch.fleets.local.container_image``) in the machine's
shared store, so no pull: the pull stage answers "present"). The job is the digits trainer, one epoch.
Both kinds run once untimed first (the virtualenv's setup is built, the node library is
installed, each node user's podman makes its pause process), then ``--trials`` timed runs of
each, alternating, so a change of the machine's load falls on both. Each is timed from the
command's start to the ``time`` of the first step record rank 0 logs. The load average is
recorded before and after each run.

Usage (root): .venv/bin/python bench/containers.py [--trials 3] [--nodes 3]
Prints both medians and the difference; writes bench/results/containers.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.fleets.local.container_image import ensure_container_image  # noqa: E402

TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
PREFIX = f"frb{TAG}"[:6]
SUBNET = 4 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
GOAL_EXTRA_S = 1.0
DEADLINE_S = 900.0


def write_job(tmp: Path, nodes: int, name: str, image: str | None) -> Path:
    workdir = tmp / "job"
    if not workdir.exists():
        shutil.copytree(REPO / "examples" / "digits", workdir)
    job: dict[str, Any] = {
        "name": name,
        "workdir": str(workdir),
        "nodes": nodes,
        "procs_per_node": 1,
        "entrypoint": "python -m trainer.task --epochs 1",
        "env": {"OMP_NUM_THREADS": "1"},
        "teardown": "never",
    }
    if image is not None:
        job["container"] = {"image": image, "runtime": "podman"}
    playbook = tmp / f"{name}.json"
    playbook.write_text(json.dumps(job))
    return playbook


def first_step_time(fleet: LocalFleet, nodes: int, name: str, since: float) -> float | None:
    """The ``time`` of the first step record in a metrics file of job ``name`` written after ``since``."""
    for i in range(nodes):
        for path in (fleet.home(i) / ".fleetrun" / "runs").glob(f"{name}*/metrics.jsonl"):
            if path.stat().st_mtime < since:
                continue
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if (
                        isinstance(record, dict)
                        and "event" not in record
                        and isinstance(record.get("step"), int)
                    ):
                        t = record.get("time")
                        if isinstance(t, int | float) and t >= since:
                            return float(t)
    return None


def to_first_step(fleet: LocalFleet, nodes: int, playbook: Path, name: str) -> float:
    """``fab train`` to its end; seconds from its start to its first step."""
    since = time.time()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{fleet.prefix}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    found = first_step_time(fleet, nodes, name, since)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"fab train exited {proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}")
    return found - since


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "containers.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the local fleet needs root", file=sys.stderr)
        return 2
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-bench-containers-")
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    rows: list[dict[str, Any]] = []
    try:
        fleet.up(args.nodes, containers=True, say=lambda _m: None)
        image = ensure_container_image()
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            books = {
                "virtualenv": write_job(tmp, args.nodes, "bench-ctr-venv", None),
                "image": write_job(tmp, args.nodes, "bench-ctr-image", image),
            }
            jobs = {"virtualenv": "bench-ctr-venv", "image": "bench-ctr-image"}
            for kind, playbook in books.items():  # untimed: setup, node library, pause process
                to_first_step(fleet, args.nodes, playbook, jobs[kind])
            for trial in range(args.trials):
                for kind, playbook in books.items():
                    row: dict[str, Any] = {"trial": trial + 1, "kind": kind, "load_before": os.getloadavg()}
                    row["to_first_step_s"] = round(to_first_step(fleet, args.nodes, playbook, jobs[kind]), 2)
                    row["load_after"] = os.getloadavg()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        left = fleet.down(say=lambda _m: None)
        if own_home:
            shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
        if any(left.values()):
            print(f"the bench's fleet left things behind: {left}", file=sys.stderr)
    venv = statistics.median(r["to_first_step_s"] for r in rows if r["kind"] == "virtualenv")
    inside = statistics.median(r["to_first_step_s"] for r in rows if r["kind"] == "image")
    extra = inside - venv
    print(f"\n{args.nodes} nodes, median of {args.trials}, image already on the nodes")
    print(f"{'virtualenv':>12} {'image':>8} {'extra':>8} {'goal':>6}")
    print(f"{venv:>10.1f} s {inside:>6.1f} s {extra:>+6.1f} s {GOAL_EXTRA_S:>+5.1f} s")
    result = {
        "command": "python bench/containers.py " + " ".join(sys.argv[1:]),
        "nodes": args.nodes,
        "trials": args.trials,
        "runtime": "podman (rootless, per node user)",
        "median_virtualenv_to_first_step_s": round(venv, 2),
        "median_image_to_first_step_s": round(inside, 2),
        "extra_s": round(extra, 2),
        "goal_extra_s": GOAL_EXTRA_S,
        "met": extra <= GOAL_EXTRA_S,
        "rows": rows,
        "cpu_count": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
