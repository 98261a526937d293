"""Run records: what ran, from which playbook and commit, how it ended and what it cost.

One embedded SQLite file (standard library only) holds every run launched from a project, so
``fab runs`` and ``fab show`` work offline and after the fleet is gone. Durability matters
more than speed here: the watcher may be killed at any moment (Ctrl-C, a closed laptop lid,
SIGKILL), so

* the database runs in WAL mode, and every change is one short ``BEGIN IMMEDIATE`` ...
  ``COMMIT`` transaction: a crash loses at most the change in flight, never the file;
* ``synchronous=NORMAL``, which in WAL mode survives a crash of the process (it can lose the
  last commits only on power loss, and still does not corrupt the file);
* a ``running`` record whose watcher died is detected later (dead pid on this host, or a
  heartbeat too old) and marked ``interrupted`` by :meth:`RunRecords.mark_stale_as_interrupted`,
  so it can be re-attached instead of showing "running" forever.

The schema carries a version (table ``schema_version``); :data:`MIGRATIONS` lists the SQL
steps in order and opening a database applies the missing ones, each in its own transaction.
"""

from __future__ import annotations

import builtins
import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

from launch.processes import pid_alive  # noqa: F401 - re-exported for the run commands
from launch.reports.run_record import RunRecord, RunState  # the record itself lives with its views

FINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "stopped"})

#: SQL steps, applied in order; ``MIGRATIONS[i]`` brings the schema from version i to i + 1.
#: Append new steps; never edit a released one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id            TEXT PRIMARY KEY,
        playbook_path TEXT,
        playbook_name TEXT,
        playbook_hash TEXT,
        git_commit    TEXT,
        inventory     TEXT NOT NULL DEFAULT '{}',
        launcher      TEXT,
        started_at    REAL NOT NULL,
        ended_at      REAL,
        state         TEXT NOT NULL
            CHECK (state IN ('running', 'succeeded', 'failed', 'stopped', 'interrupted')),
        stop_rule     TEXT,
        stop_reason   TEXT,
        exit_codes    TEXT NOT NULL DEFAULT '{}',
        last_metrics  TEXT NOT NULL DEFAULT '{}',
        cost_usd      REAL,
        run_dir       TEXT,
        artifacts     TEXT NOT NULL DEFAULT '[]',
        watcher_pid   INTEGER,
        watcher_host  TEXT,
        heartbeat_at  REAL
    );
    CREATE INDEX runs_started_at ON runs (started_at);
    CREATE INDEX runs_state ON runs (state);
    """,
    # The playbook's hyperparameters (``fab compare`` puts runs side by side by them).
    """
    ALTER TABLE runs ADD COLUMN hyperparameters TEXT NOT NULL DEFAULT '{}';
    """,
    # one run id, several attempts (``recovery:``): each attempt's nodes, end and steps recomputed
    "ALTER TABLE runs ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]'",
    # ``--set key=value`` given for the run (``launch.job.overrides``): ``fab show``/``fab compare``;
    # the sweep a run is a variant of (``fab sweep``; ``fab runs --sweep ID``)
    """
    ALTER TABLE runs ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE runs ADD COLUMN sweep_id TEXT;
    """,
    # GPU energy (``launch.rules.energy``): the run's total (NULL: no GPU readings, never 0) and
    # each attempt's figure, kept up to date by the watcher's heartbeat so that a re-attached
    # watcher goes on from the attempt's energy so far
    """
    ALTER TABLE runs ADD COLUMN energy_kwh REAL;
    ALTER TABLE runs ADD COLUMN energy_by_attempt TEXT NOT NULL DEFAULT '{}';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

_JSON_COLUMNS = (
    "inventory",
    "exit_codes",
    "last_metrics",
    "artifacts",
    "hyperparameters",
    "attempts",
    "overrides",
    "energy_by_attempt",
)
_LIST_COLUMNS = ("artifacts", "attempts")
_UPDATABLE = frozenset(
    {
        "playbook_hash",
        "git_commit",
        "inventory",
        "launcher",
        "exit_codes",
        "last_metrics",
        "cost_usd",
        "energy_kwh",
        "energy_by_attempt",
        "run_dir",
        "artifacts",
        "attempts",
        "watcher_pid",
        "watcher_host",
        "heartbeat_at",
    }
)


def _row_to_record(row: sqlite3.Row) -> RunRecord:
    data = dict(row)
    for column in _JSON_COLUMNS:
        data[column] = json.loads(data[column]) if data[column] else ([] if column in _LIST_COLUMNS else {})
    return RunRecord(**data)


def _encode(column: str, value: Any) -> Any:
    """JSON columns are stored as text; None stores the empty value (the columns are NOT NULL)."""
    if column not in _JSON_COLUMNS:
        return value
    if value is None:
        value = [] if column in _LIST_COLUMNS else {}
    return json.dumps(value)


def new_run_id(started_at: float) -> str:
    """``20251123-074012-3f9c``: sortable by start time (UTC), unique enough to type."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(started_at)) + "-" + secrets.token_hex(2)


def _private_file(path: Path) -> None:
    """``path``'s directory 0700 (made so, or tightened when it is ours and open to others: it is
    ``FLEETRUN_HOME``, with keys and run history) and the database file 0600 before SQLite opens
    it (SQLite gives its ``-wal`` and ``-shm`` files the database's mode)."""
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = parent.stat()
    shared = info.st_mode & 0o1002 or parent.resolve() in (Path("/"), Path.home().resolve())
    if info.st_uid == os.getuid() and info.st_mode & 0o077 and not shared:  # never /tmp, / or ~
        os.chmod(parent, 0o700)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if name.stat().st_uid == os.getuid() and name.stat().st_mode & 0o077:
                os.chmod(name, 0o600)
        except FileNotFoundError:
            continue


class RunRecords:
    """The run-records database at ``path`` (created with its parents if missing).

    One connection per instance; use it from one thread. Several processes may open the same
    file (the watcher writes while ``fab runs`` reads): WAL lets readers proceed, and writers
    wait up to ``timeout_s`` for each other.
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        _private_file(self.path)  # run history and hyperparameters: the owner's only
        self._db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._wal(timeout_s)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _wal(self, timeout_s: float) -> None:
        """WAL mode, waited for: two processes opening a new file at once (two sweep variants'
        first ``fab train``) can be told "database is locked" at once, without SQLite's busy wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: all of it lands, or none of it (also if the process dies)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version (version) VALUES (0)")
        while (version := self.schema_version) < SCHEMA_VERSION:
            with self._transaction() as db:
                # Re-read inside the write lock: another process may have migrated meanwhile.
                if db.execute("SELECT version FROM schema_version").fetchone()[0] != version:
                    continue
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("UPDATE schema_version SET version = ?", (version + 1,))
        if self.schema_version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has run-records schema {self.schema_version}, newer than this fleetrun "
                f"understands ({SCHEMA_VERSION}); upgrade fleetrun"
            )

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    def start(
        self,
        *,
        playbook_path: str | None = None,
        playbook_name: str | None = None,
        playbook_hash: str | None = None,
        git_commit: str | None = None,
        inventory: Mapping[str, Any] | None = None,
        launcher: str | None = None,
        run_dir: str | None = None,
        started_at: float | None = None,
        run_id: str | None = None,
        watcher_pid: int | None = None,
        watcher_host: str | None = None,
        hyperparameters: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
        sweep_id: str | None = None,
    ) -> RunRecord:
        """Insert a ``running`` record and return it. The watcher pid defaults to this process."""
        started = time.time() if started_at is None else started_at
        rid = run_id or new_run_id(started)
        with self._transaction() as db:
            db.execute(
                """INSERT INTO runs (id, playbook_path, playbook_name, playbook_hash, git_commit,
                   inventory, launcher, started_at, state, run_dir, watcher_pid, watcher_host, heartbeat_at,
                   hyperparameters, overrides, sweep_id)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)""",
                (
                    rid,
                    playbook_path,
                    playbook_name,
                    playbook_hash,
                    git_commit,
                    _encode("inventory", dict(inventory or {})),
                    launcher,
                    started,
                    run_dir,
                    os.getpid() if watcher_pid is None else watcher_pid,
                    watcher_host or socket.gethostname(),
                    started,
                    _encode("hyperparameters", dict(hyperparameters or {})),
                    _encode("overrides", dict(overrides or {})),
                    sweep_id,
                ),
            )
        return self._require(rid)

    def update(self, run_id: str, **fields: Any) -> RunRecord:
        """Change some columns of a run in one transaction, e.g. ``update(rid, heartbeat_at=now,
        last_metrics={...}, cost_usd=1.2)``. Allowed: see ``_UPDATABLE``; state changes go
        through :meth:`finish` / :meth:`reattach` so a final record cannot be reopened by accident.
        """
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update run column(s) {sorted(unknown)}; allowed: {sorted(_UPDATABLE)}")
        if fields:
            with self._transaction() as db:
                self._set(db, run_id, fields)
        return self._require(run_id)

    def heartbeat(self, run_id: str, now: float, **fields: Any) -> RunRecord:
        """The watcher's periodic "still here", optionally with fresh metrics/cost."""
        return self.update(run_id, heartbeat_at=now, **fields)

    def finish(
        self,
        run_id: str,
        *,
        state: RunState,
        ended_at: float | None = None,
        stop_rule: str | None = None,
        stop_reason: str | None = None,
        **fields: Any,
    ) -> RunRecord:
        """Record how a run ended (``succeeded``/``failed``/``stopped``, or ``interrupted``)."""
        if state not in get_args(RunState) or state == "running":
            raise ValueError(f"finish() needs a final state, not {state!r}")
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update run column(s) {sorted(unknown)}")
        ended = time.time() if ended_at is None else ended_at
        with self._transaction() as db:
            self._set(
                db,
                run_id,
                {
                    **fields,
                    "state": state,
                    "ended_at": ended if state in FINAL_STATES else None,
                    "stop_rule": stop_rule,
                    "stop_reason": stop_reason,
                },
            )
        return self._require(run_id)

    def reattach(self, run_id: str, *, now: float, watcher_pid: int | None = None) -> RunRecord:
        """A new watcher takes over an ``interrupted`` (or ``running``) run."""
        with self._transaction() as db:
            record = self._get(db, run_id)
            if record is None:
                raise KeyError(run_id)
            if record.state in FINAL_STATES:
                raise ValueError(f"run {run_id} already ended ({record.state}); nothing to re-attach to")
            self._set(
                db,
                run_id,
                {
                    "state": "running",
                    "watcher_pid": os.getpid() if watcher_pid is None else watcher_pid,
                    "watcher_host": socket.gethostname(),
                    "heartbeat_at": now,
                    "stop_rule": None,
                    "stop_reason": None,
                },
            )
        return self._require(run_id)

    def get(self, run_id: str) -> RunRecord | None:
        return self._get(self._db, run_id)

    def list(self, limit: int = 20, *, state: RunState | None = None) -> builtins.list[RunRecord]:
        """The most recent runs first."""
        query, args = "SELECT * FROM runs", []
        if state is not None:
            query, args = query + " WHERE state = ?", [state]
        rows = self._db.execute(query + " ORDER BY started_at DESC, id DESC LIMIT ?", (*args, limit))
        return [_row_to_record(r) for r in rows]

    def of_sweep(self, sweep_id: str) -> builtins.list[RunRecord]:
        """The runs of one ``fab sweep`` (its variants), in the order they started."""
        rows = self._db.execute("SELECT * FROM runs WHERE sweep_id = ? ORDER BY started_at, id", (sweep_id,))
        return [_row_to_record(r) for r in rows]

    def mark_stale_as_interrupted(
        self,
        now: float,
        *,
        heartbeat_timeout_s: float = 300.0,
        is_alive: Callable[[int], bool] = pid_alive,
        host: str | None = None,
    ) -> builtins.list[str]:
        """Mark ``running`` runs whose watcher is gone as ``interrupted``; return their ids.

        A watcher is gone when it ran on this host and its pid is dead, or when its heartbeat
        is older than ``heartbeat_timeout_s`` (the only test possible for another host, and a
        backstop against a recycled pid).
        """
        here = host or socket.gethostname()
        marked: builtins.list[str] = []
        with self._transaction() as db:
            for row in db.execute("SELECT * FROM runs WHERE state = 'running'").fetchall():
                record = _row_to_record(row)
                last = record.heartbeat_at if record.heartbeat_at is not None else record.started_at
                dead = record.watcher_host == here and record.watcher_pid is not None
                dead = dead and not is_alive(record.watcher_pid or 0)
                if dead:
                    why = f"watcher pid {record.watcher_pid} on {here} is no longer running"
                elif now - last > heartbeat_timeout_s:
                    why = f"no watcher heartbeat for {now - last:.0f} s"
                else:
                    continue
                self._set(
                    db,
                    record.id,
                    {
                        "state": "interrupted",
                        "stop_rule": "watcher_lost",
                        "stop_reason": why + "; re-attach to resume",
                    },
                )
                marked.append(record.id)
        return marked

    def _require(self, run_id: str) -> RunRecord:
        record = self.get(run_id)
        if record is None:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        return record

    @staticmethod
    def _get(db: sqlite3.Connection, run_id: str) -> RunRecord | None:
        row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else _row_to_record(row)

    @staticmethod
    def _set(db: sqlite3.Connection, run_id: str, fields: Mapping[str, Any]) -> None:
        columns: Sequence[str] = sorted(fields)
        values = [_encode(c, fields[c]) for c in columns]
        assignments = ", ".join(f"{c} = ?" for c in columns)  # names come from fixed sets, not users
        cursor = db.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*values, run_id))
        if cursor.rowcount == 0:
            raise KeyError(f"no run {run_id!r}")
