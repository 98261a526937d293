"""The node agent and watchdog, run as plain local processes (no fleet needed)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
AGENT = str(NODELIB / "fleetrun_node.py")


def agent(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, AGENT, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_run(tmp_path: Path, run_id: str, body: str) -> Path:
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text(f"export FLEETRUN_RUN_ID={run_id}\n{body}\n")
    return run_dir


def wait_state(run_dir: Path, state: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    answer: dict = {}
    while time.monotonic() < deadline:
        answer = agent("poll", str(run_dir), "0", "--no-heartbeat")
        if answer["state"] == state:
            return answer
        time.sleep(0.1)
    raise AssertionError(f"state stayed {answer.get('state')}")


def test_start_poll_exit_code_and_metrics(tmp_path: Path) -> None:
    run_dir = make_run(
        tmp_path, "r-ok", 'printf \'{"step": 1, "loss": 0.5}\\n{"step": 2, "lo\' > metrics.jsonl; exit 7'
    )
    assert agent("start", str(run_dir))["pid"] > 0
    answer = wait_state(run_dir, "exited")
    assert answer["rc"] == 7 and answer["exited_at"] > 0
    chunk = base64.b64decode(answer["metrics_b64"])
    assert chunk.startswith(b'{"step": 1') and answer["offset"] == len(chunk)
    again = agent("poll", str(run_dir), str(answer["offset"]), "--no-heartbeat")
    assert again["metrics_b64"] == "", "incremental: nothing new after the offset"
    assert not (run_dir / "watcher-heartbeat").exists()
    agent("poll", str(run_dir), "0")
    assert (run_dir / "watcher-heartbeat").exists(), "a watcher poll refreshes the heartbeat"


def test_stop_kills_the_whole_tree_including_escaped_sessions(tmp_path: Path) -> None:
    # a child in a session of its own, like torchrun's workers: killing the parent would miss it
    run_dir = make_run(tmp_path, "r-tree", "setsid sleep 300 & sleep 300")
    agent("start", str(run_dir))
    wait_state(run_dir, "running")
    time.sleep(0.3)
    marker = b"FLEETRUN_RUN_ID=r-tree"
    before = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _has_marker(p, marker)]
    assert len(before) >= 2, "the job and the escaped sleep carry the run id"
    stopped = agent("stop", "r-tree", "2")
    assert stopped["remaining"] == 0 and stopped["terminated"] >= 2
    answer = wait_state(run_dir, "exited")
    assert answer["rc"] != 0


def _has_marker(proc: Path, marker: bytes) -> bool:
    try:
        env = (proc / "environ").read_bytes().split(b"\0")
        stat = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return marker in env and stat != "Z"


def test_vanished_when_killed_without_exit_code(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "r-gone", "sleep 300")
    pid = agent("start", str(run_dir))["pid"]
    wait_state(run_dir, "running")
    subprocess.run(["kill", "-9", "--", f"-{pid}"], check=False)  # the whole session, wrapper included
    assert wait_state(run_dir, "vanished")["rc"] is None


def test_upload_without_bucket_is_reported_not_raised(tmp_path: Path) -> None:
    answer = agent("upload", str(tmp_path), '{"argv": []}')
    assert answer == {"upload": "no bucket configured; artifacts stay on the node's disk", "ok": False}


def test_upload_runs_the_laptops_command_with_the_run_dir(tmp_path: Path) -> None:
    """The node knows no cloud: it runs the command it was given, ``{src}`` = its run directory."""
    target = tmp_path / "bucket"
    request = json.dumps({"argv": ["cp", "-r", "{src}", str(target)]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "node.log").write_text("hello")
    answer = agent("upload", str(run_dir), request)
    assert answer == {"upload": f"uploaded to {target}", "ok": True}
    assert (target / "node.log").read_text() == "hello"


def test_watchdog_takes_over_when_the_watcher_is_silent(tmp_path: Path) -> None:
    """No heartbeat for watcher_lost_after_s: the guard stops the stalled run and runs the power-off hook."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True)
    (home / ".fleetrun" / "poweroff").write_text('touch "$HOME/powered-off"\n')
    run_dir = make_run(tmp_path, "r-guard", 'echo \'{"step": 1, "loss": 1.0}\' > metrics.jsonl; sleep 300')
    (run_dir / "guard.json").write_text(
        json.dumps(
            {
                "expects_metrics": True,
                "run_id": "r-guard",
                "node": "n0",
                "started_at": time.time(),
                "starts_processes": True,
                "watcher_lost_after_s": 1,
                "stall_timeout_s": 2,
                "nan_loss": True,
                "peers": [],
            }
        )
    )
    env_home = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, AGENT, "start", str(run_dir)],
        capture_output=True,
        text=True,
        env=env_home,
        check=True,
    )
    assert json.loads(out.stdout)["guard"] is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (run_dir / "guard-outcome.json").exists():
        time.sleep(0.2)
    outcome = json.loads((run_dir / "guard-outcome.json").read_text())
    assert outcome["rule"] == "stalled", outcome
    assert outcome["stopped"]["remaining"] == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (home / "powered-off").exists():
        time.sleep(0.1)
    assert (home / "powered-off").exists(), "the power-off hook ran"
    assert wait_state(run_dir, "exited")["rc"] != 0


def test_serve_answers_each_poll_line_incrementally_and_exits_on_eof(tmp_path: Path) -> None:
    """The watcher's persistent poll channel: one JSON line per request, offsets honoured,
    a bad request answered with an error (not a crash), and exit when the watcher goes away."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    first_len = len('{"step": 1, "loss": 2.0}\n')
    proc = subprocess.Popen(
        [sys.executable, AGENT, "serve", str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write('{"op": "poll", "offset": 0}\n')
    proc.stdin.flush()
    whole = json.loads(proc.stdout.readline())
    proc.stdin.write(f'{{"op": "poll", "offset": {first_len}}}\nnonsense\n')
    proc.stdin.flush()
    rest = json.loads(proc.stdout.readline())
    bad = json.loads(proc.stdout.readline())
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert base64.b64decode(whole["metrics_b64"]).count(b"\n") == 2
    assert base64.b64decode(rest["metrics_b64"]) == b'{"step": 2, "loss": 1.5}\n'
    assert rest["offset"] == whole["offset"]
    assert "unknown request" in bad["error"]
    assert (run_dir / "watcher-heartbeat").exists()
