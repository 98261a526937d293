"""A bucket upload's key never goes on a command line (the local fleet's S3 secret used to be an
``env AWS_SECRET_ACCESS_KEY=...`` argument, in every node user's ``ps`` while the upload ran): the
laptop's upload sends it on stdin, the watchdog's reads it from ``guard.json`` (the run
directory's, 0700) and hands it to the upload as environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.kinds.local import LocalFleetKind
from launch.fleets.kinds.refs import LocalFleetRef
from launch.nodelib import fleetrun_node
from launch.nodelib.fleetrun_protocol import GuardConfig, ProtocolError
from launch.run import wrapup
from launch.run.reporter import RecordingReporter
from launch.transport.port import CommandResult

SECRET = "s3cr3t-of-the-fleet"
PRINT_KEY = ["sh", "-c", 'printf %s "$AWS_SECRET_ACCESS_KEY" > "$0/got"', "{src}"]


def test_the_local_fleets_upload_command_carries_no_key_and_its_guard_config_does(tmp_path: Path) -> None:
    ref = LocalFleetRef(prefix="ab", bucket="ckpt", s3_endpoint="http://198.18.46.1:9000")
    argv = LocalFleetKind(ref).bucket_upload_argv("runs/r1/n0")
    assert argv is not None and argv[0].endswith("/aws") and argv[-1] == "s3://ckpt/runs/r1/n0"
    assert not any("AWS_SECRET_ACCESS_KEY" in a or "=" in a for a in argv), argv
    config = GuardConfig(
        run_id="r1", node="n0", started_at=1.0, upload_argv=tuple(argv),
        upload_env={"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": "http://198.18.46.1:9000"},
    )  # fmt: skip
    again = GuardConfig.from_json(config.to_json())
    assert again.upload_env["AWS_SECRET_ACCESS_KEY"] == SECRET and again.upload_argv == tuple(argv)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"aws_secret": "x"}, "upper-case variable names"),
        ({"KEY": "a\nB=c"}, "values without a newline"),
        ({"KEY": 7}, "command-line argument"),
        ([["KEY", "x"]], "an object of at most"),
    ],
)
def test_a_guard_config_upload_env_is_checked(env: Any, why: str) -> None:
    data = json.loads(GuardConfig(run_id="r1", node="n0", started_at=1.0).to_json())
    data["upload_env"] = env
    with pytest.raises(ProtocolError, match=why):
        GuardConfig.from_json(json.dumps(data))


def test_the_watchdogs_upload_gets_its_env_as_environment(tmp_path: Path) -> None:
    answer = fleetrun_node.upload(str(tmp_path), PRINT_KEY, {"AWS_SECRET_ACCESS_KEY": SECRET})
    assert answer.ok, answer.upload
    assert (tmp_path / "got").read_text() == SECRET


class _Target:
    run_id = "r-upload"

    def upload_argv(self, node: str) -> list[str]:
        return PRINT_KEY

    def upload_env(self) -> dict[str, str]:
        return {"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}


class _Conn:
    """Runs what the laptop would send the node, in a shell here, with ``home`` as ``$HOME``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.host = type("H", (), {"name": "n0"})()
        self.sent: list[tuple[str, bytes]] = []

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        return self.run_with_input(command, b"", timeout or 60)

    def run_with_input(self, command: str, data: bytes, timeout: float) -> CommandResult:
        self.sent.append((command, data))
        done = subprocess.run(
            ["sh", "-c", command], input=data, capture_output=True, timeout=timeout,
            env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"}, check=False,
        )  # fmt: skip
        return CommandResult("n0", done.returncode, done.stdout.decode(), done.stderr.decode())


class _Fleet:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.hosts = [conn.host]

    def map(self, fn: Any, deadline: float) -> dict[str, Any]:
        return {"n0": fn(self.conn)}


def test_the_laptops_upload_sends_the_key_on_stdin_and_the_node_shell_exports_it(tmp_path: Path) -> None:
    run_dir = tmp_path / ".fleetrun" / "runs" / "r-upload"
    run_dir.mkdir(parents=True)
    conn = _Conn(tmp_path)
    said = wrapup.upload_to_bucket(_Fleet(conn), _Target(), RecordingReporter())  # type: ignore[arg-type]
    assert said == {"n0": "uploaded to {src}"}, said
    ((command, data),) = conn.sent
    assert SECRET not in command, command
    assert f"AWS_SECRET_ACCESS_KEY={SECRET}\n".encode() in data
    assert (run_dir / "got").read_text() == SECRET, "the node's shell exported it for the upload"
