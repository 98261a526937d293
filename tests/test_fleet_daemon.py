"""A local fleet's helper process by its pid file (``launch.fleets.local.daemon``), shared by the
fleet's power daemon, its S3 server and its spot notice daemon: started detached and waited for, found again only
while the pid file's process still runs the same module, and a helper that dies at once is one
error line naming its log."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from launch.errors import LocalFleetError
from launch.fleets.local import daemon


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_a_helper_that_answers_is_found_by_its_pid_file(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    proc = daemon.start(tmp_path, argv, "h.pid", "h.log", lambda: _answers(port), 30.0, "the helper")
    try:
        assert (tmp_path / "h.pid").read_text() == str(proc.pid)
        assert os.getsid(proc.pid) == proc.pid, "a session of its own: a Ctrl-C in the terminal misses it"
        assert daemon.pids(tmp_path, "h.pid", "http.server") == [proc.pid]
        assert daemon.pids(tmp_path, "h.pid", "moto.server") == [], "another module: not ours"
        assert daemon.pids(tmp_path, "h.pid", "http.server", ("--bind", "127.0.0.1")) == [proc.pid]
        assert daemon.pids(tmp_path, "h.pid", "http.server", ("--bind", "10.0.0.1")) == [], (
            "other arguments (another fleet's prefix, for the power daemon): not ours"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert daemon.pids(tmp_path, "h.pid", "http.server") == [], "ended: its pid is not taken for it"
    (tmp_path / "h.pid").write_text("not a pid")
    assert daemon.pids(tmp_path, "h.pid", "http.server") == []
    assert daemon.pids(tmp_path / "nowhere", "h.pid", "http.server") == []


def test_a_helper_that_dies_at_once_is_one_error_naming_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "no_such_module_for_fleetrun"]
    with pytest.raises(LocalFleetError, match=r"^the helper did not start; see .*h\.log$"):
        daemon.start(tmp_path, argv, "h.pid", "h.log", lambda: False, 30.0, "the helper")
    assert "No module named" in (tmp_path / "h.log").read_text()
