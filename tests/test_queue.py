"""``fab train --wait`` and ``fab queue``: runs take shared machines in arrival order through the
queue files on each machine (``launch.planning.queue``); a laptop that went away does not block
the next run for longer than the entries' time to live."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from launch.planning.queue import (
    SCRIPT,
    Entry,
    ahead_of,
    parse_listing,
    queue_error,
    script_command,
    skipped_notes,
)
from launch.run.records import RunRecords
from tests.conftest import REPO, STEPS_JOB, TEST_PREFIX, fab, needs_root, write_playbook


def test_the_listing_is_parsed_strictly_and_only_live_entries_block() -> None:
    text = "\n".join(
        [
            'QUEUE {"name": "00000000000000000002-run-b", "user": "bob", "owner": "bob@lap", "age": 1.0}',
            'QUEUE {"name": "00000000000000000001-run-a", "user": "ann", "owner": "ann@lap", "age": 99.0, "lease_s": 600}',
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
    assert not Entry(1, "r", "u", "", 5.0, lease_s=4.0).live(6.0), "the entry's own lease is checked"


def _start(
    playbook: Path, home: Path, runs: Path, env_extra: dict[str, str], log: Path, wait: bool = True
) -> subprocess.Popen[str]:
    env = {**os.environ, "FLEETRUN_HOME": str(home), "FLEETRUN_RUNS": str(runs), **env_extra}
    flags = ["--wait"] if wait else []
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{TEST_PREFIX}", *flags],
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
    fleet: object, fleetrun_home: Path, tmp_path: Path
) -> None:
    """Laptop A runs, without ``--wait``: it holds the machine all the same (``fab queue
    INVENTORY`` shows it, and a plain ``fab train`` from laptop P is refused, naming A's run);
    laptop K queues behind it and is killed (kill -9); laptop B queues behind both. B starts after
    A ended (arrival order) and is not held up for ever by K's entry.

    The job is the torch-free trainer, held at its first step until B waits (a release file the
    node users can see): A still runs while the others queue, whatever the machine's load."""
    release_dir = Path(tempfile.mkdtemp(prefix="fleetrun-queue-"))
    release_dir.chmod(0o755)  # the node users look for the release file here
    release = release_dir / "release"
    playbook = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-queue",
        nodes=1,
        entrypoint=f"python steps.py --steps 20 --hold-until {release}",
    )
    try:
        _one_after_the_other(playbook, release, fleetrun_home, tmp_path)
    finally:
        release.touch()
        shutil.rmtree(release_dir, ignore_errors=True)


def _one_after_the_other(playbook: Path, release: Path, fleetrun_home: Path, tmp_path: Path) -> None:
    ttl = {"FLEETRUN_QUEUE_TTL_S": "6"}
    homes = {}
    for name in ("a", "k", "b", "p"):  # four laptops: their own state, the fleet's keys copied in
        homes[name] = tmp_path / f"home-{name}"
        subprocess.run(["cp", "-a", str(fleetrun_home), str(homes[name])], check=True)
    logs = {name: tmp_path / f"{name}.log" for name in homes}
    a = _start(playbook, homes["a"], tmp_path / "runs-a", ttl, logs["a"], wait=False)
    while True:  # the positional form the docs show; A's hold appears once it has taken it
        shown = fab("queue", f"local:{TEST_PREFIX}", home=homes["p"])
        assert shown.returncode == 0 and a.poll() is None, shown.stderr + logs["a"].read_text()[-3000:]
        if "held by t-queue-" in shown.stdout:
            break
        time.sleep(0.5)
    refused = fab(
        "train",
        str(playbook),
        "--inventory",
        f"local:{TEST_PREFIX}",
        home=homes["p"],
        runs=tmp_path / "runs-p",
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "the machines are held by another run" in refused.stderr and "t-queue-" in refused.stderr, (
        refused.stderr
    )
    assert not (tmp_path / "runs-p").exists() or not any((tmp_path / "runs-p").iterdir()), "nothing started"
    k = _start(playbook, homes["k"], tmp_path / "runs-k", ttl, logs["k"])
    _wait_for(logs["k"], "waiting for the machines (arrival order)", k)
    k.send_signal(signal.SIGKILL)
    k.wait()
    b = _start(playbook, homes["b"], tmp_path / "runs-b", ttl, logs["b"])
    _wait_for(logs["b"], "waiting for the machines (arrival order)", b)
    assert a.poll() is None, "A still holds the machine while B waits"
    release.touch()
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
    machines = [line for line in shown.stdout.strip().splitlines() if not line.startswith("warning: ")]
    assert machines and all(line.endswith(": free") for line in machines), shown.stdout


# ------------------------------------------------------------------ the node script, against other users


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"
"""The nodes' kind of Python (standard library only), one every user here may run."""


def _script(top: Path, action: str, run_id: str, *, user: str | None = None, lease: float = 60) -> str:
    """``SCRIPT`` as the node runs it (stdin), here, as root or as ``user``, over ``top``."""
    command = script_command(
        SYSTEM_PYTHON, action, run_id, f"{user or 'root'}@lap", lease, 4242, "all", str(top)
    )
    done = subprocess.run(
        ["sh", "-c", command], input=SCRIPT, capture_output=True, text=True, timeout=60, check=False,
        user=user, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_root()
def test_another_user_cannot_block_the_queue_with_a_future_entry_a_fifo_or_a_squatted_folder() -> None:
    """Another user of the machine (``nobody``) squats root's queue folder name, dates an entry of
    theirs in the future, puts a FIFO and a file of root's in place of entries: the next run is
    first at once (nothing it reads blocks, no read hangs), each skip is said; a live entry of
    theirs made the honest way still counts (the checks do not just ignore other users)."""
    top = Path(tempfile.mkdtemp(prefix="fleetrun-queue-test-"))
    try:
        top.chmod(0o1777)  # like /tmp: root's, sticky, writable by all
        host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:64]
        nobody = pwd.getpwnam("nobody").pw_uid
        squat = top / f"fleetrun-queue-{host}.u0"  # root's own name, made first by nobody
        squat.mkdir(mode=0o755)
        os.chown(squat, nobody, -1)
        theirs = top / f"fleetrun-queue-{host}.u{nobody}"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, nobody, -1)
        future = theirs / "00000000000000000001-run-future"
        future.write_text('{"owner": "mallory@lap", "lease_s": 1e9}')
        os.chown(future, nobody, -1)
        os.utime(future, (4102444800, 4102444800))  # the year 2100: "refreshed" for ever
        os.mkfifo(theirs / "00000000000000000002-run-fifo")
        os.chown(theirs / "00000000000000000002-run-fifo", nobody, -1)
        (theirs / "00000000000000000003-run-planted").write_text("{}")  # root's file in their folder
        bomb = theirs / "00000000000000000004-run-bomb"
        bomb.write_text("[" * 1999)  # a nesting bomb: the script's json would recurse past its limit
        os.chown(bomb, nobody, -1)

        out = _script(top, "enqueue", "run-mine")
        entries, notes = parse_listing(out), skipped_notes(out)
        assert queue_error(out) is None, out
        assert ahead_of(entries, "run-mine", ttl_s=60) == [], "nothing of theirs holds the run up"
        assert any(n.endswith(f"is owned by uid {nobody}, not by uid 0 its name gives") for n in notes), notes
        assert any("run-fifo is not a regular file" in n for n in notes), notes
        assert any("run-planted is owned by uid 0, not by its folder's owner" in n for n in notes), notes
        assert any("run-bomb cannot be read as an entry" in n for n in notes), notes
        (skipped,) = [e for e in entries if e.run_id == "run-future"]
        assert skipped.future and skipped.why_skipped(60) == "dated in the future"
        (own,) = [p for p in top.iterdir() if p.name.startswith(f"fleetrun-queue-{host}.u0.")]
        assert own.stat().st_uid == 0 and own.stat().st_mode & 0o777 == 0o755, "a folder of root's own"
        assert not list(squat.iterdir()), "nothing written in the squatted folder"

        honest = _script(top, "enqueue", "run-theirs", user="nobody")
        assert queue_error(honest) is None, honest
        later = parse_listing(_script(top, "touch", "run-mine"))
        assert [e.run_id for e in ahead_of(later, "run-late", ttl_s=60)] == ["run-mine", "run-theirs"]
        assert ahead_of(later, "run-mine", ttl_s=60) == [], "arrival order: root's run came first"
        _script(top, "leave", "run-mine")
        assert [e.run_id for e in ahead_of(parse_listing(_script(top, "list", "-")), "x", 60)] == [
            "run-theirs"
        ]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_entries_carry_their_lease_and_gpus_and_only_overlapping_live_ones_block() -> None:
    line = 'QUEUE {"name": "%020d-%s", "user": "u", "owner": "u@l", "age": %s, "now_ns": 100, "lease_s": %s, "gpus": %s, "pid": 7}'
    text = "\n".join(
        [
            line % (1, "short", 20.0, 10, "null"),  # its own lease ran out although the reader's has not
            line % (2, "gpu01", 1.0, 60, "[0, 1]"),
            line % (3, "gpu23", 1.0, 60, "[2, 3]"),
            line % (4, "huge", 1.0, "1e300", '"x"'),
            line % (10**15, "named-ahead", 1.0, 60, "null"),  # its name is dated past the machine's now
        ]
    )
    entries = {e.run_id: e for e in parse_listing(text)}
    assert not entries["short"].live(60) and "stale" in entries["short"].why_skipped(60)
    assert entries["huge"].lease_s == 3600.0 and entries["huge"].gpus is None and entries["huge"].pid == 7
    assert entries["named-ahead"].future
    ordered = parse_listing(text)
    assert [e.run_id for e in ahead_of(ordered, "new", 60, gpus=(2,))] == ["gpu23", "huge"]
    assert [e.run_id for e in ahead_of(ordered, "new", 60, gpus=(5,))] == ["huge"]
    assert [e.run_id for e in ahead_of(ordered, "new", 60)] == ["gpu01", "gpu23", "huge"]
    assert ahead_of(ordered, "new", 60, gone=lambda e: e.pid == 7) == [], "this laptop's dead process"


def test_an_entry_of_this_laptop_whose_process_or_run_is_gone_holds_nothing() -> None:
    """A ``fab`` killed here (kill -9) or a run of this process whose entries could not be
    removed (a local fleet torn down first) is not waited for until its lease runs out; a live
    run of this process and another laptop's entry are."""
    from launch.run import queue_turn as queueing

    dead = subprocess.Popen(["true"])
    dead.wait()
    me = queueing.owner()
    assert queueing.gone_here(Entry(1, "killed", "root", me, 1.0, pid=dead.pid))
    assert queueing.gone_here(Entry(1, "ended-here", "root", me, 1.0, pid=os.getpid()))
    queueing._live("running-here", True)
    try:
        assert not queueing.gone_here(Entry(1, "running-here", "root", me, 1.0, pid=os.getpid()))
    finally:
        queueing._live("running-here", False)
    assert not queueing.gone_here(Entry(1, "theirs", "bob", "bob@elsewhere", 1.0, pid=dead.pid))
    assert not queueing.gone_here(Entry(1, "alive", "root", me, 1.0, pid=os.getppid()))


def test_a_nesting_bomb_in_the_listing_is_skipped_not_a_recursion_error() -> None:
    """The script's listing comes from a node: a line nested past the decoder's depth, as an entry
    or as a note, is skipped like any line that is not exactly an entry."""
    bomb = "[" * 100_000 + "]" * 100_000
    text = f'QUEUE {bomb}\nQUEUE-SKIP {bomb}\nQUEUE-SKIP "a note"\n'
    assert parse_listing(text) == []
    assert skipped_notes(text) == ["a note"]


def test_the_last_leave_removes_the_users_emptied_folder_and_an_enqueue_makes_it_again() -> None:
    """A run that ends leaves no trace of the queue on the machine (the peers bench found every
    node's ``/tmp`` still holding ``fleetrun-queue-<host>.u<uid>`` after teardown); a folder that
    still holds another run's entry stays."""
    top = Path(tempfile.mkdtemp(prefix="fleetrun-queue-test-"))
    try:
        top.chmod(0o1777)
        _script(top, "enqueue", "run-a")
        _script(top, "enqueue", "run-b")
        (folder,) = [p for p in top.iterdir() if p.name.startswith("fleetrun-queue-")]
        _script(top, "leave", "run-a")
        assert folder.is_dir(), "run-b's entry is still in it"
        _script(top, "leave", "run-b")
        assert list(top.iterdir()) == [], "the emptied folder went with the last entry"
        again = parse_listing(_script(top, "enqueue", "run-c"))
        assert [e.run_id for e in again] == ["run-c"]
    finally:
        shutil.rmtree(top, ignore_errors=True)
