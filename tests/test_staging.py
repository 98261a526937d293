"""Where ``fab`` stages what it sends (issue 32 item 25): under ``FLEETRUN_HOME``, once per
content for the node library, so a ``fab`` ended by a signal leaves nothing in ``$TMPDIR``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.nodelib.fleetrun_probe import library_digest
from launch.transport import staging
from launch.transport.sync import NODELIB, nodelib_source
from tests.conftest import REPO, TEST_PREFIX, needs_root, write_playbook

STAGING_PREFIXES = ("fleetrun-nodelib-", "fleetrun-sync-", "fleetrun-channels-")


def _library_files() -> list[Path]:
    return sorted(p for p in NODELIB.glob("*.py") if p.name != "__init__.py")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "home"


def test_the_library_is_staged_once_per_content_and_reused(home: Path, tmp_path: Path) -> None:
    path, digest = staging.stage_library(_library_files())
    assert path == home / "nodelib" / digest and library_digest(str(path)) == digest
    assert (path / "VERSION").read_text() == digest + "\n"
    mark = (path / "VERSION").stat().st_ino
    again, same = staging.stage_library(_library_files())
    assert (again, same) == (path, digest) and (path / "VERSION").stat().st_ino == mark, "reused, not rebuilt"
    assert nodelib_source() == (path, digest)
    assert list((home / "staging").iterdir()) == [], "the build folder is gone"
    assert list((tmp_path / "tmp").iterdir()) == [], "nothing in the temporary folder"


def test_a_changed_staged_copy_is_replaced(home: Path) -> None:
    path, digest = staging.stage_library(_library_files())
    guard = path / "fleetrun_guard.py"
    guard.write_text(guard.read_text() + "\n# changed\n")
    again, same = staging.stage_library(_library_files())
    assert (again, same) == (path, digest) and library_digest(str(path)) == digest


STAGE_IN_A_CHILD = """
import sys
from pathlib import Path
from launch.transport.staging import stage_library
files = sorted(p for p in Path(sys.argv[1]).glob("*.py") if p.name != "__init__.py")
print(stage_library(files)[1])
"""


def test_concurrent_fab_processes_stage_one_complete_copy(home: Path) -> None:
    """Two processes at once (as two ``fab`` runs): each builds in its own folder and renames
    into place; both end with the same complete copy and no error."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", STAGE_IN_A_CHILD, str(NODELIB)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [c.communicate(timeout=120)[0].strip() for c in children]
    assert [c.returncode for c in children] == [0] * 4
    assert len(set(outputs)) == 1
    (digest,) = set(outputs)
    assert [p.name for p in (home / "nodelib").iterdir()] == [digest]
    assert library_digest(str(home / "nodelib" / digest)) == digest
    assert list((home / "staging").iterdir()) == []


def test_what_a_killed_process_left_is_removed_by_the_next(home: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = home / "staging" / f"sync-{dead.pid}-abc123"
    (left / "work").mkdir(parents=True)
    mine = staging.scratch_dir("sync-")
    assert not left.exists() and mine.is_dir() and str(os.getpid()) in mine.name
    shutil.rmtree(mine)


@needs_root()
def test_a_fab_killed_by_a_signal_leaves_no_staging_folder_in_tmpdir(
    fleet: LocalFleet, fleetrun_home: Path, tmp_path: Path, digits_workdir: Path
) -> None:
    """A real ``fab train`` on the session's fleet, ended by SIGTERM once its sync delivered the
    code (so the library was staged): nothing of it is left in its ``$TMPDIR``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = "t-staging"
    playbook = write_playbook(tmp_path / "job.yaml", digits_workdir, name=job, nodes=2)
    user = fleet.inventory().hosts[0].user
    workdir_on_node = Path("/home") / user / ".fleetrun" / "work" / job
    shutil.rmtree(workdir_on_node, ignore_errors=True)
    env = {
        **os.environ,
        "FLEETRUN_HOME": str(fleetrun_home),
        "FLEETRUN_RUNS": str(tmp_path / "runs"),
        "TMPDIR": str(tmp),
    }
    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{TEST_PREFIX}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300  # a bound on a hang, not a speed goal
        while (
            not (workdir_on_node / "trainer").is_dir() and proc.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert proc.poll() is None, "fab ended before its sync was seen"
        assert (workdir_on_node / "trainer").is_dir(), "the sync never delivered the code"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGTERM
        left = sorted(p.name for p in tmp.iterdir() if p.name.startswith(STAGING_PREFIXES))
        assert left == [], f"staging folders left in TMPDIR: {left}"
        assert list((fleetrun_home / "nodelib").glob("*/VERSION")), "the library is staged in FLEETRUN_HOME"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        for host in fleet.inventory().hosts:
            shutil.rmtree(Path("/home") / host.user / ".fleetrun" / "work" / job, ignore_errors=True)
