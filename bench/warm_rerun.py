"""The warm re-run (issue 33): a second ``fab train`` on a fleet kept warm (``keep_warm_s``), from
the command to the first step, against a first run that had to bring the fleet up and install the
job's requirements. Goal: the warm run takes at most 0.5x the first one.

Both are measured from outside, as a user meets them, on one local fleet of ``--nodes`` nodes:
  * first: ``fab local.up`` (the fleet brought up: namespaces, users, sshd), then ``fab train``
    (the code synced, the node library installed, the job's ``setup:`` and ``requirements:`` run);
  * warm: the same ``fab train`` again, on the fleet the first run kept warm (its sync sends only
    what changed; its setup is skipped while unchanged).
Each is timed from the command's start to the first step rank 0 logs (the ``time`` field of its
first metrics record in the nodes' ``metrics.jsonl``). The job is the digits trainer with the
requirements a training job commonly adds (``--requirements``, default ``tensorboard tqdm``: its
metrics logging and progress bars). They are real packages, installed by fleetrun's real setup
stage (``pip install -r`` in the job's environment on every node) from a wheelhouse in the job's
folder (``--no-index --find-links wheels`` in its requirements file): the nodes are offline, so
the wheels travel with the code, as a download from an index would on a cloud. The wheelhouse is
made once per bench with this machine's ``pip download`` (its configured index), and holds only
the distributions the nodes' interpreter lacks (a node with an index would fetch no others).
The warm run finds the setup hash unchanged and skips the install. The load average is recorded
before and after each trial, and each run's stage timings (``summary.json``) beside it.

Usage (root): .venv/bin/python bench/warm_rerun.py [--trials 3] [--nodes 2] [--requirements tensorboard tqdm]
Prints both medians and the ratio side by side; writes bench/results/warm_rerun.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
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

TAG = os.environ.get("FLEETRUN_TEST_TAG", "")
PREFIX = f"frk{TAG}"[:6]
SUBNET = 3 + int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "0"))
JOB = "bench-warm"
GOAL_RATIO = 0.5
DEADLINE_S = 900.0


def fab(*args: str) -> list[str]:
    return [str(REPO / ".venv" / "bin" / "fab"), *args]


def node_python() -> str:
    from launch.fleets.local import image_python

    return str(image_python())


def wheelhouse(into: Path, requirements: list[str]) -> list[str]:
    """The wheels of ``requirements`` and their dependencies for the nodes' interpreter, less the
    distributions it already has; the names of the wheels kept."""
    into.mkdir(parents=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary=:all:",
            "--dest",
            str(into),
            *requirements,
        ],
        check=True,
        timeout=DEADLINE_S,
    )
    have = subprocess.run(
        [
            node_python(),
            "-c",
            "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    installed = {name.lower().replace("-", "_").replace(".", "_") for name in have}
    kept = []
    for wheel in sorted(into.glob("*.whl")):
        if wheel.name.split("-")[0].lower().replace(".", "_") in installed:
            wheel.unlink()
        else:
            kept.append(wheel.name)
    return kept


def write_job(tmp: Path, nodes: int, wheels: Path, requirements: list[str]) -> Path:
    """The digits trainer with its requirements (installed from its wheelhouse) and a setup line
    that imports them."""
    workdir = tmp / "job"
    shutil.copytree(REPO / "examples" / "digits", workdir)
    shutil.copytree(wheels, workdir / "wheels")
    (workdir / "requirements.txt").write_text(
        "--no-index\n--find-links wheels\n" + "".join(f"{r}\n" for r in requirements)
    )
    modules = ", ".join(["torch", "numpy", *(r.replace("-", "_") for r in requirements)])
    playbook = tmp / "job.json"
    playbook.write_text(
        json.dumps(
            {
                "name": JOB,
                "workdir": str(workdir),
                "nodes": nodes,
                "procs_per_node": 1,
                "entrypoint": "python -m trainer.task --epochs 1",
                "env": {"OMP_NUM_THREADS": "1"},
                "requirements": "requirements.txt",
                "setup": [f"python -c 'import {modules}'"],
                "teardown": "always",
                "keep_warm_s": 600,
            }
        )
    )
    return playbook


def first_step_time(fleet: LocalFleet, nodes: int, since: float) -> float | None:
    """The ``time`` of the first step record in a metrics file written after ``since``."""
    for i in range(nodes):
        for path in (fleet.home(i) / ".fleetrun" / "runs").glob(f"{JOB}*/metrics.jsonl"):
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


def train_to_first_step(fleet: LocalFleet, nodes: int, playbook: Path, since: float) -> tuple[float, int]:
    """Run ``fab train`` to its end; (seconds from ``since`` to its first step, its exit code)."""
    proc = subprocess.Popen(
        fab("train", str(playbook), "--inventory", f"local:{fleet.prefix}"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found: float | None = None
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline and found is None:
        found = first_step_time(fleet, nodes, since)
        if found is None and proc.poll() is not None:
            found = first_step_time(fleet, nodes, since)
            break
        time.sleep(0.1)
    out, _ = proc.communicate(timeout=DEADLINE_S)
    if found is None:
        raise RuntimeError(f"no first step (fab train exited {proc.returncode}): {out[-2000:]}")
    return found - since, proc.returncode


def laptop_timer_gone(home: Path) -> None:
    """The warm fleet's laptop-side timer (a detached process this bench's runs started)."""
    for pid_file in (home / "warm").glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        pid_file.unlink(missing_ok=True)


def run_timings(since: float) -> list[dict[str, Any]]:
    """The stage timings of the bench job's runs that started after ``since`` (``summary.json``)."""
    runs = Path(os.environ.get("FLEETRUN_RUNS") or Path(os.environ["FLEETRUN_HOME"]) / "runs")
    found = []
    for path in runs.glob(f"{JOB}*/summary.json"):
        if path.stat().st_mtime >= since:
            with contextlib.suppress(ValueError, OSError):
                summary = json.loads(path.read_text())
                found.append(
                    (path.stat().st_mtime, summary.get("timings"), summary.get("first_step_after_s"))
                )
    return [{"timings": t, "first_step_after_s": f} for _m, t, f in sorted(found, key=lambda x: x[0])]


def one(tmp: Path, nodes: int, wheels: Path, requirements: list[str]) -> dict[str, Any]:
    playbook = write_job(tmp, nodes, wheels, requirements)
    fleet = LocalFleet(prefix=PREFIX, subnet=SUBNET)
    row: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        since = time.time()
        up = subprocess.run(
            fab("local.up", "--nodes", str(nodes), "--prefix", PREFIX, "--subnet", str(SUBNET)),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        if up.returncode != 0:
            raise RuntimeError(f"fab local.up failed: {(up.stdout + up.stderr)[-2000:]}")
        row["fleet_up_s"] = round(time.time() - since, 2)
        first, rc1 = train_to_first_step(fleet, nodes, playbook, since)
        row["first_to_first_step_s"] = round(first, 2)
        warm_since = time.time()
        warm, rc2 = train_to_first_step(fleet, nodes, playbook, warm_since)
        row["warm_to_first_step_s"] = round(warm, 2)
        row["ratio"] = round(warm / first, 3)
        row["exit_codes"] = [rc1, rc2]
        row["runs"] = run_timings(since)
    finally:
        laptop_timer_gone(Path(os.environ["FLEETRUN_HOME"]))
        fleet.down(say=lambda _m: None)
        row["load_after"] = os.getloadavg()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--requirements", nargs="+", default=["tensorboard", "tqdm"], help="the job's requirements"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "warm_rerun.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the local fleet needs root", file=sys.stderr)
        return 2
    own_home = "FLEETRUN_HOME" not in os.environ
    if own_home:
        os.environ["FLEETRUN_HOME"] = tempfile.mkdtemp(prefix="fleetrun-bench-warm-")
    rows = []
    shared = Path(tempfile.mkdtemp(prefix="fleetrun-bench-wheels-"))
    try:
        kept = wheelhouse(shared / "wheels", args.requirements)
        size = sum(p.stat().st_size for p in (shared / "wheels").iterdir())
        print(f"wheelhouse: {len(kept)} wheels, {size / 1e6:.1f} MB: {', '.join(kept)}", flush=True)
        for trial in range(args.trials):
            with tempfile.TemporaryDirectory() as name:
                row = one(Path(name), args.nodes, shared / "wheels", args.requirements)
            row["trial"] = trial + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        if own_home:
            shutil.rmtree(os.environ["FLEETRUN_HOME"], ignore_errors=True)
    first = statistics.median(r["first_to_first_step_s"] for r in rows)
    warm = statistics.median(r["warm_to_first_step_s"] for r in rows)
    ratio = warm / first
    print(f"\n{args.nodes} nodes, median of {len(rows)}")
    print(f"{'first run (fleet up + setup)':>30} {'warm re-run':>12} {'ratio':>6} {'goal':>6}")
    print(f"{first:>28.1f} s {warm:>10.1f} s {ratio:>6.2f} {GOAL_RATIO:>6.1f}")
    result = {
        "command": "python bench/warm_rerun.py " + " ".join(sys.argv[1:]),
        "nodes": args.nodes,
        "requirements": args.requirements,
        "wheelhouse": {"wheels": kept, "bytes": size},
        "trials": len(rows),
        "median_first_to_first_step_s": round(first, 2),
        "median_warm_to_first_step_s": round(warm, 2),
        "ratio": round(ratio, 3),
        "goal_ratio": GOAL_RATIO,
        "met": ratio <= GOAL_RATIO,
        "rows": rows,
        "cpu_count": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
