"""A stop does not wait out a launcher's own shutdown once every rank under it is gone.

After a rank is killed, its node's torchrun (and the survivors', whose ranks fail on the lost
peer) take a second or more to end after SIGTERM (the rendezvous goodbye, an interpreter with
torch to tear down), and every stop of such a run waited for them, up to the grace: 1.2-1.7 s of
each ``kill -9 -> reported failed`` in ``bench/peers.py``. Here real processes stand in for them:
a ``torchrun`` that ignores SIGTERM, under fleetrun's own wrapper and ``launch.sh``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
GRACE_S = 600.0

TORCHRUN = """#!/usr/bin/python3
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its own slow shutdown, at its worst
if len(sys.argv) > 1:
    subprocess.Popen([sys.executable, "rank.py"])
open("torchrun.up", "w").close()
time.sleep(120)
"""

RANK = """import signal, time
def saved(*_):
    time.sleep(1.0)  # a checkpoint written on SIGTERM
    open("rank.saved", "w").close()
    raise SystemExit(143)
signal.signal(signal.SIGTERM, saved)
open("rank.up", "w").close()
time.sleep(120)
"""


def _agent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_id: str, *args: str) -> tuple[Any, Path]:
    sys.path.insert(0, str(NODELIB))
    import fleetrun_node

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLEETRUN_RUN_ID", run_id)
    run_dir = tmp_path / ".fleetrun" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "torchrun").write_text(TORCHRUN)
    (run_dir / "torchrun").chmod(0o755)
    (run_dir / "rank.py").write_text(RANK)
    (run_dir / "launch.sh").write_text(f"./torchrun {' '.join(args)}\n")
    fleetrun_node.start(str(run_dir))
    marker = run_dir / ("rank.up" if args else "torchrun.up")
    for _ in range(600):
        if marker.exists():
            break
        time.sleep(0.05)
    assert marker.exists(), (run_dir / "node.log").read_text() if (run_dir / "node.log").exists() else ""
    return fleetrun_node, run_dir


def test_a_launcher_whose_ranks_are_gone_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent, _run_dir = _agent(monkeypatch, tmp_path, "r-launcher")
    started = time.monotonic()
    answer = agent.stop_run("r-launcher", GRACE_S)
    # not a speed figure: whether the grace was waited out at all (it is ten minutes here)
    assert time.monotonic() - started < GRACE_S / 4, "the grace was waited out for a rank-less launcher"
    assert answer.remaining == 0 and answer.killed >= 1
    assert not agent._run_pids("r-launcher")


def test_a_rank_under_a_launcher_keeps_its_grace_and_saves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent, run_dir = _agent(monkeypatch, tmp_path, "r-rank", "--with-rank")
    answer = agent.stop_run("r-rank", GRACE_S)
    assert answer.remaining == 0
    assert (run_dir / "rank.saved").exists(), "the rank's SIGTERM save ran to its end"
    assert not agent._run_pids("r-rank")


def test_what_holds_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sys.path.insert(0, str(NODELIB))
    import fleetrun_node
    import fleetrun_procs

    assert fleetrun_procs.holds_nothing(2**22 + 12345, fleetrun_node.WRAPPER), "a process gone"
    assert not fleetrun_procs.holds_nothing(os.getpid(), fleetrun_node.WRAPPER), (
        "any other process keeps its grace"
    )
