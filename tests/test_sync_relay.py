"""Code sync through the head (big fleets), on the 3-node local fleet with the threshold at 1.

The relay must deliver the same tree the laptop would, revoke its ephemeral key everywhere,
honour the key's ``from=`` restriction (a head at another address is refused, and the sync still
succeeds by falling back to direct uploads), and skip the node library where it is current.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.job.inventory import Host, Inventory
from launch.paths import known_hosts_file
from launch.transport.authorized_keys import add_command, expiry_time, remove_command
from launch.transport.ssh import Fleet
from launch.transport.sync import SyncResult, nodelib_source
from launch.transport.sync_relay import RelayKey, relay_config, relay_dests, sync_fleet
from tests.conftest import needs_root

pytestmark = needs_root()


def _home(host: Host) -> Path:
    return Path("/home") / host.user


def _make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    for i in range(20):
        (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (root / ".gitignore").write_text("ignored.bin\n")
    (root / "ignored.bin").write_bytes(b"x" * 100)
    return root


def _known_hosts(inventory: Inventory) -> Path:
    return inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))


def test_relay_delivers_the_tree_to_workers_and_revokes_its_key(fleet: LocalFleet, tmp_path: Path) -> None:
    inventory = fleet.inventory()
    workdir = _make_tree(tmp_path / "code")
    kh = _known_hosts(inventory)
    keys_before = {h.name: (_home(h) / ".ssh" / "authorized_keys").read_text() for h in inventory.hosts}
    with Fleet(inventory.hosts, kh) as conns:
        results = sync_fleet(conns, workdir, "t-relay", kh, relay_above=1)
    assert all(isinstance(r, SyncResult) for r in results.values()), results
    head, workers = inventory.hosts[0], inventory.hosts[1:]
    assert results[head.name].via == "laptop"  # type: ignore[union-attr]
    for worker in workers:
        assert results[worker.name].via == f"head {head.name}"  # type: ignore[union-attr]
        copy = _home(worker) / ".fleetrun" / "work" / "t-relay"
        assert sorted(p.name for p in (copy / "pkg").iterdir()) == sorted(f"m{i}.py" for i in range(20))
        assert not (copy / "ignored.bin").exists(), ".gitignore must hold through the relay too"
        assert (_home(worker) / ".fleetrun" / "lib" / "VERSION").read_text().strip() == nodelib_source()[1]
        # the ephemeral key is gone again, and the operator's key untouched
        assert (_home(worker) / ".ssh" / "authorized_keys").read_text() == keys_before[worker.name]
    relay_dir = _home(head) / ".fleetrun" / "relay"
    assert not relay_dir.exists() or not any(relay_dir.iterdir()), "relay key material left on the head"


def test_relay_keeps_an_authorized_keys_without_trailing_newline_byte_identical(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """A worker whose authorized_keys does not end in a newline: the relay's line must not glue onto
    the operator's, and afterwards the file is byte for byte what it was."""
    inventory = fleet.inventory()
    worker = inventory.hosts[1]
    path = _home(worker) / ".ssh" / "authorized_keys"
    saved = path.read_bytes()
    unterminated = saved.rstrip(b"\n")
    path.write_bytes(unterminated)
    try:
        kh = _known_hosts(inventory)
        with Fleet(inventory.hosts, kh) as conns:
            results = sync_fleet(conns, _make_tree(tmp_path / "code"), "t-relay-nl", kh, relay_above=1)
        assert results[worker.name].via == f"head {inventory.hosts[0].name}", results  # type: ignore[union-attr]
        assert path.read_bytes() == unterminated, "the operator's key is intact, byte for byte"
        assert b"fleetrun-" not in path.read_bytes().replace(b"fleetrun-operator@", b""), (
            "no fleetrun key left"
        )
    finally:
        path.write_bytes(saved)


def test_relay_key_runs_only_the_rsync_receiver(fleet: LocalFleet, tmp_path: Path) -> None:
    """Through the real sshd: from the head, the relay key cannot run a command or write elsewhere."""
    inventory = fleet.inventory()
    head, worker = inventory.hosts[0], inventory.hosts[1]
    key = RelayKey.generate()
    line = key.authorized_line(head.private_address, relay_dests("t-gate"), expiry_time(600))
    key_file = _home(head) / ".fleetrun" / "gate-test-key"
    known = _home(head) / ".fleetrun" / "gate-test-known"
    key_file.parent.mkdir(exist_ok=True)
    key_file.write_text(key.private_openssh)
    known.write_text(f"{worker.private_address} {worker.host_key}\n")
    for f in (key_file, known):
        f.chmod(0o600)
        subprocess.run(["chown", f"{head.user}:{head.user}", str(f)], check=True)
    ssh = (
        f"ssh -F /dev/null -i {key_file} -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={known}"
    )

    def from_head(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", fleet.netns(0), "runuser", "-u", head.user, "--", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def as_worker(command: str) -> None:
        subprocess.run(["runuser", "-u", worker.user, "--", "sh", "-c", command], check=True, cwd="/")

    src = _home(head) / ".fleetrun" / "gate-src"
    src.mkdir(exist_ok=True)
    (src / "f.txt").write_text("relayed\n")
    subprocess.run(["chown", "-R", f"{head.user}:{head.user}", str(src)], check=True)
    target = f"{worker.user}@{worker.private_address}"
    as_worker(add_command(line))
    try:
        shell = from_head([*ssh.split(), target, "id"])
        assert shell.returncode != 0 and "only the rsync receiver" in shell.stderr, shell
        elsewhere = from_head(["rsync", "-a", "-e", ssh, f"{src}/", f"{target}:.ssh/"])
        assert elsewhere.returncode != 0, "writing outside the synced directories is refused"
        allowed = from_head(
            ["rsync", "-a", "--mkpath", "-e", ssh, f"{src}/", f"{target}:.fleetrun/work/t-gate/"]
        )
        assert allowed.returncode == 0, allowed.stderr
        assert (_home(worker) / ".fleetrun" / "work" / "t-gate" / "f.txt").read_text() == "relayed\n"
    finally:
        as_worker(remove_command(line))
        key_file.unlink()
        known.unlink()
    assert key.tag not in (_home(worker) / ".ssh" / "authorized_keys").read_text()


def test_relay_key_is_refused_from_another_address_and_sync_falls_back(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """The workers accept the relay key only from the head's private address: claim another one
    and the head is refused; the workers are then synced directly, and nothing is lost."""
    inventory = fleet.inventory()
    wrong = inventory.hosts[0].model_copy(update={"private_address": "198.18.1.250"})
    skewed = inventory.model_copy(update={"hosts": [wrong, *inventory.hosts[1:]]})
    workdir = _make_tree(tmp_path / "code")
    kh = _known_hosts(skewed)
    with Fleet(skewed.hosts, kh) as conns:
        results = sync_fleet(conns, workdir, "t-relay-refused", kh, relay_above=1)
    for worker in skewed.hosts[1:]:
        result = results[worker.name]
        assert isinstance(result, SyncResult), result
        assert result.via == "laptop", "the relay should have been refused by the from= restriction"
        assert (_home(worker) / ".fleetrun" / "work" / "t-relay-refused" / "pkg" / "m0.py").exists()
        assert "fleetrun-relay-" not in (_home(worker) / ".ssh" / "authorized_keys").read_text()


def test_unchanged_resync_skips_a_current_node_library(fleet: LocalFleet, tmp_path: Path) -> None:
    inventory = fleet.inventory()
    workdir = _make_tree(tmp_path / "code")
    kh = _known_hosts(inventory)
    names = [h.name for h in inventory.hosts]
    with Fleet(inventory.hosts, kh) as conns:
        first = sync_fleet(conns, workdir, "t-lib", kh, relay_above=100)
        again = sync_fleet(conns, workdir, "t-lib", kh, relay_above=100, lib_current=names)
    assert all(isinstance(r, SyncResult) for r in [*first.values(), *again.values()])
    assert all(r.files_sent == 0 for r in again.values()), again  # type: ignore[union-attr]


def test_relay_key_and_config_shapes() -> None:
    """Pure parts: the authorized line restricts the key; the config skips the library where current."""
    key = RelayKey.generate()
    line = key.authorized_line("198.18.9.10", relay_dests("job"), "202701010000")
    assert line.startswith('restrict,from="198.18.9.10",expiry-time="202701010000",command="sh -c ')
    assert line.endswith(key.tag)
    assert "OPENSSH PRIVATE KEY" in key.private_openssh
    assert line in remove_command(line).replace("'\"'\"'", "'"), "revoked by its exact line"
    hosts = [
        Host(
            name=f"n{i}",
            address=f"203.0.113.{i + 1}",
            private_address=f"10.0.0.{i + 1}",
            user="u",
            host_key=hk,
        )
        for i, hk in enumerate(
            [
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfmCw1Vb2xhQhB8m0Vd5hWgSJ8e7mIvQ6bA3ZrV1eQm",
            ]
        )
    ]
    config = relay_config(hosts, "job", ["--exclude=.git"], ".fleetrun/relay/x", parallel=4)
    targets = config["targets"]
    assert isinstance(targets, list)
    assert [t["address"] for t in targets] == ["10.0.0.1", "10.0.0.2"], "the head dials private addresses"
    # issue 24, item 8: the relay writes the workdir only; never the node library
    assert relay_dests("job") == (".fleetrun/work/job/",)
    transfers = config["transfers"]
    assert isinstance(transfers, list) and [t["dest"] for t in transfers] == [".fleetrun/work/job"]
    assert [t["ship_lib"] for t in targets] == [False, False]


FAKE_SSH = """#!/bin/sh
# ssh as rsync runs it, without a network: note the host, run the remote command in the worker's home
while [ $# -gt 0 ]; do
  case "$1" in
    -F|-p|-i|-o|-l) shift 2 ;;
    *) break ;;
  esac
done
printf '%s\\n' "$1" >> "$FAKE_SSH_LOG"
shift
cd "$FAKE_WORKER_HOME" && exec sh -c "$*"
"""


@pytest.mark.parametrize("address", ["2001:db8::11", "fd00:1::2", "10.0.0.2"])
def test_relay_rsync_reaches_a_worker_on_an_ipv6_address(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's rsync to ``user@2001:db8::11:path`` read the host as ``2001``: an IPv6 lab above
    ``relay_sync_above`` never synced. Real rsync; ``ssh`` is a stand-in that runs its receiver."""
    from launch.nodelib import fleetrun_relay
    from launch.nodelib.fleetrun_relay_messages import RelayConfig, RelayTarget, RelayTransfer

    head_home, worker_home, bin_dir = tmp_path / "head", tmp_path / "worker", tmp_path / "bin"
    for folder in (head_home, worker_home, bin_dir):
        folder.mkdir()
    _make_tree(head_home / ".fleetrun" / "work" / "job")
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("HOME", str(head_home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    monkeypatch.setenv("FAKE_WORKER_HOME", str(worker_home))
    config = RelayConfig(
        key="/dev/null",
        known_hosts="/dev/null",
        transfers=(RelayTransfer(source=".fleetrun/work/job", dest=".fleetrun/work/job"),),
        targets=(RelayTarget(name="n1", user="u", address=address),),
    )
    result = fleetrun_relay.copy_to(config, config.targets[0])
    assert result.ok, result.error
    assert log.read_text().split() == [address], "ssh was asked for the whole address"
    assert (worker_home / ".fleetrun" / "work" / "job" / "pkg" / "m0.py").is_file()


def test_the_relays_lines_are_read_as_they_come_and_an_endless_line_is_dropped() -> None:
    """The head's answer (one JSON line per worker) reaches the laptop chunk by chunk; a head
    that sends a line without end is not held whole: it is dropped and the next lines still count."""
    from launch.transport.channels import MAX_ANSWER_BYTES
    from launch.transport.sync_relay import _LineReader

    lines: list[str] = []
    reader = _LineReader(lines.append)
    reader.feed(b'{"a": 1}\n{"b"')
    reader.feed(b": 2}\n\n")
    for _ in range(MAX_ANSWER_BYTES // 65536 + 2):
        reader.feed(b"x" * 65536)
        assert len(reader.pending) <= MAX_ANSWER_BYTES
    reader.feed(b"still the long line\n" + '{"c": "é"}\n'.encode())
    assert lines == ['{"a": 1}', '{"b": 2}', '{"c": "é"}']
