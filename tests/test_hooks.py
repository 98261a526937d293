"""The playbook's hooks: ``on_end`` on the laptop, ``before_stop`` in the node's watchdog.

A hook that exits 1 and one that hangs: the outcome, the stop, the upload, the power-off and the
teardown are what they would have been without them, and the hook's failure is recorded. The
watchdog runs as a plain local process (as in test_node_agent.py); ``on_end`` runs on its own and
once at the end of a real run on the session's local fleet.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from launch.cli import app
from launch.errors import SpecError
from launch.job.spec import load_job_spec
from launch.run import lifecycle
from launch.run.hooks import LocalHooks, before_stop_files, local_hooks_verdict, run_on_end, save_on_end
from tests.conftest import STEPS_JOB, TEST_PREFIX, fab, needs_root, sample_inventory, write_playbook

ALLOWED = LocalHooks(True, "allowed (test)", "job.yaml")

NODELIB = Path(__file__).resolve().parent.parent / "launch" / "nodelib"
AGENT = str(NODELIB / "fleetrun_node.py")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    return stat[0] != "Z"


def _spec(tmp_path: Path, **fields: object):  # type: ignore[no-untyped-def]
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return load_job_spec(write_playbook(tmp_path / "job.yaml", workdir, **fields))


# ------------------------------------------------------------------ the playbook's fields


def test_hook_fields_one_command_or_a_list_and_bounds(tmp_path: Path) -> None:
    spec = _spec(tmp_path, on_end="curl -fsS -d @- https://hooks.example/x", before_stop=["sync", "true"])
    assert spec.on_end == ["curl -fsS -d @- https://hooks.example/x"] and spec.before_stop == ["sync", "true"]
    assert spec.hook_timeout_s == 60.0
    files = before_stop_files(spec.model_copy(update={"hook_timeout_s": 2.5}))
    assert files == {"before-stop.sh": "sync\ntrue\n", "before-stop-timeout": "2.5"}
    assert before_stop_files(_spec(tmp_path)) == {}
    for bad, field in (({"on_end": [""]}, "on_end"), ({"hook_timeout_s": 0}, "hook_timeout_s")):
        with pytest.raises(SpecError, match=f"field '{field}"):
            _spec(tmp_path, **bad)
    with pytest.raises(SpecError, match="field 'hook_timeout_s'"):
        _spec(tmp_path, hook_timeout_s=7200)


# ------------------------------------------------------------------ before_stop in the watchdog


@pytest.mark.parametrize("hook", ["exit1", "hangs"])
def test_a_failing_or_hanging_before_stop_changes_nothing_of_the_shutdown(tmp_path: Path, hook: str) -> None:
    """The watchdog takes over (stalled run), runs the hook, then stops, uploads, records the
    same outcome and powers off; the hung hook is killed at its timeout with what it started."""
    home = tmp_path / "home"
    (home / ".fleetrun").mkdir(parents=True)
    (home / ".fleetrun" / "poweroff").write_text('touch "$HOME/powered-off"\n')
    bucket = tmp_path / "bucket"
    run_dir = tmp_path / "r-hook"
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text(
        'export FLEETRUN_RUN_ID=r-hook\necho \'{"step": 1, "loss": 1.0}\' > metrics.jsonl; sleep 300\n'
    )
    body = (
        "echo ran; exit 1" if hook == "exit1" else "echo $$ > hook.pid; sleep 300 & echo $! > child.pid; wait"
    )
    (run_dir / "before-stop.sh").write_text(body + "\n")
    (run_dir / "before-stop-timeout").write_text("1.5")
    (run_dir / "guard.json").write_text(
        json.dumps(
            {
                "run_id": "r-hook",
                "node": "n0",
                "started_at": time.time(),
                "watcher_lost_after_s": 1,
                "stall_timeout_s": 2,
                "peers": [],
                "upload_argv": ["cp", "-r", "{src}", str(bucket)],
            }
        )
    )
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    started = subprocess.run(
        [sys.executable, AGENT, "start", str(run_dir)], env=env, check=True, capture_output=True
    )
    assert json.loads(started.stdout)["guard"] is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (home / "powered-off").exists():
        time.sleep(0.2)
    assert (home / "powered-off").exists(), "the power-off hook still ran"
    outcome = json.loads((run_dir / "guard-outcome.json").read_text())
    assert outcome["rule"] == "stalled", "the hook does not change the outcome"
    assert outcome["stopped"]["remaining"] == 0 and outcome["upload"] == f"uploaded to {bucket}"
    result = json.loads((run_dir / "before-stop-result.json").read_text())
    assert result["ok"] is False
    if hook == "exit1":
        assert result["rc"] == 1 and result["timed_out"] is False
        assert (run_dir / "before-stop.log").read_text() == "ran\n"
    else:
        assert result["rc"] is None and result["timed_out"] is True and result["timeout_s"] == 1.5
        for name in ("hook.pid", "child.pid"):
            assert not _pid_alive(int((run_dir / name).read_text())), f"{name}: killed with its group"
    assert json.loads((bucket / "before-stop-result.json").read_text())["ok"] is False, (
        "the result is uploaded with the run directory"
    )
    log = (run_dir / "guard.log").read_text()
    assert ("before_stop hook: exit 1" if hook == "exit1" else "killed at its timeout") in log


# ------------------------------------------------------------------ on_end on the laptop


def test_on_end_gets_the_summary_and_outcome_and_failures_are_recorded(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    summary = {"run_id": "r1", "outcome": "failed", "rule": "nan_loss", "reason": "loss is NaN\x1b[2J"}
    (folder / "summary.json").write_text(json.dumps(summary))
    spec = _spec(
        tmp_path,
        on_end=[
            'cat > got.json; echo "$FLEETRUN_OUTCOME $FLEETRUN_RULE $FLEETRUN_RUN_ID" > env.txt',
            "exit 1",
            "sleep 300 & echo $! > child.pid; wait",
            "echo after > after.txt",
        ],
        hook_timeout_s=1.5,
    )
    save_on_end(folder, spec, ALLOWED)
    said: list[str] = []
    results = run_on_end(folder, say=said.append)
    assert json.loads((folder / "got.json").read_text()) == summary, "summary.json on stdin"
    assert (folder / "env.txt").read_text() == "failed nan_loss r1\n"
    assert [r["ok"] for r in results] == [True, False, False, True], (
        "each hook runs, whatever the one before did"
    )
    assert results[1]["rc"] == 1 and results[2]["timed_out"] is True
    assert not _pid_alive(int((folder / "child.pid").read_text()))
    assert json.loads((folder / "hooks.json").read_text()) == results
    assert len(said) == 2 and "exit 1" in said[0] and "killed after 1.5 s" in said[1]
    assert (folder / "after.txt").exists()


def test_no_hooks_no_files(tmp_path: Path) -> None:
    save_on_end(tmp_path, _spec(tmp_path), ALLOWED)
    assert run_on_end(tmp_path) == [] and not (tmp_path / "hooks.json").exists()


# ------------------------------------------------------------------ on_end runs only when allowed


def test_on_end_not_allowed_is_skipped_with_one_line_and_recorded(tmp_path: Path) -> None:
    """A colleague's playbook: its ``on_end`` never runs on this machine unless allowed."""
    folder = tmp_path / "run"
    folder.mkdir()
    spec = _spec(tmp_path, on_end=["touch pwned", "touch pwned2"])
    save_on_end(folder, spec, LocalHooks(False, "not allowed", "their\x1b[2Jjob.yaml"))
    said: list[str] = []
    results = run_on_end(folder, say=said.append)
    assert not (folder / "pwned").exists() and not (folder / "pwned2").exists()
    assert [r["skipped"] for r in results] == ["not allowed", "not allowed"]
    assert json.loads((folder / "hooks.json").read_text()) == results, "the record says so"
    assert len(said) == 1 and "2 command(s)" in said[0] and "--allow-local-hooks" in said[0]
    assert "\x1b" not in said[0], "the playbook's name is escaped"


def test_a_run_folder_without_a_verdict_runs_nothing(tmp_path: Path) -> None:
    """``on-end.json`` from before allowances existed (or edited to drop the verdict)."""
    (tmp_path / "on-end.json").write_text(json.dumps({"commands": ["touch pwned"], "timeout_s": 5}))
    assert run_on_end(tmp_path, say=lambda _: None)[0]["skipped"] == "not allowed"
    assert not (tmp_path / "pwned").exists()


def test_allowance_is_for_the_playbooks_exact_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    spec = _spec(tmp_path, on_end="curl -d @- https://hooks.example/x")
    playbook = tmp_path / "job.yaml"
    assert not local_hooks_verdict(playbook, spec, allow=False, record=True).allowed
    assert local_hooks_verdict(playbook, spec, allow=True, record=False).allowed, "a dry run with the flag"
    assert not local_hooks_verdict(playbook, spec, allow=False, record=True).allowed, (
        "a dry run records nothing"
    )
    assert local_hooks_verdict(playbook, spec, allow=True, record=True).allowed
    (note,) = (tmp_path / "home" / "allowed-hooks").iterdir()
    assert note.stat().st_mode & 0o077 == 0 and note.parent.stat().st_mode & 0o077 == 0
    assert local_hooks_verdict(playbook, spec, allow=False, record=True).allowed, "remembered"
    playbook.write_text(playbook.read_text() + "\n# edited\n")
    edited = load_job_spec(playbook)
    assert not local_hooks_verdict(playbook, edited, allow=False, record=True).allowed, "another file"
    assert local_hooks_verdict(playbook, _spec(tmp_path), allow=False, record=True).allowed, "no hooks"


def test_the_allowance_is_checked_for_the_bytes_parsed_not_a_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30, item 7: the allowed playbook swapped back in after a hostile one was parsed (a
    colleague's shared folder, a race) must not lend its allowance to the hostile commands."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    allowed = _spec(tmp_path, on_end="echo fine")
    playbook = tmp_path / "job.yaml"
    assert local_hooks_verdict(playbook, allowed, allow=True, record=True).allowed
    good = playbook.read_bytes()
    playbook.write_bytes(good.replace(b"echo fine", b"touch pwned"))
    hostile = load_job_spec(playbook)
    playbook.write_bytes(good)  # the file that was allowed is back by the time it is checked
    assert hostile.on_end == ["touch pwned"]
    assert not local_hooks_verdict(playbook, hostile, allow=False, record=True).allowed
    assert local_hooks_verdict(playbook, load_job_spec(playbook), allow=False, record=True).allowed
    assert allowed.source_sha256() == hashlib.sha256(good).hexdigest()


def _lab(tmp_path: Path) -> Path:
    """Two documentation-range lab hosts: nothing is connected to before the run starts."""
    import yaml

    hosts = tmp_path / "hosts.yaml"  # a lab inventory: its hosts only
    hosts.write_text(yaml.safe_dump({"hosts": sample_inventory(2).to_yaml_data()["hosts"]}))
    return hosts


def test_dry_run_prints_every_hook_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    _spec(
        tmp_path,
        nodes=2,
        on_end=["curl -d @- https://hooks.example/x", "echo one\necho two\x1b[2J\rhidden"],
        before_stop="cp -r outputs /shared",
    )
    console = Console(record=True, width=400)
    app.train(tmp_path / "job.yaml", inventory=str(_lab(tmp_path)), dry_run=True, console=console)
    text = console.export_text()
    assert "# hook on_end, on THIS machine after the run (sh -c): not allowed: skipped" in text
    assert "#   [0] curl -d @- https://hooks.example/x\n" in text
    assert "#   [1] echo one\n#       echo two?[2J?hidden\n" in text, "each line shown, controls as ?"
    assert (
        "# hook before_stop, on every node when its watchdog ends the run (sh -c):\n#   [0] cp -r outputs"
        in text
    )
    assert not (tmp_path / "home" / "allowed-hooks").exists()
    console = Console(record=True, width=400)
    app.train(
        tmp_path / "job.yaml",
        inventory=str(_lab(tmp_path)),
        dry_run=True,
        console=console,
        allow_local_hooks=True,
    )
    assert "(sh -c): allowed (--allow-local-hooks)" in console.export_text()


class _Started(Exception):
    pass


@pytest.mark.parametrize("allow", [False, True])
def test_train_saves_the_verdict_and_warns_at_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allow: bool
) -> None:
    """What ``fab train`` decides before the run starts: the verdict kept with the run (``fab
    watch`` runs the hooks by it), a warning now when they will be skipped, and the plan.txt text."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETRUN_RUNS", str(tmp_path / "runs"))
    _spec(tmp_path, nodes=2, on_end="touch pwned")
    plans = []

    def started(ctx: object, state: Any) -> None:  # the stages, after the folder and the record
        plans.append(state.plan)
        raise _Started

    held = SimpleNamespace(release=lambda: None)  # the queue turn: no machines behind a lab file
    monkeypatch.setattr(lifecycle, "take_machines", lambda *args: held)
    monkeypatch.setattr(lifecycle, "execute", started)
    console = Console(record=True, width=400)
    with pytest.raises(_Started):
        app.train(
            tmp_path / "job.yaml",
            inventory=str(_lab(tmp_path)),
            console=console,
            skip_doctor=True,
            ask_on_interrupt=False,
            allow_local_hooks=allow,
        )
    (run,) = (tmp_path / "runs").iterdir()
    saved = json.loads((run / "on-end.json").read_text())
    assert saved["allowed"] is allow and saved["commands"] == ["touch pwned"]
    warned = "warning: on_end: 1 command(s)" in console.export_text()
    assert warned is not allow
    assert ("(sh -c): allowed" in plans[0].render()) is allow, "plan.txt says whether they run"
    assert (tmp_path / "home" / "allowed-hooks").exists() is allow


@needs_root()
def test_a_run_whose_on_end_hooks_fail_and_hang_still_succeeds(
    fleet: object, fleetrun_home: Path, tmp_path: Path
) -> None:
    """On the session's fleet: the run's outcome, exit code and teardown line are the usual ones;
    ``hooks.json`` records the failing and the killed hook; ``before_stop`` reached the nodes.
    The job is the torch-free trainer: hooks are the subject, not training."""
    playbook = write_playbook(
        tmp_path / "job.yaml",
        STEPS_JOB,
        name="t-hooks",
        nodes=2,
        entrypoint="python steps.py --steps 20",
        on_end=["exit 1", "sleep 600", 'cat > "$FLEETRUN_RUN_DIR/seen.json"'],
        before_stop=["echo bye"],
        hook_timeout_s=3,
    )
    runs = tmp_path / "runs"
    proc = fab(
        "train",
        str(playbook),
        "--inventory",
        f"local:{TEST_PREFIX}",
        "--allow-local-hooks",
        home=fleetrun_home,
        runs=runs,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded (completed)" in proc.stdout
    assert (
        "on_end hook 0 failed (exit 1)" in proc.stdout
        and "on_end hook 1 failed (killed after 3 s)" in proc.stdout
    )
    (run,) = list(runs.iterdir())
    results = json.loads((run / "hooks.json").read_text())
    assert [(r["rc"], r["timed_out"]) for r in results] == [(1, False), (None, True), (0, False)]
    assert json.loads((run / "seen.json").read_text())["outcome"] == "succeeded"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["teardown"]["state"] == "skipped", "teardown: never"
    for node in (run / "nodes").iterdir():
        assert (node / "before-stop.sh").read_text() == "echo bye\n", "shipped for the watchdog"
