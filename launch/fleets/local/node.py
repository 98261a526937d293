"""Building one local-fleet node: its namespace and link, ``/etc`` overlay, user and sshd.

Every step records what it is about to create first (``record(kind, name)``, write-ahead), so
``down`` can remove a half-built node after a crash, and nothing it did not record.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from launch.fleets.local.naming import NODES_PER_BLOCK, FleetNames
from launch.fleets.local.prereqs import SSHD, run
from launch.job.inventory import Host

Record = Callable[[str, str], None]


def sshd_config(names: FleetNames, i: int, host_key: Path) -> str:
    """The node's sshd: own host key, listens only on the node's address, only this user."""
    node_dir = names.node_dir(i)
    lines = [
        f"ListenAddress {names.address(i)}:22",
        f"HostKey {host_key}",
        f"PidFile {node_dir / 'sshd.pid'}",
        f"AllowUsers {names.node_name(i)}",
        "UsePAM no",
        "PermitRootLogin no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "StrictModes yes",
        "UseDNS no",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxStartups 200:30:400",
        "MaxSessions 200",
        "Subsystem sftp internal-sftp",
    ]
    return "\n".join(lines) + "\n"


def make_network(names: FleetNames, i: int, total: int, record: Record) -> None:
    """Namespace, veth pair (node side renamed eth0), address, routes to the other blocks, overlay."""
    ns, veth, peer, addr = names.netns(i), names.veth(i), names.peer(i), names.address(i)
    record("netns", ns)
    run(["ip", "netns", "add", ns])
    record("link", veth)
    record("link", peer)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", ns])
    run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
    run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    own_block = i // NODES_PER_BLOCK
    for block in range(names.blocks(total)):
        if block != own_block:  # one L2 bridge: the other blocks are on-link too
            run(["ip", "-n", ns, "route", "add", f"{names.block_prefix(block)}.0/24", "dev", "eth0"])
    run(["ip", "link", "set", veth, "master", names.bridge])
    run(["ip", "link", "set", veth, "up"])
    # Per-namespace /etc overlays: every node resolves every node; DNS fails fast (no route out).
    etc = names.netns_etc(i)
    record("netns_etc", str(etc))
    etc.mkdir(parents=True, exist_ok=False)
    hosts_lines = ["127.0.0.1 localhost"] + [f"{names.address(j)} {names.node_name(j)}" for j in range(total)]
    (etc / "hosts").write_text("\n".join(hosts_lines) + "\n")
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def make_user(names: FleetNames, i: int, operator_pub: str, record: Record) -> None:
    """The node's user, marked as the fleet's (GECOS), own home, no password ('*': usable with UsePAM no)."""
    name, home = names.node_name(i), names.home(i)
    record("user", name)
    record("home", str(home))
    run(
        [
            "useradd",
            "--create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/bash",
            "--comment",
            names.marker,
            "--user-group",
            name,
        ]
    )
    run(["usermod", "-p", "*", name])
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(operator_pub + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    shutil.chown(ssh_dir, name, name)
    shutil.chown(ssh_dir / "authorized_keys", name, name)


def make_node(names: FleetNames, i: int, total: int, operator_pub: str, python: str, record: Record) -> Host:
    make_network(names, i, total, record)
    make_user(names, i, operator_pub, record)
    node_dir = names.node_dir(i)
    node_dir.mkdir(parents=True, exist_ok=True)
    host_key = node_dir / "ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", names.node_name(i), "-f", str(host_key)])
    (node_dir / "sshd_config").write_text(sshd_config(names, i, host_key))
    return Host(
        name=names.node_name(i),
        address=names.address(i),
        private_address=names.address(i),
        user=names.node_name(i),
        port=22,
        key=names.key_path,
        host_key=host_key.with_suffix(".pub").read_text().strip(),
        gpus=0,
        interface="eth0",
        python=python,
    )


def start_sshd(names: FleetNames, i: int) -> None:
    """sshd inside the node's namespace, with the node's own UTS hostname (``unshare --uts``)."""
    node_dir = names.node_dir(i)
    script = (
        f"hostname {names.node_name(i)} && "
        f"exec {SSHD} -f {node_dir / 'sshd_config'} -E {node_dir / 'sshd.log'}"
    )
    run(["ip", "netns", "exec", names.netns(i), "unshare", "--uts", "sh", "-c", script])
