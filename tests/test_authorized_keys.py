"""fleetrun's lines in ``authorized_keys``: own line, exact removal, the operator's bytes kept, and
the relay key's forced command that lets only rsync's receiver in. Runs the real node-side editor
and gate locally (``python3``, ``sh``), with a temporary ``HOME``."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from launch.planning.cluster_ssh import AUTHORIZED_NOTE, ClusterKey, authorize_script, revoke_command
from launch.transport import authorized_keys as ak
from launch.transport.sync_relay import RelayKey, relay_dests, rsync_gate
from tests.conftest import sample_inventory

OPERATOR = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorsOwnKeyMaterialXXXXXXXXXXXXXXXXXXX me@laptop"
OURS = 'restrict,from="10.0.0.1" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRelayKeyXXXXXXXXXX fleetrun-relay-0123456789ab'


def sh(home: Path, command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command],
        env={**os.environ, "HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )


def keys_file(home: Path, content: bytes | None, mode: int = 0o600) -> Path:
    (home / ".ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / ".ssh" / "authorized_keys"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "original",
    [OPERATOR.encode(), (OPERATOR + "\n").encode(), b"", (OPERATOR + "\r\n# note").encode()],
    ids=["no-trailing-newline", "trailing-newline", "empty", "crlf-and-comment"],
)
def test_add_then_remove_gives_back_the_same_bytes(tmp_path: Path, original: bytes) -> None:
    path = keys_file(tmp_path, original)
    added = sh(tmp_path, ak.add_command(OURS))
    assert added.returncode == 0 and "FLEETRUN_KEY=installed" in added.stdout, added.stderr
    lines = path.read_bytes().split(b"\n")
    assert OURS.encode() in lines, "fleetrun's line stands on a line of its own"
    if original:
        assert lines[0] == original.split(b"\n")[0], "the operator's line is not glued to ours"
    assert sh(tmp_path, ak.add_command(OURS)).stdout == "", "adding twice changes nothing"
    assert path.read_bytes().count(OURS.encode()) == 1
    assert sh(tmp_path, ak.remove_command(OURS)).returncode == 0
    assert path.read_bytes() == original, "byte for byte what the operator had"


def test_removal_is_by_exact_whole_line_only(tmp_path: Path) -> None:
    tag = OURS.rsplit(" ", 1)[1]
    lookalikes = [
        f"{OPERATOR} {tag}",  # the operator's key whose comment mentions the tag
        OURS.replace('from="10.0.0.1"', 'from="10.0.0.2"'),  # same key, other options
        " " + OURS,  # not the same line
    ]
    original = ("\n".join(lookalikes) + "\n").encode()
    path = keys_file(tmp_path, original, mode=0o640)
    sh(tmp_path, ak.add_command(OURS))
    sh(tmp_path, ak.remove_command(OURS))
    assert path.read_bytes() == original
    assert stat.S_IMODE(path.stat().st_mode) == 0o640, "the file keeps its mode"


def test_a_symlinked_file_is_edited_where_it_lives(tmp_path: Path) -> None:
    real = tmp_path / "managed" / "keys"
    real.parent.mkdir()
    real.write_text(OPERATOR)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "authorized_keys").symlink_to(real)
    sh(tmp_path, ak.add_command(OURS))
    assert (tmp_path / ".ssh" / "authorized_keys").is_symlink()
    assert real.read_text() == f"{OPERATOR}\n{OURS}"
    sh(tmp_path, ak.remove_command(OURS))
    assert real.read_text() == OPERATOR


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_a_file_the_user_cannot_write_is_reported_not_replaced(tmp_path: Path) -> None:
    path = keys_file(tmp_path, OPERATOR.encode(), mode=0o400)
    result = sh(tmp_path, ak.add_command(OURS))
    assert result.returncode != 0 and "cannot write" in result.stderr
    assert path.read_bytes() == OPERATOR.encode()


def test_a_missing_file_is_created_private(tmp_path: Path) -> None:
    path = keys_file(tmp_path, None)
    sh(tmp_path, ak.add_command(OURS))
    assert path.read_text() == OURS + "\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_lines_must_be_single_lines() -> None:
    with pytest.raises(ValueError):
        ak.add_command(OPERATOR + "\n" + OURS)


def test_expiry_is_never_early_in_any_zone() -> None:
    now = time.mktime((2026, 3, 1, 12, 0, 0, 0, 0, 0)) - time.timezone
    stamp = ak.expiry_time(3600, now=now)
    assert len(stamp) == 12 and stamp.isdigit()
    assert stamp == time.strftime("%Y%m%d%H%M", time.gmtime(now + 3600 + 14 * 3600))


def test_cluster_key_is_noted_replaced_next_run_and_revoked_at_the_end(tmp_path: Path) -> None:
    inventory = sample_inventory(3)
    head = inventory.head
    path = keys_file(tmp_path, OPERATOR.encode())
    first = ClusterKey(
        "", "ssh-ed25519 AAAAfirst fleetrun-cluster:fp:01", "fleetrun-cluster:fp:01", "202701010000"
    )
    second = ClusterKey(
        "", "ssh-ed25519 AAAAsecond fleetrun-cluster:fp:02", "fleetrun-cluster:fp:02", "202701020000"
    )
    installed = sh(tmp_path, authorize_script(first, head))
    assert installed.returncode == 0 and "FLEETRUN_KEY=installed" in installed.stdout, installed.stderr
    assert sh(tmp_path, authorize_script(first, head)).stdout == "", "idempotent"
    text = path.read_text()
    assert 'expiry-time="202701010000"' in text and text.startswith(OPERATOR + "\n")
    # A run that never revoked (crash): the next run's authorize replaces its line; nothing piles up.
    sh(tmp_path, authorize_script(second, head))
    assert "AAAAfirst" not in path.read_text() and path.read_text().count("fleetrun-cluster:") == 1
    (tmp_path / ".fleetrun" / "cluster").mkdir(parents=True)
    (tmp_path / ".fleetrun" / "cluster" / "id_ed25519").write_text("secret")
    assert sh(tmp_path, revoke_command()).returncode == 0
    assert path.read_bytes() == OPERATOR.encode(), "the operator's file, byte for byte"
    assert not (tmp_path / ".fleetrun" / "cluster").exists(), "the head's key files are gone"
    assert not (tmp_path / AUTHORIZED_NOTE).exists()
    assert sh(tmp_path, revoke_command()).returncode == 0, "revoking twice (or with no key) is fine"


def test_a_tampered_note_cannot_remove_the_operators_key(tmp_path: Path) -> None:
    path = keys_file(tmp_path, (OPERATOR + "\n").encode())
    note = tmp_path / AUTHORIZED_NOTE
    note.parent.mkdir(parents=True)
    note.write_text(OPERATOR + "\n")
    sh(tmp_path, revoke_command())
    assert path.read_text() == OPERATOR + "\n"


# -- the relay key's forced command ---------------------------------------------------------------
(WORK,) = relay_dests("job-1")
LIB = ".fleetrun/lib/"  # the node library: never the relay key's to write (issue 24, item 8)
FLAGS = "-logDtpre.iLsfxCIvu"  # what rsync 3.5 sends for -a (see rsync_gate)


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        (f"rsync --server {FLAGS} --delete --stats --mkpath . {WORK}", True),
        (f"rsync --server {FLAGS} --delete --stats --mkpath . {LIB}", False),
        ("rsync --server -logDtpre.iLsfx . " + WORK, True),
        ("id", False),
        ("", False),
        (f"rsync --server --sender {FLAGS} . {WORK}", False),
        (f"rsync --server {FLAGS} --log-file=/tmp/x . {WORK}", False),
        (f"rsync --server {FLAGS} --backup-dir=/tmp . {WORK}", False),
        (f"rsync --server {FLAGS} . .ssh/", False),
        (f"rsync --server {FLAGS} . {WORK}x", False),
        (f"rsync --server {FLAGS} . .fleetrun/work/*/", False),
        (f"rsync --server -logDtpreT.iLsfx . {WORK}", False),
        (f"rsync --server {FLAGS} . {WORK} ; id", False),
        (f"rsync --server {FLAGS} . {WORK}\nid", False),
        (f"sh -c id --server {FLAGS} . {WORK}", False),
    ],
)
def test_relay_gate_lets_only_the_rsync_receiver_in(tmp_path: Path, command: str, allowed: bool) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rsync").write_text('#!/bin/sh\necho "RECEIVER $*"\n')
    (fake / "rsync").chmod(0o755)
    gate = rsync_gate(relay_dests("job-1"))
    result = sh(tmp_path, gate, env={"SSH_ORIGINAL_COMMAND": command, "PATH": f"{fake}:/usr/bin:/bin"})
    if allowed:
        assert result.returncode == 0 and result.stdout.startswith("RECEIVER --server"), result.stderr
    else:
        assert result.returncode == 1 and "only the rsync receiver" in result.stderr
        assert "RECEIVER" not in result.stdout


def test_relay_line_quotes_the_gate_for_sshd() -> None:
    line = RelayKey.generate().authorized_line("10.0.0.1", relay_dests("job-1"), "202701010000")
    assert line.startswith('restrict,from="10.0.0.1",expiry-time="202701010000",command="sh -c \'set -f;')
    options = line.split('" ssh-ed25519 ')[0]
    assert '"' not in options.split('command="', 1)[1].replace('\\"', ""), "inner quotes are escaped"
    with pytest.raises(ValueError):
        rsync_gate(["../x/"])
