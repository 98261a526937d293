"""The node agent and watchdog, run as plain local processes (no fleet needed)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# -- hostile files: the agent answers, the watchdog keeps going, the fallback is safe ------------

BOMB = b"[" * 200_000


def guard_config(run_id: str, **fields: object) -> str:
    config: dict[str, object] = {
        "run_id": run_id,
        "node": "n0",
        "started_at": time.time(),
        "starts_processes": True,
        "expects_metrics": True,
        "watcher_lost_after_s": 1,
        "nan_loss": True,
        "peers": [],
    }
    config.update(fields)
    return json.dumps(config)


def wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.2)
    assert path.exists(), f"{path.name} never appeared"


def test_poll_answers_despite_garbage_rc_pid_and_status(tmp_path: Path) -> None:
    """A job can overwrite every file the agent reads; the node must still answer, saying what
    it could not read, or a healthy node would look unreachable."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "rc").write_text("garbage\n")
    (run_dir / "pid").write_bytes(b"\xff" * 5000)
    (run_dir / "status.json").write_bytes(b"[" * 60_000)  # within the size bound: the depth bound acts
    (run_dir / "metrics.jsonl").write_bytes(BOMB + b"\n")
    (run_dir / "node.log").write_bytes(b"\x1b]0;title\x07 \xff\xfe tail")
    answer = agent("poll", str(run_dir), "0", "--no-heartbeat")
    assert answer["state"] == "vanished" and answer["rc"] is None, "no readable exit code, no live pid"
    notes = " | ".join(answer["malformed"])
    assert "rc: 'garbage" in notes and "pid:" in notes and "nested deeper" in notes
    assert answer["status"] is None
    assert base64.b64decode(answer["metrics_b64"]) == BOMB + b"\n", "metrics bytes pass through raw"
    (run_dir / "status.json").write_bytes(b"x" * 1_000_000)
    (run_dir / "rc").write_text("3\n")
    answer = agent("poll", str(run_dir), str(len(BOMB) + 1), "--no-heartbeat")
    assert answer["state"] == "exited" and answer["rc"] == 3
    assert any("status.json" in n and "over the limit" in n for n in answer["malformed"])


def test_serve_survives_garbage_requests_and_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_bytes(b'{"status": "failed", "message": "' + b"[" * 50_000 + b'"}')
    (run_dir / "pid").write_text("not-a-pid")
    proc = subprocess.Popen(
        [sys.executable, AGENT, "serve", str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    requests = [
        b"[" * 3000,  # a nesting bomb (small enough to be a request)
        b"x" * 100_000,  # longer than any request: dropped
        b'{"op": "poll", "offset": "zz"}',
        b"\xff\xfe",
        b'{"op": "poll", "offset": 0}',
    ]
    proc.stdin.write(b"\n".join(requests) + b"\n")
    proc.stdin.flush()
    answers = [json.loads(proc.stdout.readline()) for _ in requests]
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert [bool(a.get("error")) for a in answers] == [True, True, True, True, False]
    assert "longer than" in answers[1]["error"]
    last = answers[-1]
    assert last["state"] == "vanished" and "pid: 'not-a-pid' is not a process id" in last["malformed"]
    assert last["status"]["status"] == "failed", "brackets inside a string are data, not nesting"


def test_start_receives_files_on_stdin_private(tmp_path: Path) -> None:
    """launch.sh and guard.json arrive on stdin (never argv) and land 0600 in a 0700 run dir;
    ~/.fleetrun becomes 0700 too. A bundle naming a path outside the run dir is refused whole."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True, mode=0o755)
    run_dir = home / ".fleetrun" / "runs" / "r-stdin"
    secret_script = "export FLEETRUN_RUN_ID=r-stdin\nexport API_TOKEN=s3cret\necho $API_TOKEN > out.txt\n"
    bundle = {
        "files": {"launch.sh": secret_script, "guard.json": guard_config("r-stdin", watcher_lost_after_s=300)}
    }
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, AGENT, "start", str(run_dir), "--stdin"],
        input=json.dumps(bundle),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    started = json.loads(out.stdout)
    assert started["pid"] > 0 and started["guard"] > 0 and started["guard_error"] == ""
    try:
        assert wait_state(run_dir, "exited")["rc"] == 0
        assert (run_dir / "out.txt").read_text() == "s3cret\n"
        for path in (home / ".fleetrun", home / ".fleetrun" / "runs", run_dir):
            assert path.stat().st_mode & 0o777 == 0o700, path
        for name in ("launch.sh", "guard.json", "pid"):
            assert (run_dir / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        agent("stop", "r-stdin", "1")
    for hostile in ({"files": {"../escape.sh": "x"}}, {"files": {"launch.sh": 1}}, ["launch.sh"]):
        proc = subprocess.run(
            [sys.executable, AGENT, "receive", str(tmp_path / "other")],
            input=json.dumps(hostile),
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert proc.returncode == 2 and "file bundle" in proc.stderr
        assert not (tmp_path / "other").exists() and not (tmp_path / "escape.sh").exists()


def test_start_reports_a_malformed_guard_config_instead_of_starting_blind(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "r-badcfg", "true")
    (run_dir / "guard.json").write_text('{"run_id": "$(reboot)", "node": "n0", "started_at": 1}')
    answer = agent("start", str(run_dir))
    assert answer["guard"] is None and "run_id" in answer["guard_error"]


def test_watchdog_reads_past_metrics_bombs_to_the_nan_loss(tmp_path: Path) -> None:
    """A nesting bomb, a 50 MB line, invalid UTF-8 and a list: each skipped and counted; the
    NaN loss after them is still found and the run stopped for it."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True)
    run_dir = make_run(tmp_path, "r-bombs", "sleep 300")
    with (run_dir / "metrics.jsonl").open("wb") as fh:
        fh.write(BOMB + b"\n")
        fh.write(b'{"step": 1, "loss": "' + b"x" * 50_000_000 + b'"}\n')
        fh.write(b'{"step": 2, "loss": "\xff"}\n[1, 2]\n{"step": 3, "loss": 0.5, "n": ' + b"9" * 50 + b"}\n")
        fh.write(b'{"step": 4, "loss": NaN}\n')
    (run_dir / "guard.json").write_text(guard_config("r-bombs", stall_timeout_s=600))
    subprocess.run(
        [sys.executable, AGENT, "start", str(run_dir)],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
    )
    wait_file(run_dir / "guard-outcome.json")
    outcome = json.loads((run_dir / "guard-outcome.json").read_text())
    assert outcome["rule"] == "nan_loss", outcome
    assert "at step 4" in outcome["reason"]
    assert outcome["malformed_lines"] == 5, "bomb, 50 MB line, invalid UTF-8, a list, a huge integer"
    assert outcome["stopped"]["remaining"] == 0
    assert wait_state(run_dir, "exited")["rc"] != 0


def test_watchdog_startup_rule_fires_only_where_metrics_are_expected(tmp_path: Path) -> None:
    """``expects_metrics`` (written by the laptop) arms the startup rule; a node whose ranks
    said rank 0 is elsewhere (``metrics-elsewhere``) waits instead (here until the wall time)."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True)
    outcomes = {}
    for name, marker in (("r-startup", False), ("r-elsewhere", True)):
        run_dir = make_run(tmp_path, name, "sleep 300")
        if marker:
            (run_dir / "metrics-elsewhere").touch()
        (run_dir / "guard.json").write_text(guard_config(name, startup_timeout_s=1, max_wall_time_s=4))
        subprocess.run(
            [sys.executable, AGENT, "start", str(run_dir)],
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
            check=True,
            capture_output=True,
        )
        wait_file(run_dir / "guard-outcome.json")
        outcomes[name] = json.loads((run_dir / "guard-outcome.json").read_text())
    assert outcomes["r-startup"]["rule"] == "stalled"
    assert "no metrics" in outcomes["r-startup"]["reason"]
    assert outcomes["r-elsewhere"]["rule"] == "wall_time", outcomes["r-elsewhere"]


FAULTY_GUARD = """
import sys
sys.path.insert(0, sys.argv[1])
import fleetrun_guard

def broken(*args, **kwargs):
    raise RuntimeError("a bug in the watchdog's own rules")

fleetrun_guard.decide = broken
sys.exit(fleetrun_guard.main(sys.argv[2]))
"""


def test_watchdog_error_falls_back_to_stop_upload_and_power_off(tmp_path: Path) -> None:
    """The real watchdog with its rule evaluation broken: it must not just exit; it stops the
    run, uploads with the laptop's command, records ``guard_error`` and runs the power-off hook."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True)
    (home / ".fleetrun" / "poweroff").write_text('touch "$HOME/powered-off"\n')
    bucket = tmp_path / "bucket"
    run_dir = make_run(tmp_path, "r-fault", "sleep 300")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    started = subprocess.run(
        [sys.executable, AGENT, "start", str(run_dir)], env=env, check=True, capture_output=True
    )
    assert json.loads(started.stdout)["guard"] is None, (
        "no guard.json yet: only the faulty watchdog below runs"
    )
    wait_state(run_dir, "running")
    (run_dir / "guard.json").write_text(
        guard_config("r-fault", upload_argv=["cp", "-r", "{src}", str(bucket)])
    )
    guard = subprocess.run(
        [sys.executable, "-c", FAULTY_GUARD, str(NODELIB), str(run_dir)],
        env={**env, "FLEETRUN_RUN_ID": "r-fault", "FLEETRUN_GUARD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert guard.returncode == 0, guard.stdout + guard.stderr
    outcome = json.loads((run_dir / "guard-outcome.json").read_text())
    assert outcome["rule"] == "guard_error" and "a bug in the watchdog" in outcome["reason"]
    assert outcome["stopped"]["remaining"] == 0 and outcome["stopped"]["terminated"] >= 1
    assert outcome["upload"] == f"uploaded to {bucket}" and (bucket / "launch.sh").exists()
    assert (home / "powered-off").exists(), "the power-off hook ran"
    assert "Traceback" in guard.stdout and "RuntimeError" in guard.stdout, "the traceback is logged"
    assert wait_state(run_dir, "exited")["rc"] != 0


def test_the_jobs_tmp_is_removed_when_it_ends(tmp_path: Path) -> None:
    """The job's TMPDIR is the run's ``tmp``: torchrun's torchelastic_* dirs go there, not /tmp."""
    run_dir = make_run(
        tmp_path, "r-tmp", "mkdir -p tmp/torchelastic_x && echo x > tmp/torchelastic_x/f; exit 3"
    )
    agent("start", str(run_dir))
    assert wait_state(run_dir, "exited")["rc"] == 3
    assert not (run_dir / "tmp").exists()


def test_stop_removes_the_runs_tmp_but_never_through_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper killed with its job (a whole session killed, a node that lost power before the
    stop) never reaches its clean-up: ``stop`` removes the run's ``tmp`` too. A job that put a
    symlink there (to the user's files) never gets the link's target emptied; a run id that is
    not a plain name touches nothing."""
    sys.path.insert(0, str(NODELIB))
    import fleetrun_node

    monkeypatch.setenv("HOME", str(tmp_path))
    runs = tmp_path / ".fleetrun" / "runs"
    (runs / "r-gone" / "tmp" / "torchelastic_x").mkdir(parents=True)
    assert fleetrun_node.stop_run("r-gone", 0.0).remaining == 0
    assert not (runs / "r-gone" / "tmp").exists() and (runs / "r-gone").is_dir()

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("data")
    (runs / "r-link").mkdir()
    (runs / "r-link" / "tmp").symlink_to(precious)
    fleetrun_node.stop_run("r-link", 0.0)
    assert (precious / "keep").read_text() == "data"
    (runs / "odd" / "tmp").mkdir(parents=True)
    fleetrun_node.stop_run("../runs/odd", 0.0)
    assert (runs / "odd" / "tmp").is_dir()


def _late_exit_run(home: Path, run_id: str, after_stop: str) -> Path:
    """A run whose ``launch.sh`` goes on after its job is stopped (``after_stop``, a process
    without the run's marker, so ``stop`` cannot find it): its wrapper writes ``rc`` only then."""
    run_dir = home / ".fleetrun" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "launch.sh").write_text(
        f"export FLEETRUN_RUN_ID={run_id}\nsleep 300\nenv -u FLEETRUN_RUN_ID {after_stop}\nexit 137\n"
    )
    return run_dir


def _pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("after_stop", ["sleep 1.5", "sleep 60"])
def test_no_exit_code_of_a_stopped_attempt_lands_in_the_next_one(tmp_path: Path, after_stop: str) -> None:
    """Recovery stops the survivors' ranks, then moves the attempt's files to ``attempt-<n>/``
    (``launch.run.attempts.stop_survivors``), then starts the next attempt in the same directory.
    An exit code written after the move would read as the next attempt's ("exited 137"). Once
    ``stop`` returns, the attempt's wrapper has written its exit code (moved with the attempt) or
    was killed before it could (a launch.sh that goes on too long): nothing comes later."""
    from launch.nodelib.fleetrun_node import _run_pids

    home = tmp_path / "home"
    run_id = f"r-late-{os.getpid()}-{len(after_stop)}"  # its processes are told apart by it
    run_dir = _late_exit_run(home, run_id, after_stop)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}

    def node(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, AGENT, *args], capture_output=True, text=True, timeout=90, env=env, check=False
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    wrapper = node("start", str(run_dir))["pid"]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _run_pids(run_id):
            time.sleep(0.05)
        node("stop", run_id, "0.5")
        keep = run_dir / "attempt-1"  # as stop_survivors moves them
        keep.mkdir()
        for name in ("rc", "pid", "node.log", "launch.sh"):
            if (run_dir / name).exists():
                (run_dir / name).rename(keep / name)
        assert _pid_gone(wrapper, 1.0), "stop returns only once the attempt's wrapper ended"
        time.sleep(2.0)  # when the unfixed wrapper would have written its late exit code
        assert not (run_dir / "rc").exists(), "no exit code of attempt 1 in attempt 2's place"
        assert node("poll", str(run_dir), "0", "--no-heartbeat")["state"] == "absent"
        if after_stop == "sleep 1.5":
            assert (keep / "rc").read_text().strip() == "137", "the exit code went with its attempt"
        else:
            assert not (keep / "rc").exists(), "killed at the stop's bound: no exit code, never a late one"
    finally:
        with contextlib.suppress(OSError):
            os.killpg(wrapper, signal.SIGKILL)  # whatever a failed check left of the run


def test_a_start_never_reads_an_earlier_starts_exit_code(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "r-stale", "sleep 300")
    (run_dir / "rc").write_text("137\n")  # an earlier attempt's, not moved away
    pid = agent("start", str(run_dir))["pid"]
    try:
        assert agent("poll", str(run_dir), "0", "--no-heartbeat")["state"] == "running"
    finally:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


# -- the event channel: a rank's exit pushed the moment it happens ----------------------------------


def read_line_within(proc: subprocess.Popen, seconds: float) -> str:
    """One answer line, or '' when none came within ``seconds`` (a deadline, not a measurement)."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline() if ready else ""


def test_events_answers_a_held_wait_the_moment_the_job_exits(tmp_path: Path) -> None:
    """The watcher's event channel: a wait held for a minute is answered as soon as the job's
    wrapper wrote ``rc`` (not when the wait runs out); a short wait on a running job answers
    ``running``; a bad request is an error answer; end of input ends the agent."""
    run_dir = make_run(tmp_path, "r-push", "while [ ! -e go ]; do sleep 0.05; done; exit 5")
    assert agent("start", str(run_dir))["pid"] > 0
    wait_state(run_dir, "running")
    proc = subprocess.Popen(
        [sys.executable, AGENT, "events", str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write('{"op": "wait", "wait_s": 0.2, "seen": "running"}\n')
        proc.stdin.flush()
        assert json.loads(read_line_within(proc, 30)) == {"state": "running", "rc": None, "error": ""}
        proc.stdin.write("nonsense\n")  # one line at a time: select() cannot see a buffered second line
        proc.stdin.flush()
        assert "unknown request" in json.loads(read_line_within(proc, 30))["error"]
        # an over-long line is dropped whole, as on the poll channel: its tail is no request
        proc.stdin.write("x" * 100_000 + '{"op": "wait", "wait_s": 0.2, "seen": "running"}\n')
        proc.stdin.flush()
        assert "longer than" in json.loads(read_line_within(proc, 30))["error"]
        proc.stdin.write('{"op": "wait", "wait_s": 60, "seen": "running"}\n')
        proc.stdin.flush()
        assert read_line_within(proc, 0.5) == "", "held while the job runs"
        (run_dir / "go").write_text("")
        line = read_line_within(proc, 30)  # far below the 60 s hold: answered by the exit itself
        assert line, "the exit was not pushed before the wait ran out"
        assert json.loads(line) == {"state": "exited", "rc": 5, "error": ""}
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_poll_counts_the_jobs_processes_stopped_by_a_signal(tmp_path: Path) -> None:
    """A rank stopped by SIGSTOP looks alive; the poll answer counts it (``stopped``), so the
    watcher can blame its node when a peer's collective with it then fails."""
    run_dir = make_run(tmp_path, "r-stop", "sleep 60 & echo $! > child; wait")
    assert agent("start", str(run_dir))["pid"] > 0
    wait_state(run_dir, "running")
    deadline = time.monotonic() + 20
    while not (run_dir / "child").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int((run_dir / "child").read_text())
    try:
        assert agent("poll", str(run_dir), "0", "--no-heartbeat")["stopped"] == 0
        os.kill(child, signal.SIGSTOP)
        deadline = time.monotonic() + 20
        answer: dict = {}
        while time.monotonic() < deadline:
            answer = agent("poll", str(run_dir), "0", "--no-heartbeat")
            if answer["stopped"]:
                break
            time.sleep(0.05)
        assert answer["state"] == "running" and answer["stopped"] == 1, answer
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    wait_state(run_dir, "exited")


def test_which_ranks_still_step_is_read_from_their_pace_records_as_untrusted_files(tmp_path: Path) -> None:
    """``fleetrun_stepping``: a fresh record is a stepping rank, one older than twice its own write
    interval plus a margin a blocked one; a record from before this launch, garbage, a FIFO (which
    must not block the stop) and an odd name are no evidence; a slow rank's long interval keeps it
    stepping."""
    from launch.nodelib import fleetrun_stepping as stepping

    now = 1_800_000_000.0
    pace = tmp_path / "pace"
    pace.mkdir()

    def record(rank: str, at: float, every: object = 2.0) -> None:
        (pace / f"{rank}.json").write_text(json.dumps({"rank": 0, "time": at, "every_s": every}))

    record("0", now - 1.0)  # fresh
    record("1", now - 30.0)  # blocked since long
    record("2", now - 500.0)  # before this launch
    record("3", now - 30.0, every=60.0)  # a slow rank: one step a minute
    record("4", now - 30.0, every="soon")  # an odd interval: the default one
    (pace / "5.json").write_text("{not json")
    os.mkfifo(pace / "6.json")
    record("odd", now - 30.0)
    (pace / "7.json").write_text(json.dumps({"time": now - 30.0, "pad": "x" * 2000}))  # too big
    ranks = stepping.read_ranks(str(tmp_path), now, launched=now - 100.0)
    assert ranks.stepping == [0, 3] and ranks.blocked == [1, 4]
    assert not ranks.none_stepping
    (pace / "0.json").unlink()
    (pace / "3.json").unlink()
    assert stepping.read_ranks(str(tmp_path), now, launched=now - 100.0).none_stepping
    assert not stepping.read_ranks(str(tmp_path / "none"), now).none_stepping, "no records: no evidence"
