"""``fab train --wait`` and ``fab queue``: runs take shared machines in arrival order through the
queue files on each machine (``launch.planning.queue``); a laptop that went away does not block
the next run for longer than the entries' time to live."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from launch.planning.queue import Entry, ahead_of, parse_listing
from launch.run.records import RunRecords
from tests.conftest import REPO, TEST_PREFIX, fab, needs_root, write_playbook


def test_the_listing_is_parsed_strictly_and_only_live_entries_block() -> None:
    text = "\n".join(
        [
            'QUEUE {"name": "00000000000000000002-run-b", "user": "bob", "owner": "bob@lap", "age": 1.0}',
            'QUEUE {"name": "00000000000000000001-run-a", "user": "ann", "owner": "ann@lap", "age": 99.0}',
            'QUEUE {"name": "00000000000000000003-run-c", "user": "cy", "owner": "", "age": 0.5}',
            'QUEUE {"name": "x-bad", "age": 1}',
            'QUEUE {"name": "00000000000000000004-../etc", "age": 1}',
            "QUEUE not json",
            "unrelated line",
        ]
    )
    entries = parse_listing(text)
    assert [e.run_id for e in entries] == ["run-a", "run-b", "run-c"], "oldest arrival first"
    assert ahead_of(entries, "run-c", ttl_s=60) == [entries[1]], "run-a expired: only run-b is ahead"
    assert ahead_of(entries, "run-a", ttl_s=60) == [] and ahead_of(entries, "run-b", ttl_s=600) == [
        entries[0]
    ]
    assert ahead_of(entries, "new", ttl_s=60) == [entries[1], entries[2]]
    assert Entry(1, "r", "u", "", 5.0).live(6.0) and not Entry(1, "r", "u", "", 7.0).live(6.0)


def _start(
    playbook: Path, home: Path, runs: Path, env_extra: dict[str, str], log: Path
) -> subprocess.Popen[str]:
    env = {**os.environ, "FLEETRUN_HOME": str(home), "FLEETRUN_RUNS": str(runs), **env_extra}
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{TEST_PREFIX}", "--wait"],
        cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _wait_for(log: Path, text: str, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not seen: {log.read_text()[-3000:]}")


@needs_root()
def test_two_laptops_run_one_after_the_other_and_a_killed_waiter_does_not_block(
    fleet: object, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    """Laptop A runs; laptop K queues behind it and is killed (kill -9); laptop B queues behind
    both. B starts after A ended (arrival order) and is not held up for ever by K's entry."""
    playbook = write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-queue",
        nodes=1,
        entrypoint="python -m trainer.task --epochs 3",
    )
    ttl = {"FLEETRUN_QUEUE_TTL_S": "6"}
    homes = {}
    for name in ("a", "k", "b"):  # three laptops: their own state, the fleet's keys copied in
        homes[name] = tmp_path / f"home-{name}"
        subprocess.run(["cp", "-a", str(fleetrun_home), str(homes[name])], check=True)
    logs = {name: tmp_path / f"{name}.log" for name in homes}
    a = _start(playbook, homes["a"], tmp_path / "runs-a", ttl, logs["a"])
    _wait_for(logs["a"], "its turn on 1 machine(s)", a)
    k = _start(playbook, homes["k"], tmp_path / "runs-k", ttl, logs["k"])
    _wait_for(logs["k"], "waiting for the machines (arrival order)", k)
    k.send_signal(signal.SIGKILL)
    k.wait()
    b = _start(playbook, homes["b"], tmp_path / "runs-b", ttl, logs["b"])
    _wait_for(logs["b"], "waiting for the machines (arrival order)", b)
    assert a.wait(timeout=600) == 0, logs["a"].read_text()[-3000:]
    assert b.wait(timeout=600) == 0, logs["b"].read_text()[-3000:]
    assert "t-queue-" in logs["b"].read_text().split("waiting for the machines", 1)[1], "B saw who was ahead"
    with RunRecords(homes["a"] / "runs.db") as ra, RunRecords(homes["b"] / "runs.db") as rb:
        (run_a,) = [r for r in ra.list(limit=100) if r.playbook_name == "t-queue"]
        (run_b,) = [r for r in rb.list(limit=100) if r.playbook_name == "t-queue"]
    assert run_a.state == run_b.state == "succeeded"
    assert run_a.ended_at is not None and run_b.started_at >= run_a.ended_at, "one after the other"
    # no wait: B started only once K's entry had outlived its time to live (K is dead, it never
    # refreshes it again), and A and B removed theirs: every machine is free now
    shown = fab("queue", "--inventory", f"local:{TEST_PREFIX}", home=homes["b"])
    assert shown.returncode == 0, shown.stderr
    assert all(line.endswith(": free") for line in shown.stdout.strip().splitlines()), shown.stdout
