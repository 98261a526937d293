"""A failed rank reaches the watcher before its torchrun ends (``fleetrun_node.RankWatch``).

After ``kill -9`` of a rank, torchrun reaps it within its 0.1 s monitor interval but takes 1.5 s
more to end (its rendezvous goodbye, an interpreter with torch to tear down), and the node's exit
was known only once it had: the decision of ``kill -9 -> reported failed`` waited for it. The
event channel now watches the ranks themselves and reads a dead rank's exit status from the
kernel while it is a zombie. Here a stand-in ``torchrun`` (real processes, fleetrun's own wrapper)
never reaps its rank, so the order is certain: the rank's exit is answered while torchrun lives."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
AGENT = str(NODELIB / "fleetrun_node.py")

TORCHRUN = """#!/usr/bin/python3
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "rank.py", sys.argv[-1]])
open("torchrun.pid", "w").write(str(__import__("os").getpid()))
time.sleep(300)  # never reaps its rank: the rank stays a zombie until torchrun ends
"""

RANK = """import sys, time
open("rank.pid", "w").write(str(__import__("os").getpid()))
if sys.argv[1] != "run":
    raise SystemExit(int(sys.argv[1]))
time.sleep(300)
"""


def agent(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, AGENT, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def start(tmp_path: Path, run_id: str, torchrun_args: str, rank: str) -> tuple[Path, int]:
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    (run_dir / "torchrun").write_text(TORCHRUN)
    (run_dir / "torchrun").chmod(0o755)
    (run_dir / "rank.py").write_text(RANK)
    (run_dir / "launch.sh").write_text(
        f"export FLEETRUN_RUN_ID={run_id}\n./torchrun {torchrun_args} {rank}\n"
    )
    wrapper = agent("start", str(run_dir))["pid"]
    for _ in range(600):
        if (run_dir / "rank.pid").exists() and (run_dir / "torchrun.pid").exists():
            break
        time.sleep(0.05)
    assert (run_dir / "rank.pid").exists(), (run_dir / "node.log").read_text()
    return run_dir, wrapper


def events(run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, AGENT, "events", str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def ask(proc: subprocess.Popen[str], wait_s: float, within: float) -> str:
    """One held wait; its answer, or '' when none came within ``within`` (a deadline, not a figure)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"op": "wait", "wait_s": wait_s, "seen": "running"}) + "\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], within)
    return proc.stdout.readline() if ready else ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def end(proc: subprocess.Popen[str], wrapper: int) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    with contextlib.suppress(OSError):
        os.killpg(wrapper, signal.SIGKILL)


def test_a_killed_rank_is_pushed_while_its_torchrun_still_runs(tmp_path: Path) -> None:
    run_dir, wrapper = start(tmp_path, "r-kill", "--nnodes=2 --max-restarts=0", "run")
    torchrun = int((run_dir / "torchrun.pid").read_text())
    proc = events(run_dir)
    try:
        assert ask(proc, 0.5, 30) != "", "a short wait is answered"
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"op": "wait", "wait_s": 60, "seen": "running"}) + "\n")
        proc.stdin.flush()
        os.kill(int((run_dir / "rank.pid").read_text()), signal.SIGKILL)
        assert proc.stdout is not None
        # the hold is 60 s: answered by the death itself
        ready, _, _ = select.select([proc.stdout], [], [], 50)
        assert ready, "the rank's death was not pushed while torchrun ran"
        assert json.loads(proc.stdout.readline()) == {"state": "exited", "rc": 137, "error": ""}
        assert alive(torchrun), "answered only once torchrun had ended"
        polled = agent("poll", str(run_dir), "0", "--no-heartbeat")
        assert (polled["state"], polled["rc"]) == ("exited", 137)
        assert polled["exited_at"] is not None, "the blame orders nodes by their first exit"
    finally:
        end(proc, wrapper)


def test_a_rank_that_fails_before_the_watch_began_is_still_found(tmp_path: Path) -> None:
    run_dir, wrapper = start(tmp_path, "r-early", "--nnodes=2 --max-restarts=0", "3")
    proc = events(run_dir)
    try:
        line = ask(proc, 60, 50)
        assert line and json.loads(line) == {"state": "exited", "rc": 3, "error": ""}
    finally:
        end(proc, wrapper)


def test_no_exit_for_a_rank_that_succeeded_or_a_torchrun_that_may_restart_it(tmp_path: Path) -> None:
    """A rank that ended with 0 is no failure; an elastic (``MIN:MAX``) torchrun, or one with
    restarts, ends ranks itself on a membership change: neither is the node's exit."""
    for run_id, args, rank in (
        ("r-ok", "--nnodes=2 --max-restarts=0", "0"),
        ("r-elastic", "--nnodes=1:2 --max-restarts=0", "1"),
        ("r-restarts", "--nnodes=2 --max-restarts=3", "1"),
    ):
        run_dir, wrapper = start(tmp_path, run_id, args, rank)
        proc = events(run_dir)
        try:
            line = ask(proc, 1.0, 60)
            assert json.loads(line)["state"] == "running", (run_id, line)
            assert not (run_dir / "rank-rc").exists(), run_id
        finally:
            end(proc, wrapper)


def test_a_rank_failure_of_an_earlier_start_is_no_exit_of_this_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "r-stale"
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text("export FLEETRUN_RUN_ID=r-stale\nsleep 300\n")
    (run_dir / "rank-rc").write_text("137 1\n")  # an earlier start's, not moved away
    wrapper = agent("start", str(run_dir))["pid"]
    try:
        assert not (run_dir / "rank-rc").exists(), "a start removes the earlier start's record"
        (run_dir / "rank-rc").write_text("137 1\n")  # written late by an earlier start's watch
        assert agent("poll", str(run_dir), "0", "--no-heartbeat")["state"] == "running"
        (run_dir / "rank-rc").write_text("garbage\n")
        answer = agent("poll", str(run_dir), "0", "--no-heartbeat")
        assert answer["state"] == "running" and any("rank-rc" in m for m in answer["malformed"])
    finally:
        with contextlib.suppress(OSError):
            os.killpg(wrapper, signal.SIGKILL)
