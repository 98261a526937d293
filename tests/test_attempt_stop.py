"""Between attempts, a survivor's ``rc`` must not be read as the next attempt's exit.

The node's wrapper (``sh -c WRAPPER``, its pid in ``pid``) carries no ``FLEETRUN_RUN_ID``: the
agent's ``stop`` kills its child, not it, and the wrapper writes ``rc`` a moment later. Moved to
``attempt-<n>/`` before that, the ``rc`` lands in the run directory and the next attempt's watcher
reads it as that attempt's exit at once (seen under load as ``exited 137`` one second into the
attempt on the spare, bench/gpu_health.py's spare row). The stop command, run here in a
``sh`` on this machine, waits for the wrapper first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.run.attempts import Stopped, stop_survivors
from launch.transport.port import CommandResult, NodeResults
from tests.conftest import SAMPLE_HOST_KEYS


class LocalLink:
    """A node whose commands run in ``sh`` on this machine, with ``home`` as its home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.host = SimpleNamespace(name="n0")

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        proc = subprocess.run(
            ["sh", "-c", command],
            cwd=self.home,
            env={**os.environ, "HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return CommandResult("n0", proc.returncode, proc.stdout, proc.stderr)


class ShellFleet:
    def __init__(self, link: LocalLink) -> None:
        self.link = link

    def map(self, fn, hosts=None, on_done=None, deadline=None):  # type: ignore[no-untyped-def]
        results: NodeResults[object] = NodeResults()
        try:
            results["n0"] = fn(self.link)
        except Exception as exc:  # noqa: BLE001 - per host, as the real map does
            results["n0"] = exc
        return results


def test_the_attempts_files_move_only_once_the_wrapper_wrote_its_rc(tmp_path: Path) -> None:
    run_id = "job-20261125-190451-9061e5"
    run_dir = tmp_path / layout.rundir(run_id)
    run_dir.mkdir(parents=True)
    agent = tmp_path / layout.AGENT
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\nexit 0\n")  # the child is already gone; the wrapper is not
    agent.chmod(0o755)
    # not this process's child (the node's wrapper is not the agent's either): reaped when it ends
    started = subprocess.run(
        ["sh", "-c", "(sleep 0.8; echo 137 > rc.tmp; mv rc.tmp rc) >/dev/null 2>&1 & echo $!"],
        cwd=run_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    (run_dir / "pid").write_text(started.stdout.strip())
    stopped = stop_survivors(
        ShellFleet(LocalLink(tmp_path)),  # type: ignore[arg-type]
        [Host(name="n0", address="127.0.0.1", user="u", host_key=SAMPLE_HOST_KEYS[0])],
        run_id,
        0.0,
        1,
    )
    assert stopped.errors == {}
    assert (run_dir / "attempt-1" / "rc").read_text().strip() == "137"
    assert not (run_dir / "rc").exists(), "the old attempt's rc would be read as the next one's exit"
    assert (run_dir / "attempt-1" / "pid").exists()


# -- survivors that cannot use their grace (issue 33) ---------------------------------------------

JOB = r"""
import json, os, signal, sys, time
run_dir, mode = sys.argv[1], sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # as fleetrun_checkpoint's handler: a flag
os.makedirs(os.path.join(run_dir, "pace"), exist_ok=True)

def pace(at, every):
    path = os.path.join(run_dir, "pace", "0.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"rank": 0, "step": 7, "time": at, "probe_ms": 1.0, "every_s": every}, fh)
    os.replace(path + ".tmp", path)

if mode == "blocked":  # its last step 30 s ago, then stuck in a collective with a lost peer
    pace(time.time() - 30, 2.0)
    open(os.path.join(run_dir, "ready"), "w").close()
    while True:
        time.sleep(0.05)  # the flag is set, but the rank never reaches its next step to save
while True:  # stepping: a record every 0.1 s; after SIGTERM, saves at its next step and exits
    pace(time.time(), 0.1)
    open(os.path.join(run_dir, "ready"), "w").close()
    if stop:
        open(os.path.join(run_dir, "saved"), "w").close()
        sys.exit(0)
    time.sleep(0.1)
"""


def start_job(home: Path, run_id: str, mode: str) -> tuple[Path, int]:
    """The node library in ``home`` (the agent the stop runs) and one rank of ``run_id`` in
    ``mode``, started the way launch.sh starts it (``FLEETRUN_RUN_ID`` in its environment), not
    as this process's child (a node's ranks are not the agent's): reaped when it ends."""
    import shutil
    import time

    lib = home / layout.LIB
    shutil.copytree(Path(__file__).resolve().parent.parent / "launch" / "nodelib", lib)
    run_dir = home / layout.rundir(run_id)
    run_dir.mkdir(parents=True)
    (run_dir / "job.py").write_text(JOB)
    started = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" job.py . {mode} >/dev/null 2>&1 & echo $!'],
        cwd=run_dir,
        env={**os.environ, "FLEETRUN_RUN_ID": run_id},
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout.strip())
    (run_dir / "pid").write_text(f"{pid}\n")
    launched = time.time() - 60  # the launch a minute ago: the blocked rank's record is of it
    os.utime(run_dir / "pid", (launched, launched))
    deadline = time.monotonic() + 60
    while not (run_dir / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (run_dir / "ready").exists(), "the job did not start"
    return run_dir, pid


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def host() -> Host:
    return Host(name="n0", address="127.0.0.1", user="u", host_key=SAMPLE_HOST_KEYS[0])


def stop_one(tmp_path: Path, run_id: str, kind: str) -> tuple[Path, Stopped]:
    """Start a ``kind`` rank on n0 and stop it as a recovery does (a 600 s grace); the rank is
    gone afterwards (reaped here if the stop left it)."""
    run_dir, pid = start_job(tmp_path, run_id, kind)
    try:
        stopped = stop_survivors(
            ShellFleet(LocalLink(tmp_path)),  # type: ignore[arg-type]
            [host()],
            run_id,
            600.0,
            1,
        )
        assert gone(pid)
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    return run_dir, stopped


def test_survivors_blocked_since_the_loss_are_killed_without_their_grace(tmp_path: Path) -> None:
    """A rank whose last step was long ago (blocked in a collective with the lost node) ignores
    SIGTERM, as fleetrun_checkpoint's handler only sets a flag: the stop kills it at once instead
    of waiting out a 10-minute grace it cannot use (the test would then run into its timeout)."""
    run_id = "job-20261128-200000-b10c4d"
    run_dir, stopped = stop_one(tmp_path, run_id, "blocked")
    assert stopped.errors == {}
    answer = stopped.answers["n0"]
    assert answer.grace_cut and answer.blocked == 1 and answer.stepping == 0, answer
    assert answer.killed == 1, "SIGKILLed: it would never have ended on its own"
    assert stopped.without_grace() == ["n0"]
    assert not (run_dir / "saved").exists()
    assert (run_dir / "attempt-1" / "pid").exists(), "the attempt's files moved as before"


def test_survivors_still_stepping_get_their_grace_and_save(tmp_path: Path) -> None:
    run_id = "job-20261128-200000-57e99d"
    run_dir, stopped = stop_one(tmp_path, run_id, "stepping")
    assert stopped.errors == {}
    answer = stopped.answers["n0"]
    assert not answer.grace_cut and answer.stepping == 1, answer
    assert answer.killed == 0, "it saved and ended by itself within its grace"
    assert stopped.without_grace() == []
    assert (run_dir / "saved").exists(), "the stepping rank got its grace and checkpointed"
