"""GPU health figures (issue 20), measured on real local fleets with the scripted ``nvidia-smi``.

The local fleet has no GPU: the stand-ins of ``tests/gpu_standin`` (``nvidia-smi``, ``dmesg``) are put first on a
node's ``PATH`` (its ``~/.bashrc``, as the fleet tests do), and the code under test is the reader
that runs against the real tool. Every row is the real thing, timed from outside:

``doctor``      ``fab doctor --inventory local:<prefix>`` (the whole process, as bench/doctor.py
                times it) on 64 and 256 nodes, every node with the stand-in (8 GPUs; node 7's
                GPU 1 with 2 uncorrectable ECC errors and an Xid 79), against the same doctor on
                the same fleet without the stand-ins, run after run (pairs, interleaved).
``collective``  ``fab doctor --collective`` on 16 nodes, node 11's link limited with ``tc tbf``:
                the process's wall time until it has named the node, and its measurement count.
``fault``       a real ``fab train`` of a tiny job on 2 nodes; mid-run node 1's stand-in scenario
                is switched to GPU 1 gone with an Xid 79: from the switch to the watcher's stop
                decision (``decided_at`` of the run's ``summary.json``), in poll intervals.
``straggler``   a real ``fab train`` on 3 nodes (``straggler: {window_s: 20, action: stop}``);
                node 2's job processes moved into a cgroup with 3% of a CPU: from the throttle to
                the decision.
``straggler_healthy``  the same training, no node throttled, for ``--healthy-s`` (90 s): whether
                the rule flags a node of a healthy fleet under the machine's load (it must not).
``spare``       a real ``fab train`` of 3 nodes on a lab inventory of 4 (one spare),
                ``recovery.on: [gpu_fault]``; the fault as in ``fault`` on node 1: from the switch
                to the first step logged by the resumed attempt (the metrics record's own time),
                beside torch's own launch-to-first-step (attempt 1's and 2's launch to its first
                step: torchrun, rendezvous, ``import torch``).

The machine is shared (2 cores, other agents' work): the 1-minute load is recorded before and
after each figure; the figures are upper bounds under that load. Goals are printed, never asserted.

Usage (root): .venv/bin/python bench/gpu_health.py [--only doctor collective fault straggler straggler_healthy spare]
              [--sizes 64 256] [--trials 2] [--window 20] [--healthy-s 90]
              [--out bench/results/gpu_health.json]
Rows not run keep their last figures in the JSON, a re-measured row keeps the ones it replaced
under its ``earlier`` (oldest first); the figures of the first version of this bench
(in-process timings and computed latencies) are kept under ``previous``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pwd
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from launch.fleets.local import LocalFleet  # noqa: E402
from launch.nodelib import fleetrun_node  # noqa: E402
from tests.faultkit import wait_for  # noqa: E402
from tests.gpustandin import install, write_scenario, xid  # noqa: E402

ROWS = ("doctor", "collective", "collective_healthy", "fault", "straggler", "straggler_healthy", "spare")
TAG = os.environ.get("FLEETRUN_TEST_TAG", "bh")
BASE = int(os.environ.get("FLEETRUN_TEST_SUBNET_BASE", "160"))
FAB = str(REPO / ".venv" / "bin" / "fab")
NODELIB = REPO / "launch" / "nodelib"
JOB = REPO / "tests" / "recovery_job"
MARK = "# fleetrun bench: nvidia-smi stand-in\n"
PATH_LINE = 'export PATH="$HOME/fakebin:$PATH"\n'
XID79 = xid(1, 79, "2026-11-25T14:02:11", "pid=4242, GPU has fallen off the bus.")
BAD_GPU = {"gpus": [{}, {"ecc_volatile": 2}, {}, {}, {}, {}, {}, {}], "xids": [XID79]}
LOST_GPU = {"gpus": [{}, {"lost": True}, {}, {}, {}, {}, {}, {}], "xids": [XID79]}
HEALTHY = {"count": 8}
POLL_S = 1.0  # ``fab train``'s poll interval (``app.train``'s default; the CLI passes no other)
DOCTOR_GOALS_S = {64: 10.0, 256: 60.0}
SLOW_NODE = 11
NODE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"
CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def load() -> float:
    return round(os.getloadavg()[0], 2)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {load():.1f}] {text}", flush=True)


@contextlib.contextmanager
def local_fleet(prefix: str, subnet: int, nodes: int) -> Iterator[LocalFleet]:
    """A fresh local fleet, brought down whatever happens (an error, Ctrl-C)."""
    fleet = LocalFleet(prefix=prefix, subnet=subnet)
    say(f"{prefix}: {nodes} node(s) coming up")
    started = time.monotonic()
    try:
        fleet.up(nodes, say=lambda _m: None)
        say(f"{prefix}: up in {time.monotonic() - started:.0f} s")
        yield fleet
    finally:
        left = fleet.down(say=lambda _m: None)
        behind = {k: v for k, v in left.items() if v} if isinstance(left, dict) else left
        say(f"{prefix}: down{f', left behind: {behind}' if behind else ''}")


def standin_on(fleet: LocalFleet, i: int, scenario: dict[str, Any]) -> Path:
    """The stand-in in node i's ``~/fakebin``, first on the PATH of its shells (``~/.bashrc``)."""
    user = pwd.getpwnam(fleet.node_name(i))
    fakebin = install(fleet.home(i) / "fakebin", scenario, owner=(user.pw_uid, user.pw_gid))
    path_on(fleet, i)
    return fakebin


def path_on(fleet: LocalFleet, i: int) -> None:
    bashrc = fleet.home(i) / ".bashrc"
    text = bashrc.read_text() if bashrc.exists() else ""
    if MARK not in text:
        bashrc.write_text(MARK + PATH_LINE + text)


def standin_off(fleet: LocalFleet, i: int) -> None:
    bashrc = fleet.home(i) / ".bashrc"
    if bashrc.exists():
        bashrc.write_text(bashrc.read_text().replace(MARK + PATH_LINE, ""))


def run_doctor(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """The whole ``fab doctor`` process, as bench/doctor.py times it."""
    started = time.monotonic()
    proc = subprocess.run(
        [FAB, "doctor", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    return time.monotonic() - started, proc.returncode, proc.stdout + proc.stderr


def reader_cost(tmp: Path) -> dict[str, float]:
    """The node's reader against the stand-in (``fab doctor``'s full read), one node alone: wall
    and CPU seconds (its own and the stand-ins'), the first read (every stand-in script runs) and
    the median of three more (their answers kept, ``tests/gpu_standin/answer.sh``). On this machine
    every node's read competes for the same 2 cores, which a real fleet's nodes do not: N nodes add
    about N x the CPU seconds / 2 to the doctor here."""
    fakebin = install(tmp / "cost", HEALTHY)
    # the PATH a node's sshd gives (the stand-ins then start with Debian's python3, as on the nodes;
    # this machine's pyenv shim costs some 0.3 s a call and was in the first figures)
    env = {**os.environ, "PATH": f"{fakebin}:{NODE_PATH}"}
    code = (
        f"import sys, time, resource; sys.path.insert(0, {str(NODELIB)!r}); import fleetrun_gpu; "
        "t = time.perf_counter(); fleetrun_gpu.read_health(True); w = time.perf_counter() - t; "
        "r = [resource.getrusage(k) for k in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]; "
        "print(w, sum(x.ru_utime + x.ru_stime for x in r))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(4)
    ]
    kept = runs[1:]  # the first renders the stand-ins' answers, the others get them kept (answer.sh)
    return {
        "first_wall_s": round(float(runs[0][0]), 3),
        "first_cpu_s": round(float(runs[0][1]), 3),
        "wall_s": round(statistics.median(float(w) for w, _ in kept), 3),
        "cpu_s": round(statistics.median(float(c) for _, c in kept), 3),
        "load_1m": load(),
    }


GPU_LINE = re.compile(r"^(\S+)\s+(gpu\d+|gpu-health)\s+(ok|WARN|ERROR)\s+(.*)$")


def doctor_row(sizes: list[int], trials: int, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    results = []
    for n in sizes:
        prefix = f"{TAG}d"
        with local_fleet(prefix, BASE, n) as fleet:
            for i in range(n):
                standin_on(fleet, i, BAD_GPU if i == 7 else HEALTHY)
            # one doctor first, not counted: it renders the stand-ins' answers on every node
            # (tests/gpu_standin/answer.sh keeps them), a test artifact's cost a real node lacks
            warmup, warmup_rc, _ = run_doctor(["--inventory", f"local:{prefix}"], env)
            say(
                f"doctor {n} nodes warm-up with stand-ins (renders their answers): {warmup:.1f} s exit {warmup_rc}"
            )
            runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
            for trial in range(trials):
                for kind in ("without", "with"):
                    for i in range(n):
                        if kind == "with":
                            path_on(fleet, i)
                        else:
                            standin_off(fleet, i)
                    before = load()
                    seconds, rc, out = run_doctor(["--inventory", f"local:{prefix}"], env)
                    named = [
                        f"{m.group(1)} {m.group(2)} {m.group(4)}"
                        for m in map(GPU_LINE.match, out.splitlines())
                        if m and m.group(3) == "ERROR"
                    ]
                    other_errors = [
                        line.strip()[:200]
                        for line in out.splitlines()
                        if " ERROR " in line and not GPU_LINE.match(line) and "│" not in line
                    ][:5]
                    runs[kind].append(
                        {
                            "trial": trial + 1,
                            "seconds": round(seconds, 2),
                            "exit": rc,
                            "gpu_errors": named[:5],
                            "other_errors": other_errors,
                            "load_1m": [before, load()],
                        }
                    )
                    say(f"doctor {n} nodes {kind} stand-ins: {seconds:.1f} s exit {rc} {named[:2]}")
        med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
        results.append(
            {
                "nodes": n,
                "gpus": 8 * n,
                "median_with_s": round(med["with"], 2),
                "median_without_s": round(med["without"], 2),
                "ratio": round(med["with"] / med["without"], 2),
                "warmup_with_s": round(warmup, 2),
                "goal_s": DOCTOR_GOALS_S.get(n),
                "runs": runs,
            }
        )
    return {
        "what": "fab doctor, whole process, every node with the nvidia-smi stand-in (8 GPUs, node 7 bad) vs none",
        "reader_against_standin_one_node": reader_cost(tmp),
        "results": results,
    }


def collective_row(trials: int, env: dict[str, str], rate: str) -> dict[str, Any]:
    prefix = f"{TAG}c"
    runs: list[dict[str, Any]] = []
    with local_fleet(prefix, BASE + 1, 16) as fleet:
        slow = fleet.node_name(SLOW_NODE)
        tbf = [
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kbit",
            "latency",
            "400ms",
        ]
        if rate:  # else the same test on a healthy fleet: what the launches cost by themselves
            subprocess.run(["ip", "netns", "exec", fleet.netns(SLOW_NODE), *tbf], check=True)
        try:
            folder = Path(env["FLEETRUN_HOME"]) / "runs" / "collective"
            for trial in range(trials):
                before_files = set(folder.glob("*.json")) if folder.exists() else set()
                before = load()
                seconds, rc, out = run_doctor(
                    ["--collective", "--inventory", f"local:{prefix}", "--port", "29611"], env
                )
                line = re.compile(r"^(\S+)\s+collective\s+(ok|WARN|ERROR)\s+(.*)$")
                named = [m.group(1) for m in map(line.match, out.splitlines()) if m and m.group(2) == "ERROR"]
                saved = sorted(set(folder.glob("*.json")) - before_files) if folder.exists() else []
                record = json.loads(saved[-1].read_text()) if saved else {}
                runs.append(
                    {
                        "trial": trial + 1,
                        "seconds": round(seconds, 1),
                        "exit": rc,
                        "named": named,
                        "slow_named": named == ([slow] if rate else []),
                        "collective_s": record.get("seconds"),
                        "measurements": len(record.get("groups", [])) if record else None,
                        "fleet_gbps": record.get("fleet_gbps"),
                        "suspected": record.get("suspected"),
                        "confirmed": record.get("slow"),
                        "per_node_gbps": record.get("per_node_gbps"),
                        "load_1m": [before, load()],
                    }
                )
                say(
                    f"collective trial {trial + 1}: {seconds:.1f} s, named {named}, {runs[-1]['measurements']} measurements"
                )
                if not saved:
                    print(out[-3000:], file=sys.stderr)
        finally:
            if rate:
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        fleet.netns(SLOW_NODE),
                        "tc",
                        "qdisc",
                        "del",
                        "dev",
                        "eth0",
                        "root",
                    ],
                    check=False,
                )
    times = [r["seconds"] for r in runs]
    return {
        "what": "fab doctor --collective, 16 nodes, "
        + (f"{slow} limited to {rate} (tc tbf)" if rate else "no link slowed"),
        "slow_node": slow if rate else None,
        "median_s": round(statistics.median(times), 1),
        "goal_s": 60.0,
        "runs": runs,
    }


# -- rows on a training fleet: a real ``fab train`` of a tiny job ---------------------------------


def lab_inventory(fleet: LocalFleet, hosts: int, folder: Path) -> Path:
    path = folder / f"lab-{hosts}.yaml"
    path.write_text(yaml.safe_dump({"hosts": fleet.inventory().to_yaml_data()["hosts"][:hosts]}))
    return path


def job(folder: Path, name: str, nodes: int, entrypoint: str, **fields: Any) -> Path:
    path = folder / f"{name}.yaml"
    data = {
        "name": name,
        "workdir": str(JOB),
        "nodes": nodes,
        "procs_per_node": 1,
        "entrypoint": entrypoint,
        "env": {"OMP_NUM_THREADS": "1"},
        "teardown": "never",
        **fields,
    }
    data["stop"] = {"watcher_lost_after_s": 300, **data.get("stop", {})}
    path.write_text(yaml.safe_dump(data))
    return path


def run_dirs(fleet: LocalFleet) -> set[Path]:
    return {p for u in fleet.existing_users() for p in Path(f"/home/{u}/.fleetrun/runs").glob("*")}


def records(fleet: LocalFleet, old: set[Path]) -> list[dict[str, Any]]:
    """Rank 0's metric records of the new run (wherever rank 0 ran, every attempt)."""
    found = []
    for run_dir in run_dirs(fleet) - old:
        for path in run_dir.glob("metrics.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and isinstance(record.get("step"), int):
                        found.append(record)
    return found


def step_at_least(fleet: LocalFleet, old: set[Path], step: int) -> bool:
    return any(r["step"] >= step for r in records(fleet, old))


class Train:
    """``fab train`` as its own process, as a user runs it; killed if still running at the end."""

    def __init__(self, book: Path, inventory: str, env: dict[str, str], log: Path) -> None:
        from launch.paths import runs_dir

        self.runs = runs_dir()
        self.before = set(self.runs.iterdir()) if self.runs.exists() else set()
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [FAB, "train", str(book), "--inventory", inventory],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout: float = 600) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        new = sorted(set(self.runs.iterdir()) - self.before) if self.runs.exists() else []
        for folder in new:
            if (folder / "summary.json").exists():
                return {"folder": str(folder), **json.loads((folder / "summary.json").read_text())}
        return {"folder": None, "outcome": None}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def attempts(run_id: str) -> list[dict[str, Any]]:
    from launch.cli import runs as history

    with history.open_records() as db:
        record = db.get(run_id)
    return list(record.attempts) if record is not None else []


def fault_trial(fleet: LocalFleet, tmp: Path, env: dict[str, str], trial: int) -> dict[str, Any]:
    fakebin = standin_on(fleet, 1, HEALTHY)
    book = job(
        tmp, "bench-gpu-fault", 2, "python ckpt_trainer.py --steps 400 --ckpt-every 50 --step-sleep 0.25"
    )
    old = run_dirs(fleet)
    train = Train(book, str(lab_inventory(fleet, 2, tmp)), env, tmp / f"fault-{trial}.log")
    try:
        wait_for(lambda: step_at_least(fleet, old, 8) or not train.running(), 240, "step 8")
        before = load()
        switched = time.time()
        write_scenario(fakebin, LOST_GPU)
        summary = train.finish(300)
    finally:
        train.kill()
        write_scenario(fakebin, HEALTHY)
        standin_off(fleet, 1)
    decided = summary.get("decided_at")
    row = {
        "trial": trial,
        "outcome": summary.get("outcome"),
        "rule": summary.get("rule"),
        "reason": (summary.get("reason") or "")[:300],
        "load_1m": [before, load()],
    }
    if isinstance(decided, float):
        row["switch_to_decision_s"] = round(decided - switched, 2)
        row["polls"] = round((decided - switched) / POLL_S, 2)
    say(f"gpu_fault trial {trial}: {row.get('switch_to_decision_s')} s, {row['rule']}")
    return row


def fault_row(fleet: LocalFleet, trials: int, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    runs = [fault_trial(fleet, tmp, env, t + 1) for t in range(trials)]
    polls = [r["polls"] for r in runs if "polls" in r and r["rule"] == "gpu_fault"]
    return {
        "what": "fab train, 2 nodes; node 1's stand-in switched to GPU 1 gone + Xid 79: switch -> stop decision",
        "poll_s": POLL_S,
        "agent_gpu_read_every_s": fleetrun_node.GPU_READ_EVERY_S,
        "median_polls": statistics.median(polls) if polls else None,
        "max_polls": max(polls) if polls else None,
        "goal_polls": 2,
        "runs": runs,
    }


def job_pids(user: str) -> list[int]:
    """Processes of ``user`` that carry a run's ``FLEETRUN_RUN_ID`` (the job, not the node agent)."""
    uid = pwd.getpwnam(user).pw_uid
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"FLEETRUN_RUN_ID=") for v in environ):
            found.append(int(entry.name))
    return found


class PaceSampler:
    """What the straggler rule sees, sampled from outside: every 0.5 s, each node's pace (its
    ranks' ``pace/*.json``, as the node agent reads them) and the slow node's ratio to the median
    node (``pace_ratios``), kept whenever a pace file was rewritten. It says how much of the
    throttle-to-flag time is the pace showing the throttle, and how often the ratio dipped under
    the factor (which starts the window over)."""

    def __init__(self, fleet: LocalFleet, old: set[Path], slow: str) -> None:
        self.fleet, self.old, self.slow = fleet, old, slow
        self.timeline: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def paces(self) -> tuple[dict[str, Any], float | None]:
        from launch.rules.stragglers import parse_pace

        found: dict[str, Any] = {}
        newest = None
        for user in self.fleet.existing_users():
            reading = None
            for run_dir in set(Path(f"/home/{user}/.fleetrun/runs").glob("*")) - self.old:
                reading = fleetrun_node.pace_reading(str(run_dir))
                if reading is not None and user == self.slow:
                    times = [
                        json.loads(p.read_text()).get("time", 0) for p in (run_dir / "pace").glob("*.json")
                    ]
                    newest = max(times) if times else None
            found[user] = parse_pace(reading) if reading else None
        return found, newest

    def run(self) -> None:
        from launch.rules.stragglers import pace_ratios

        seen = None
        while not self.stop.wait(0.5):
            with contextlib.suppress(Exception):  # a file being replaced: the next round reads it
                paces, newest = self.paces()
                if newest is not None and newest != seen:
                    seen = newest
                    ratio = pace_ratios(paces).get(self.slow)
                    if ratio is not None:
                        self.timeline.append((newest, ratio))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def straggler_trial(
    fleet: LocalFleet, tmp: Path, env: dict[str, str], trial: int, window: float
) -> dict[str, Any]:
    cgroup = CGROUP_ROOT / f"fleetrun-{TAG}-straggler-bench"
    book = job(
        tmp,
        "bench-straggler",
        3,
        "python ckpt_trainer.py --steps 20000 --ckpt-every 1000 --step-sleep 0",
        stop={"straggler": {"factor": 2.0, "window_s": window, "action": "stop"}},
    )
    slow = fleet.node_name(2)
    old = run_dirs(fleet)
    train = Train(book, str(lab_inventory(fleet, 3, tmp)), env, tmp / f"straggler-{trial}.log")
    sampler = PaceSampler(fleet, old, slow)
    throttled = time.time()
    try:
        wait_for(lambda: step_at_least(fleet, old, 20) or not train.running(), 240, "step 20")
        before = load()
        cgroup.mkdir(exist_ok=True)
        (cgroup / "cpu.cfs_period_us").write_text("100000")
        (cgroup / "cpu.cfs_quota_us").write_text("3000")
        throttled = time.time()
        for pid in job_pids(slow):
            with contextlib.suppress(OSError):
                (cgroup / "cgroup.procs").write_text(str(pid))
        summary = train.finish(300)
    finally:
        sampler.close()
        train.kill()
        if cgroup.exists():
            for left in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CGROUP_ROOT / "cgroup.procs").write_text(left)
            cgroup.rmdir()
    decided = summary.get("decided_at")
    row = {
        "trial": trial,
        "outcome": summary.get("outcome"),
        "rule": summary.get("rule"),
        "named_slow": slow in (summary.get("failed_nodes") or [])
        or f"{slow} " in (summary.get("reason") or ""),
        "reason": (summary.get("reason") or "")[:300],
        "load_1m": [before, load()],
    }
    if isinstance(decided, float):
        row["throttle_to_flag_s"] = round(decided - throttled, 2)
        slow_for = re.search(r" for (\d+) s", summary.get("reason") or "")
        if slow_for:  # the window's start: the watcher's first reading of the node over the factor
            row["throttle_to_window_start_s"] = round(decided - throttled - int(slow_for.group(1)), 1)
    after = [(round(t - throttled, 1), round(r, 2)) for t, r in sampler.timeline if t >= throttled - 10]
    shown = [t for t, r in after if t >= 0 and r >= 2.0]
    row["pace_around_throttle"] = after[:60]  # (s after the throttle, slow node / median node)
    row["first_pace_over_factor_s"] = shown[0] if shown else None
    row["dips_under_factor"] = sum(
        1 for (_, a), (_, b) in zip(after, after[1:], strict=False) if a >= 2.0 > b
    )
    say(
        f"straggler trial {trial}: {row.get('throttle_to_flag_s')} s, {row['rule']}, named {row['named_slow']}"
    )
    return row


def straggler_row(
    fleet: LocalFleet, trials: int, env: dict[str, str], tmp: Path, window: float
) -> dict[str, Any]:
    runs = [straggler_trial(fleet, tmp, env, t + 1, window) for t in range(trials)]
    times = [r["throttle_to_flag_s"] for r in runs if "throttle_to_flag_s" in r and r["rule"] == "straggler"]
    return {
        "what": f"fab train, 3 nodes, straggler factor 2.0 window_s {window:g} action stop; node 2's job in a 3%-CPU cgroup",
        "window_s": window,
        "median_s": statistics.median(times) if times else None,
        "max_s": max(times) if times else None,
        "goal_s": window + 5,
        "runs": runs,
    }


def straggler_healthy_trial(
    fleet: LocalFleet, tmp: Path, env: dict[str, str], trial: int, window: float, seconds: float
) -> dict[str, Any]:
    """The straggler bench's job on a healthy fleet for ``seconds``: a false flag stops it."""
    book = job(
        tmp,
        "bench-straggler-healthy",
        3,
        "python ckpt_trainer.py --steps 200000 --ckpt-every 10000 --step-sleep 0",
        stop={"straggler": {"factor": 2.0, "window_s": window, "action": "stop"}},
    )
    old = run_dirs(fleet)
    train = Train(book, str(lab_inventory(fleet, 3, tmp)), env, tmp / f"healthy-{trial}.log")
    summary: dict[str, Any] = {}
    try:
        wait_for(lambda: step_at_least(fleet, old, 20) or not train.running(), 240, "step 20")
        before, started = load(), time.monotonic()
        while train.running() and time.monotonic() - started < seconds:
            time.sleep(1)
        watched = round(time.monotonic() - started, 1)
        if train.running():  # Ctrl-C: the run is stopped by the operator, its job with it
            train.proc.send_signal(signal.SIGINT)
        summary = train.finish(180)
    finally:
        train.kill()
    row = {
        "trial": trial,
        "watched_s": watched,
        "flagged": summary.get("rule") == "straggler",
        "rule": summary.get("rule"),
        "reason": (summary.get("reason") or "")[:300],
        "load_1m": [before, load()],
    }
    say(f"straggler healthy trial {trial}: {row['rule']}, {row['reason'][:80]}")
    return row


def straggler_healthy_row(
    fleet: LocalFleet, trials: int, env: dict[str, str], tmp: Path, window: float, seconds: float
) -> dict[str, Any]:
    runs = [straggler_healthy_trial(fleet, tmp, env, t + 1, window, seconds) for t in range(trials)]
    return {
        "what": f"fab train, 3 healthy nodes, straggler factor 2.0 window_s {window:g} action stop, "
        f"{seconds:g} s watched",
        "window_s": window,
        "false_flags": sum(1 for r in runs if r["flagged"]),
        "runs": runs,
    }


def spare_trial(fleet: LocalFleet, tmp: Path, env: dict[str, str], trial: int) -> dict[str, Any]:
    fakebin = standin_on(fleet, 1, HEALTHY)
    book = job(
        tmp,
        "bench-gpu-spare",
        3,
        "python ckpt_trainer.py --steps 40 --ckpt-every 5 --step-sleep 0.25",
        recovery={"max_restarts": 2, "on": ["gpu_fault"], "grace_s": 5, "confirm_s": 2},
    )
    old = run_dirs(fleet)
    train = Train(book, str(lab_inventory(fleet, 4, tmp)), env, tmp / f"spare-{trial}.log")
    try:
        wait_for(lambda: step_at_least(fleet, old, 12) or not train.running(), 240, "step 12")
        before = load()
        switched = time.time()
        write_scenario(fakebin, LOST_GPU)
        wait_for(
            lambda: any(r.get("attempt", 1) >= 2 for r in records(fleet, old)) or not train.running(),
            300,
            "the first step of the resumed attempt",
        )
        summary = train.finish(300)
    finally:
        train.kill()
        write_scenario(fakebin, HEALTHY)
        standin_off(fleet, 1)
    found = records(fleet, old)
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for r in found:
        by_attempt.setdefault(int(r.get("attempt", 1)), []).append(r)
    tried = attempts(summary["run_id"]) if summary.get("run_id") else []
    row: dict[str, Any] = {
        "trial": trial,
        "outcome": summary.get("outcome"),
        "attempt1_rule": tried[0].get("rule") if tried else None,
        "replaced": tried[0].get("replaced") if tried else None,
        "attempt2_nodes": tried[1].get("nodes") if len(tried) > 1 else None,
        "load_1m": [before, load()],
    }
    first = {a: min(float(r["time"]) for r in rs) for a, rs in by_attempt.items()}
    if 2 in first:
        row["switch_to_first_resumed_step_s"] = round(first[2] - switched, 1)
        row["first_resumed_step"] = min(r["step"] for r in by_attempt[2])
    if tried:
        row["switch_to_attempt1_end_s"] = round(float(tried[0]["ended_at"]) - switched, 1)
        row["attempt1_started_at_to_first_step_s"] = round(first.get(1, 0) - float(tried[0]["started_at"]), 1)
    if len(tried) > 1 and 2 in first:
        row["attempt2_launch_to_first_step_s"] = round(first[2] - float(tried[1]["started_at"]), 1)
        row["recovery_steps_s"] = tried[1].get("recovery_s")
    say(
        f"spare trial {trial}: {row.get('switch_to_first_resumed_step_s')} s to the first resumed step, "
        f"launch->first step {row.get('attempt2_launch_to_first_step_s')} s, {row['outcome']}"
    )
    return row


def spare_row(fleet: LocalFleet, trials: int, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    runs = [spare_trial(fleet, tmp, env, t + 1) for t in range(trials)]

    def median(key: str) -> float | None:
        values = [r[key] for r in runs if isinstance(r.get(key), float)]
        return round(statistics.median(values), 1) if values else None

    return {
        "what": "fab train, 3 nodes of a 4-host lab inventory, recovery.on [gpu_fault]; node 1's GPU 1 gone + Xid 79",
        "median_s": median("switch_to_first_resumed_step_s"),
        "median_attempt1_end_s": median("switch_to_attempt1_end_s"),
        "median_torch_launch_to_first_step_s": median("attempt2_launch_to_first_step_s"),
        "median_attempt1_started_at_to_first_step_s": median("attempt1_started_at_to_first_step_s"),
        "goal_s": 30.0,
        "runs": runs,
    }


# -- the table ------------------------------------------------------------------------------------


def load_range(rows: list[dict[str, Any]]) -> str:
    loads = [x for r in rows for x in r.get("load_1m", [])]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"


def table_rows(rows: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out = []
    if "doctor" in rows:
        for r in rows["doctor"]["results"]:
            every = r["runs"]["with"] + r["runs"]["without"]
            goal = r["goal_s"]
            verdict = "met" if goal is not None and r["median_with_s"] <= goal else "MISSED"
            out.append(
                (
                    f"`fab doctor` with GPU health, {r['nodes']} nodes x 8 GPUs (stand-ins)",
                    f"{r['median_with_s']:.1f} s; without stand-ins {r['median_without_s']:.1f} s "
                    f"({r['ratio']:.2f}x)",
                    f"<= {goal:g} s: {verdict}" if goal else "-",
                    load_range(every),
                )
            )
    if "collective" in rows:
        c = rows["collective"]
        ok = all(r["slow_named"] for r in c["runs"])
        measured = sorted({r["measurements"] for r in c["runs"] if r["measurements"] is not None})
        out.append(
            (
                "`fab doctor --collective`, 16 nodes, one slowed link: time to name it",
                f"{c['median_s']:.0f} s, {'/'.join(map(str, measured))} measurements"
                f"{'' if ok else ' (not always named)'}"
                + (
                    f"; no slowed link: {h['median_s']:.0f} s, "
                    f"{'/'.join(str(r['measurements']) for r in h['runs'])} measurements"
                    if (h := rows.get("collective_healthy"))
                    else ""
                ),
                f"<= 60 s: {'met' if c['median_s'] <= 60 and ok else 'MISSED'}",
                load_range(c["runs"]),
            )
        )
    if "fault" in rows:
        f = rows["fault"]
        shown = (
            "-"
            if f["median_polls"] is None
            else f"{f['median_polls']:.1f} polls median, {f['max_polls']:.1f} max"
        )
        met = f["max_polls"] is not None and f["max_polls"] <= 2
        out.append(
            (
                f"`gpu_fault` injected -> stop decision ({f['poll_s']:g} s polls)",
                shown,
                f"<= 2 polls: {'met' if met else 'MISSED'}",
                load_range(f["runs"]),
            )
        )
    if "straggler" in rows:
        s = rows["straggler"]
        shown = "-" if s["median_s"] is None else f"{s['median_s']:.1f} s median, {s['max_s']:.1f} s max"
        met = s["max_s"] is not None and s["max_s"] <= s["goal_s"]
        out.append(
            (
                f"straggler throttled -> flagged (window_s {s['window_s']:g})",
                shown,
                f"<= {s['goal_s']:g} s: {'met' if met else 'MISSED'}",
                load_range(s["runs"]),
            )
        )
    if "straggler_healthy" in rows:
        h = rows["straggler_healthy"]
        out.append(
            (
                f"straggler on a healthy fleet (window_s {h['window_s']:g}, {h['runs'][0]['watched_s']:.0f} s)",
                f"{h['false_flags']} false flag(s) in {len(h['runs'])} trials",
                "0: met" if h["false_flags"] == 0 else "0: MISSED",
                load_range(h["runs"]),
            )
        )
    if "spare" in rows:
        p = rows["spare"]
        shown = (
            "-"
            if p["median_s"] is None
            else (
                f"{p['median_s']:.1f} s (attempt 1 stopped after {p['median_attempt1_end_s']} s, grace "
                f"included; torch's launch -> first step {p['median_torch_launch_to_first_step_s']} s)"
            )
        )
        met = p["median_s"] is not None and p["median_s"] <= p["goal_s"]
        out.append(
            (
                "`gpu_fault` -> first step on the spare (3 nodes)",
                shown,
                f"<= 30 s: {'met' if met else 'MISSED'}",
                load_range(p["runs"]),
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=ROWS, default=list(ROWS), help="none: print the table")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0, help="the straggler rule's window_s")
    parser.add_argument("--healthy-s", type=float, default=90.0, help="straggler_healthy: seconds watched")
    parser.add_argument("--rate", default="20mbit", help="the slowed link's tc tbf rate")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu_health.json")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="fleetrun-bench-gpu-"))
    os.environ["FLEETRUN_HOME"] = str(home)
    env = {**os.environ, "COLUMNS": "200"}
    saved: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    if saved and "rows" not in saved:  # the first version's in-process figures: kept as history
        saved = {
            "previous": {"method": "in-process reader and computed latencies (before real fleets)", **saved}
        }
    rows: dict[str, Any] = dict(saved.get("rows", {}))

    def keep(name: str, row: dict[str, Any]) -> None:
        row["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        if name in rows:  # a re-measured row keeps what it replaced (after a fix: before and after)
            before = dict(rows[name])
            row["earlier"] = [*before.pop("earlier", []), before]
        rows[name] = row
        write(args.out, saved, rows)

    with tempfile.TemporaryDirectory(prefix="fleetrun-gpu-bench-") as name:
        tmp = Path(name)
        if "doctor" in args.only:
            keep("doctor", doctor_row(args.sizes, args.trials, env, tmp))
        if "collective" in args.only:
            keep("collective", collective_row(args.trials, env, args.rate))
        if "collective_healthy" in args.only:
            keep("collective_healthy", collective_row(args.trials, env, ""))
        training = [r for r in ("fault", "straggler", "straggler_healthy", "spare") if r in args.only]
        if training:
            with local_fleet(f"{TAG}t", BASE + 2, 4 if "spare" in training else 3) as fleet:
                if "fault" in training:
                    keep("fault", fault_row(fleet, args.trials, env, tmp))
                if "straggler" in training:
                    keep("straggler", straggler_row(fleet, args.trials, env, tmp, args.window))
                if "straggler_healthy" in training:
                    healthy = straggler_healthy_row(fleet, args.trials, env, tmp, args.window, args.healthy_s)
                    keep("straggler_healthy", healthy)
                if "spare" in training:
                    keep("spare", spare_row(fleet, args.trials, env, tmp))
    table = Table(
        title="GPU health on real local fleets (scripted nvidia-smi stand-in; upper bounds under load)"
    )
    for column in ("what", "figure", "goal", "load (1 min)"):
        table.add_column(column)
    for row in table_rows(rows):
        table.add_row(*row)
    Console().print(table)
    print(f"wrote {args.out}")
    return 0


def write(out: Path, saved: dict[str, Any], rows: dict[str, Any]) -> None:
    data = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "rows": rows,
        **({"previous": saved["previous"]} if "previous" in saved else {}),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
