"""The watcher against nodes that answer garbage, and the laptop's side of the node protocol.

No fleet: a small fake fleet whose connections either replay scripted answer lines or talk to
the real node agent (``fleetrun_node.py serve``) in a subprocess on a temporary run directory.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from launch.errors import HostError
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.refs import StackFleetRef
from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import GuardConfig, PollAnswer
from launch.rules.stoprules import RuleState, StopRules, evaluate
from launch.run.watch import Watcher, WatchTarget
from launch.transport.channels import MAX_ANSWER_BYTES, LineSession
from tests.conftest import sample_inventory

AGENT = str(Path(__file__).resolve().parent.parent / "launch" / "nodelib" / "fleetrun_node.py")
T0 = 1_700_000_000.0


class ScriptedConnection:
    """Replays answer lines, one per poll, and records the requests."""

    def __init__(self, host: Host, answers: Iterable[str]) -> None:
        self.host = host
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self.sessions_closed = 0

    def ask(self, command: str, request: str, timeout: float) -> str:
        self.requests.append(json.loads(request))
        return self.answers.pop(0)

    def close_sessions(self) -> None:
        self.sessions_closed += 1


class AgentConnection:
    """The real node agent's poll channel, as a local subprocess."""

    def __init__(self, host: Host, run_dir: Path) -> None:
        self.host = host
        self.run_dir = run_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def ask(self, command: str, request: str, timeout: float) -> str:
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, AGENT, "serve", str(self.run_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(request.encode() + b"\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().decode("utf-8", "replace")

    def close_sessions(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
            self.proc = None


class FakeFleet:
    def __init__(self, connections: list[Any]) -> None:
        self.connections = {c.host.name: c for c in connections}
        self.hosts = [c.host for c in connections]

    def map(self, fn: Callable[[Any], Any], deadline: float | None = None, **_: Any) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for name, conn in self.connections.items():
            try:
                results[name] = fn(conn)
            except Exception as exc:  # noqa: BLE001 - collected per host, like Fleet.map
                results[name] = exc
        return results


def target(tmp_path: Path, nodes: int = 1, bucket: str | None = None, cloud: str = "aws") -> WatchTarget:
    inv = sample_inventory(nodes)
    if bucket:
        inv = inv.model_copy(
            update={"fleet": StackFleetRef(stack="s", cluster_id="c", cloud=cloud, bucket=bucket)}
        )
    return WatchTarget(
        run_id="job-20250101-000000-abc123",
        job="job",
        inventory=inv,
        starters=tuple(h.name for h in inv.hosts[:1]),
        rules=StopRules(unreachable_timeout_s=120, stall_timeout_s=None, startup_timeout_s=None),
        teardown="never",
        started_at=T0,
        folder=tmp_path,
    )


def console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=300, force_terminal=False), buf


def good(offset: int, data: bytes = b"", state: str = "running") -> str:
    return PollAnswer(state=state, offset=offset + len(data), metrics=data).to_json()


GARBAGE = {
    "markup in a state": '{"state": "[bold red]boom[/]", "offset": 25}',
    "a list": "[]",
    "rc not a number": '{"state": "exited", "rc": "x", "offset": 25}',
    "gpu_util a string": '{"state": "running", "gpu_util": "99", "offset": 25}',
    "offset not a number": '{"state": "running", "offset": "zz"}',
    "not JSON": "Segmentation fault (core dumped)",
    "nesting bomb": "[" * 200_000,
    "agent error": '{"error": "unknown request"}',
    "offset that does not follow": '{"state": "running", "offset": 999}',
}


def test_garbage_answers_are_bad_answers_not_crashes(tmp_path: Path) -> None:
    line = b'{"step": 1, "loss": 0.5}\n'
    answers = [good(0, line), *GARBAGE.values(), good(len(line), b"", "exited")]
    conn = ScriptedConnection(sample_inventory(1).hosts[0], answers)
    out, buf = console()
    watcher = Watcher(target(tmp_path), FakeFleet([conn]), out)  # type: ignore[arg-type]
    first = watcher.poll_once()
    reached = watcher.nodes["n0"].last_reachable_at
    assert first.nodes[0].state == "running" and first.metrics.records == 1
    for i, case in enumerate(GARBAGE, start=1):
        obs = watcher.poll_once()
        node = watcher.nodes["n0"]
        assert node.state == "bad answer", case
        assert node.error.startswith("n0: bad answer"), (case, node.error)
        assert node.bad_answers == i
        assert obs.nodes[0].state == "unreachable" and obs.nodes[0].last_reachable_at == reached, case
    final = watcher.poll_once()
    assert [r["offset"] for r in conn.requests] == [0] + [len(line)] * (len(GARBAGE) + 1), (
        "a bad answer never moves the metrics offset"
    )
    assert final.nodes[0].state == "exited" and watcher.nodes["n0"].error == ""
    printed = buf.getvalue()
    assert "n0: running -> bad answer" in printed and "[bold red]" in printed, "node text printed as data"
    assert conn.sessions_closed >= 5, "a channel out of step with the protocol is restarted"


def test_bad_answers_fail_the_run_only_through_the_unreachable_rule(tmp_path: Path) -> None:
    conn = ScriptedConnection(sample_inventory(1).hosts[0], [good(0), "[]"])
    watcher = Watcher(target(tmp_path), FakeFleet([conn]), console()[0])  # type: ignore[arg-type]
    watcher.poll_once()
    watcher.poll_once()
    reached = watcher.nodes["n0"].last_reachable_at
    assert reached is not None
    rules = watcher.target.rules
    state = RuleState()
    assert evaluate(rules, watcher.observation(reached + 60), state) is None, "within the limit: keep polling"
    decision = evaluate(rules, watcher.observation(reached + 121), state)
    assert decision is not None and decision.rule == "unreachable" and decision.nodes == ("n0",)


def test_real_agent_on_hostile_files_through_the_watcher(tmp_path: Path) -> None:
    """Bombs in metrics.jsonl and status.json, a garbage pid: the agent answers, the watcher
    counts bad lines, reports what the node could not read, and a vanished node fails the run."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = (
        b"[" * 200_000
        + b"\n"
        + b'{"step": 0, "pad": "'
        + b"x" * 3_000_000
        + b'"}\n'
        + b'{"step": "\xff"}\n'
        + b'{"step": 1, "loss": 0.5}\n'
    )
    (run_dir / "metrics.jsonl").write_bytes(metrics)
    (run_dir / "status.json").write_bytes(b'{"status": "failed", "x": ' + b"[" * 30_000 + b"}")
    (run_dir / "pid").write_text("not-a-pid")
    conn = AgentConnection(sample_inventory(1).hosts[0], run_dir)
    out, buf = console()
    watcher = Watcher(target(tmp_path), FakeFleet([conn]), out)  # type: ignore[arg-type]
    try:
        for _ in range(10):  # 1 MiB of metrics per poll
            obs = watcher.poll_once()
            if watcher.nodes["n0"].offset == len(metrics):
                break
        node = watcher.nodes["n0"]
        assert node.offset == len(metrics) and node.state == "vanished" and node.bad_answers == 0
        summary = watcher.metrics()
        assert summary.records == 1 and summary.last_loss == 0.5
        assert summary.bad_lines == 3, "bomb, over-long line, invalid UTF-8"
        assert any("pid" in n for n in node.malformed) and any("nested deeper" in n for n in node.malformed)
        assert "unreadable on the node" in buf.getvalue()
        decision = evaluate(watcher.target.rules, obs, RuleState())
        assert decision is not None and decision.outcome == "failed" and decision.rule == "vanished"
        (run_dir / "status.json").write_text(
            json.dumps({"status": "failed", "message": "could not open [/data/x]"})
        )
        watcher.poll_once()
        assert watcher.final_status is not None and watcher.final_status.message == "could not open [/data/x]"
    finally:
        watcher.close()


class EndlessChannel:
    """A channel whose far end streams bytes without ever sending a newline."""

    def __init__(self) -> None:
        self.closed = False
        self.received = 0

    def settimeout(self, timeout: float) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        pass

    def recv(self, size: int) -> bytes:
        self.received += size
        return b"x" * size

    def exit_status_ready(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def test_line_session_refuses_an_answer_without_end() -> None:
    channel = EndlessChannel()
    session = LineSession("n0", channel)  # type: ignore[arg-type]
    with pytest.raises(HostError, match="longer than"):
        session.ask('{"op": "poll", "offset": 0}', timeout=5)
    assert channel.closed
    assert channel.received <= MAX_ANSWER_BYTES + 2 * 65536, "buffering stopped at the cap"


def test_guard_config_written_by_the_laptop(tmp_path: Path) -> None:
    """What the watchdog reads is what the laptop writes: expects_metrics where ranks start,
    the upload command decided here, no keys nothing reads."""
    t = target(tmp_path, nodes=2, bucket="team-bucket", cloud="gcp")
    head, worker = (GuardConfig.from_json(t.guard_config(n).to_json()) for n in ("n0", "n1"))
    assert head.expects_metrics and head.starts_processes
    assert not worker.expects_metrics and not worker.starts_processes
    assert head.peers == ("10.0.0.2",) and worker.peers == ("10.0.0.1",)
    assert head.upload_argv == (
        "gcloud",
        "storage",
        "rsync",
        "--recursive",
        "{src}",
        f"gs://team-bucket/runs/{t.run_id}/n0",
    )
    assert not {"is_head", "head_addr", "cloud"} & set(t.guard_config("n0").to_dict())
    # the checkpoint helper's and the watchdog's bucket: the run's prefix, the same CLI
    assert head.bucket is not None and head.bucket.url == f"gs://team-bucket/runs/{t.run_id}"
    assert head.bucket.sync[:3] == ("gcloud", "storage", "rsync") and head.preemption == "gce-metadata"
    assert t.upload_argv("n1")[-1] == f"gs://team-bucket/runs/{t.run_id}/n1"  # type: ignore[index]


def test_bucket_upload_argv_per_cloud() -> None:
    assert CLOUDS["aws"].upload_argv("b", "runs/r/n") == [
        "aws",
        "s3",
        "sync",
        "--only-show-errors",
        "{src}",
        "s3://b/runs/r/n",
    ]
    assert CLOUDS["gcp"].upload_argv("b", "d")[-1] == "gs://b/d"


def test_poll_answer_metrics_survive_the_wire() -> None:
    """Raw bytes (a chunk may end inside a UTF-8 character) pass through base64 unchanged."""
    data = "é".encode()[:1] + b"\xff\n"
    wire = json.loads(PollAnswer(state="running", offset=3, metrics=data).to_json())
    assert base64.b64decode(wire["metrics_b64"]) == data
    assert PollAnswer.from_json(json.dumps(wire)).metrics == data
