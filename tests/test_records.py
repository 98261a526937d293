"""Run records: lifecycle, JSON columns, stale detection, migrations, crash safety."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.processes import pid_alive
from launch.run.provenance import file_sha256, git_commit_of
from launch.run.records import SCHEMA_VERSION, RunRecords, new_run_id

T0 = 1_700_000_000.0
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[RunRecords]:
    records = RunRecords(tmp_path / "state" / "runs.db")
    yield records
    records.close()


def start(db: RunRecords, **kw: object) -> str:
    args: dict[str, object] = {
        "playbook_path": "playbooks/ddp.yaml",
        "playbook_name": "ddp",
        "playbook_hash": "abc",
        "git_commit": "deadbeef",
        "inventory": {"nodes": [{"name": "node0"}, {"name": "node1"}]},
        "launcher": "torchrun",
        "run_dir": "runs/x",
        "started_at": T0,
        "watcher_pid": 4242,
        "watcher_host": "laptop",
    }
    args.update(kw)
    return db.start(**args).id  # type: ignore[arg-type]


def test_start_update_finish_roundtrip(db: RunRecords) -> None:
    rid = start(db)
    rec = db.get(rid)
    assert rec is not None and rec.state == "running" and rec.ended_at is None
    assert rec.inventory["nodes"][1]["name"] == "node1"
    assert rec.heartbeat_at == T0

    db.heartbeat(rid, T0 + 10, last_metrics={"step": 5, "loss": float("nan")}, cost_usd=1.5)
    rec = db.get(rid)
    assert rec is not None and rec.heartbeat_at == T0 + 10 and rec.cost_usd == 1.5
    assert math.isnan(rec.last_metrics["loss"])  # NaN survives the JSON column

    done = db.finish(
        rid,
        state="failed",
        ended_at=T0 + 60,
        stop_rule="rank_failed",
        stop_reason="node1 exited with exit code 1",
        exit_codes={"node0": None, "node1": 1},
        artifacts=["runs/x/loss.png"],
    )
    assert done.state == "failed" and done.ended_at == T0 + 60
    assert done.exit_codes == {"node0": None, "node1": 1}
    assert done.artifacts == ["runs/x/loss.png"]
    assert done.stop_rule == "rank_failed" and done.duration_s() == 60


def test_update_rejects_unknown_columns_and_unknown_runs(db: RunRecords) -> None:
    rid = start(db)
    with pytest.raises(ValueError, match="state"):
        db.update(rid, state="succeeded")
    with pytest.raises(KeyError):
        db.update("nope", cost_usd=1.0)
    with pytest.raises(ValueError):
        db.finish(rid, state="running")


def test_list_is_newest_first_and_filterable(db: RunRecords) -> None:
    a = start(db, started_at=T0, run_id="a")
    b = start(db, started_at=T0 + 100, run_id="b")
    c = start(db, started_at=T0 + 50, run_id="c")
    db.finish(b, state="succeeded", ended_at=T0 + 200)
    assert [r.id for r in db.list()] == [b, c, a]
    assert [r.id for r in db.list(limit=2)] == [b, c]
    assert [r.id for r in db.list(state="succeeded")] == [b]


def test_mark_stale_by_dead_pid_on_this_host(db: RunRecords) -> None:
    live = start(db, watcher_pid=1, run_id="live")
    dead = start(db, watcher_pid=2, run_id="dead")
    elsewhere = start(db, watcher_pid=2, watcher_host="other", run_id="elsewhere")
    marked = db.mark_stale_as_interrupted(T0 + 1, is_alive=lambda pid: pid == 1, host="laptop")
    assert marked == [dead]
    rec = db.get(dead)
    assert rec is not None and rec.state == "interrupted" and rec.stop_rule == "watcher_lost"
    assert rec.ended_at is None  # not ended: it can be re-attached
    assert "pid 2" in (rec.stop_reason or "")
    states = [r.state for r in db.list() if r.id in (live, elsewhere)]
    assert states == ["running", "running"]


def test_mark_stale_by_old_heartbeat(db: RunRecords) -> None:
    rid = start(db, watcher_host="other")
    db.heartbeat(rid, T0 + 100)
    assert db.mark_stale_as_interrupted(T0 + 399, heartbeat_timeout_s=300, host="laptop") == []
    assert db.mark_stale_as_interrupted(T0 + 401, heartbeat_timeout_s=300, host="laptop") == [rid]
    # finished runs are never touched
    assert db.mark_stale_as_interrupted(T0 + 10_000, host="laptop") == []


def test_reattach_an_interrupted_run(db: RunRecords) -> None:
    rid = start(db)
    db.mark_stale_as_interrupted(T0 + 1, is_alive=lambda pid: False, host="laptop")
    rec = db.reattach(rid, now=T0 + 5, watcher_pid=777)
    assert rec.state == "running" and rec.watcher_pid == 777 and rec.stop_rule is None
    db.finish(rid, state="succeeded", ended_at=T0 + 9)
    with pytest.raises(ValueError, match="already ended"):
        db.reattach(rid, now=T0 + 10)


def test_schema_version_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with RunRecords(path) as first:
        assert first.schema_version == SCHEMA_VERSION
        rid = first.start(playbook_name="p", started_at=T0).id
    with RunRecords(path) as again:  # migrations are not re-applied
        assert again.schema_version == SCHEMA_VERSION
        assert again.get(rid) is not None
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        RunRecords(path)


def test_new_run_id_is_sortable() -> None:
    assert new_run_id(T0) < new_run_id(T0 + 1)
    assert new_run_id(T0).startswith("20231114-")


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    assert not pid_alive(0)


def test_git_commit_of(tmp_path: Path) -> None:
    assert git_commit_of(tmp_path) is None  # not a repository
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    assert git_commit_of(repo) is None  # no commit yet
    (repo / "train.py").write_text("print(1)\n")
    git("add", "train.py")
    git("commit", "-q", "-m", "x")
    clean = git_commit_of(repo)
    assert clean is not None and len(clean) == 40
    (repo / "untracked.txt").write_text("x")
    assert git_commit_of(repo) == clean  # untracked files do not make it dirty
    (repo / "train.py").write_text("print(2)\n")
    assert git_commit_of(repo) == clean + "-dirty"


def test_file_sha256(tmp_path: Path) -> None:
    p = tmp_path / "pb.yaml"
    p.write_text("a: 1\n")
    h = file_sha256(p)
    p.write_text("a: 2\n")
    assert len(h) == 64 and file_sha256(p) != h


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from launch.run.records import RunRecords
    db = RunRecords(sys.argv[1])
    rid = db.start(playbook_name="crash", run_id="crash-run").id
    print(rid, flush=True)
    i = 0
    while True:  # keep writing until killed, so SIGKILL lands mid-update
        i += 1
        db.heartbeat(rid, time.time(), last_metrics={"step": i, "blob": "x" * 4096}, cost_usd=float(i))
        if i == 50:
            print("busy", flush=True)
    """
)


def test_sigkill_mid_run_leaves_a_readable_db_marked_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(REPO_ROOT)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    rid = child.stdout.readline().strip()
    assert child.stdout.readline().strip() == "busy"  # it is in its update loop now
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL

    with RunRecords(path) as db:
        assert db._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rec = db.get(rid)
        assert rec is not None and rec.state == "running" and rec.watcher_pid == child.pid
        assert rec.last_metrics["step"] >= 50  # committed updates survived
        marked = db.mark_stale_as_interrupted(rec.heartbeat_at or 0.0)  # dead pid, fresh heartbeat
        assert marked == [rid]
        after = db.get(rid)
        assert after is not None and after.state == "interrupted"


def test_records_and_their_home_are_private(tmp_path: Path) -> None:
    """Issue 24, item 10: other local users must not read run history and hyperparameters."""
    import stat

    old = os.umask(0o022)  # the usual umask: files 0644, directories 0755
    new_home = tmp_path / "new-home"
    try:
        with RunRecords(new_home / "runs.db") as db:
            start(db)
    finally:
        os.umask(old)
    assert stat.S_IMODE(new_home.stat().st_mode) == 0o700
    for name in ("runs.db", "runs.db-wal", "runs.db-shm"):
        if (new_home / name).exists():
            assert stat.S_IMODE((new_home / name).stat().st_mode) == 0o600, name
    # a home and database made before (0755 / 0644) are tightened when opened
    old_home = tmp_path / "old-home"
    old_home.mkdir(mode=0o755)
    (old_home / "runs.db").touch(mode=0o644)
    os.chmod(old_home, 0o755)
    os.chmod(old_home / "runs.db", 0o644)
    RunRecords(old_home / "runs.db").close()
    assert stat.S_IMODE(old_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((old_home / "runs.db").stat().st_mode) == 0o600
