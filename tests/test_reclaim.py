"""A test session killed before its teardown leaves its fleets; the next session takes them down.

The CI run of 2026-11-25 failed with 31 errors ("will not build over things it did not create"):
an earlier `make test` on that machine had been killed with its session fleets up, and their record
lay in that session's temporary folder, out of the next session's reach.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from tests.conftest import fleet_prefix, fleet_subnet, fresh_home, hold, needs_root, reclaim

PREFIX = fleet_prefix("r")


@needs_root()
def test_a_killed_sessions_fleet_is_taken_down_by_the_next_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("FLEETRUN_HOME", str(home))
    fleet = LocalFleet(prefix=PREFIX, subnet=fleet_subnet(10))
    fleet.up(1, say=lambda _m: None)
    try:
        # the session "dies" here: no down; the next one finds the record and the fleet
        assert fleet.conflicts(1), "the fleet should exist before the next session reclaims it"
        monkeypatch.delenv("FLEETRUN_HOME")
        assert fresh_home(home) == home
        assert list(home.iterdir()) == [], "the folder is handed over empty"
        assert not fleet.conflicts(1), f"left behind: {fleet.conflicts(1)}"
        with pytest.raises(KeyError):
            pwd.getpwnam(fleet.node_name(0))
        assert os.environ.get("FLEETRUN_HOME") is None, "reclaim restores the environment"
    finally:
        monkeypatch.setenv("FLEETRUN_HOME", str(home))
        fleet.down(say=lambda _m: None)


def test_reclaim_touches_nothing_without_a_record(tmp_path: Path) -> None:
    (tmp_path / "localfleet" / "frzz").mkdir(parents=True)  # a folder but no created.jsonl
    assert reclaim(tmp_path) == {}
    assert reclaim(tmp_path / "absent") == {}


def test_a_second_session_on_the_same_prefix_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    """Two sessions with one tag at once: the second must not take the first's live fleets down
    as leftovers; it fails at once, naming the prefix. A killed first session (its lock gone with
    its process) does not block the next."""
    import subprocess
    import sys
    import textwrap

    home = tmp_path / "slots" / "frq9"
    hold(home)  # this process: the first session
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from pathlib import Path
        from tests.conftest import hold
        try:
            hold(Path({str(home)!r}))
        except RuntimeError as exc:
            print("refused:", exc)
        else:
            print("held")
        """
    )
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert second.stdout.startswith("refused:") and "frq9" in second.stdout, second.stdout + second.stderr
    other = tmp_path / "slots" / "frq8"  # another prefix is free
    third = subprocess.run(
        [sys.executable, "-c", code.replace(str(home), str(other))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert third.stdout.strip() == "held", third.stdout + third.stderr
    hold(other)  # the third session's process ended: its lock went with it
