"""A save rank 0 makes during the recovery's stop grace counts for the next attempt.

The grace exists so that a rank still stepping can write a checkpoint; the watcher had stopped
reading by then, so the save was never recorded and the next attempt refused it ("never recorded
as saved by rank 0", seen in the Slurm DOWN test) and resumed from an older step. ``late_saves``
reads the end of rank 0's ended-attempt metrics on its node, with the watcher's own parser."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from launch.run.attempts import late_saves
from launch.run.peer_copies import PeerCopies
from launch.run.reporter import RecordingReporter
from launch.transport.port import CommandResult

DIGEST_10, DIGEST_15 = "a" * 64, "b" * 64


class _Conn:
    def __init__(self, text: str, ok: bool = True) -> None:
        self.text, self.ok, self.commands = text, ok, list[str]()

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        return CommandResult("n0", 0 if self.ok else 1, self.text, "")


def _ctx(tmp_path: Path, conn: _Conn, holder: str | None = "n0") -> Any:
    peers = PeerCopies("r1", tmp_path, lambda line: None)
    peers.offer({10: DIGEST_10}, holder)
    return SimpleNamespace(
        peers=peers, port=SimpleNamespace(connections={"n0": conn}), reporter=RecordingReporter()
    )


def _state() -> Any:
    return SimpleNamespace(plan=SimpleNamespace(run_id="r1"), attempt=1)


def metrics(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_a_save_during_the_grace_is_recorded_and_said(tmp_path: Path) -> None:
    conn = _Conn(
        "tial line cut by tail -c\n"
        + metrics(
            {"step": 14, "loss": 0.5, "time": 1.0},
            {"event": "checkpoint_saved", "step": 15, "manifest": DIGEST_15},
            {"event": "checkpoint_saved", "step": 16, "manifest": "not-a-digest"},
        )
        + "[" * 5000  # a nesting bomb at the end: a bad line, not a crash
    )
    ctx = _ctx(tmp_path, conn)
    late_saves(ctx, _state(), {"n0", "n1"})
    assert ctx.peers.recorded == {10: DIGEST_10, 15: DIGEST_15}
    assert conn.commands == ['tail -c 262144 "$HOME/.fleetrun/runs/r1/attempt-1/metrics.jsonl"']
    assert ctx.reporter.lines == ["  rank 0 saved step 15 during the stop's grace: recorded"]


def test_rank_0s_node_lost_or_silent_changes_nothing(tmp_path: Path) -> None:
    text = metrics({"event": "checkpoint_saved", "step": 15, "manifest": DIGEST_15})
    lost = _ctx(tmp_path, _Conn(text))
    late_saves(lost, _state(), {"n1"})  # rank 0's node is the one lost: not asked
    assert lost.peers.recorded == {10: DIGEST_10} and lost.port.connections["n0"].commands == []
    failing = _ctx(tmp_path, _Conn(text, ok=False))
    late_saves(failing, _state(), {"n0"})
    assert failing.peers.recorded == {10: DIGEST_10} and failing.reporter.lines == []


def test_rank_0s_node_is_known_before_its_first_save() -> None:
    """Before any save the node whose metrics stream has records is rank 0's (it alone writes
    metrics): a first save made during the grace is looked for there."""
    from launch.run.peer_copies import saver

    def node(records: int = 0, saved: dict[int, str] | None = None) -> Any:
        return SimpleNamespace(
            stream=SimpleNamespace(records=records, events=0, saved_checkpoints=saved or {})
        )

    assert saver(SimpleNamespace(nodes={"n0": node(), "n1": node(records=3)})) == "n1"
    assert saver(SimpleNamespace(nodes={"n0": node(records=3), "n1": node(saved={5: DIGEST_10})})) == "n1"
    assert saver(SimpleNamespace(nodes={"n0": node(), "n1": node()})) is None
