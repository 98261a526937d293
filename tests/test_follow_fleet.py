"""``fab logs RUN --follow`` on a real 3-node run: the SSH sessions serving the follower are killed
mid-follow, then the follower is interrupted and run again; together the two followers print every
numbered line of every node exactly once, in order, with the node/rank prefix."""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import threading
from pathlib import Path

from launch.cli import app
from launch.cli import runs as history
from launch.fleets.local import LocalFleet
from launch.run.summary import RunResult
from tests.conftest import REPO, TEST_PREFIX, needs_root, write_playbook
from tests.faultkit import quiet, wait_for

pytestmark = needs_root()
INVENTORY = f"local:{TEST_PREFIX}"
LINES = 300
COUNTER = f"""\
import os, sys, time
rank = os.environ["FLEETRUN_NODE_RANK"]
for i in range({LINES}):
    if i % 10 == 5:  # half a line, the rest later: a follower must hold it until its newline
        sys.stdout.write(f"COUNT {{rank}} {{i}} ")
        sys.stdout.flush()
        time.sleep(0.3)
        print("tail", flush=True)
    else:
        print(f"COUNT {{rank}} {{i}}", flush=True)
        time.sleep(0.04)
"""
LINE_RE = re.compile(r"^(\S+)/(\d+) COUNT (\d+) (\d+)(?: tail)?$")


def sshd_sessions(users: set[str]) -> set[int]:
    """Live per-connection sshd processes of the node users (uids: ps truncates long user names)."""
    uids = {str(pwd.getpwnam(u).pw_uid) for u in users}
    out = subprocess.run(["ps", "-eo", "pid=,uid=,stat=,comm="], capture_output=True, text=True).stdout
    found = set()
    for line in out.split("\n"):
        parts = line.split()
        if (
            len(parts) == 4
            and parts[1] in uids
            and not parts[2].startswith("Z")
            and parts[3].startswith("sshd")
        ):
            found.add(int(parts[0]))
    return found


def numbers(text: str) -> list[int]:
    return [int(m.group(4)) for line in text.splitlines() if (m := LINE_RE.match(line))]


def test_follow_survives_a_killed_connection_and_a_rerun_without_loss_or_repeat(
    fleet: LocalFleet, tmp_path: Path, fleetrun_home: Path
) -> None:
    work = tmp_path / "counter"
    work.mkdir()
    (work / "count.py").write_text(COUNTER)
    playbook = write_playbook(tmp_path / "count.yaml", work, name="t-follow", entrypoint="python count.py")
    box: dict[str, object] = {}

    def train() -> None:
        box["result"] = app.train(
            playbook, inventory=INVENTORY, console=quiet(), poll_interval=0.5, ask_on_interrupt=False
        )

    thread = threading.Thread(target=train)
    thread.start()
    users = {fleet.node_name(i) for i in range(3)}
    home = Path(f"/home/{fleet.node_name(0)}/.fleetrun/runs")
    wait_for(lambda: any(home.glob("t-follow-*/node.log")) or not thread.is_alive(), 240, "the run's start")
    (run_dir,) = home.glob("t-follow-*")
    run_id = run_dir.name
    with history.open_records() as records:
        assert records.get(run_id) is not None

    env = {**os.environ, "FLEETRUN_HOME": str(fleetrun_home), "COLUMNS": "200"}
    fab = [str(REPO / ".venv" / "bin" / "fab"), "logs", run_id, "--follow"]
    out1, out2 = tmp_path / "follow1.txt", tmp_path / "follow2.txt"
    before = sshd_sessions(users)
    with out1.open("w") as fh:
        first = subprocess.Popen(fab, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(numbers(out1.read_text())) >= 60, 120, "the first follower's lines")
        killed = sshd_sessions(users) - before
        assert killed, "the follower's SSH sessions were found"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        seen = len(numbers(out1.read_text()))
        wait_for(
            lambda: len(numbers(out1.read_text())) >= seen + 60, 120, "lines after the killed connection"
        )
        assert not sshd_sessions(users) & killed, "the killed sessions are gone; the follower reconnected"
        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert not (run_dir / "rc").exists(), "the run ended before the re-run (make it longer)"
    with out2.open("w") as fh:
        second = subprocess.run(fab, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=300)
    assert second.returncode == 0
    thread.join(300)
    result = box.get("result")
    assert isinstance(result, RunResult) and result.outcome == "succeeded", result

    text = out1.read_text() + out2.read_text()
    for rank in range(3):
        name = fleet.node_name(rank)
        got = [
            int(m.group(4))
            for line in text.splitlines()
            if (m := LINE_RE.match(line)) and m.group(3) == str(rank)
        ]
        assert got == list(range(LINES)), f"{name}: lines lost, repeated or out of order"
        prefixes = {m.group(1) + "/" + m.group(2) for line in text.splitlines() if (m := LINE_RE.match(line))}
        assert any(p.endswith(f"/{rank}") for p in prefixes)
    assert all(m.group(2) == m.group(3) for line in text.splitlines() if (m := LINE_RE.match(line))), (
        "the prefix names each node's rank"
    )
