"""Building one local-fleet node: its namespace and link, ``/etc`` overlay, user and sshd.

Every step records what it is about to create first (``record(kind, name)``, write-ahead), so
``down`` can remove a half-built node after a crash, and nothing it did not record.

A ``Shape`` says what kind of lab the fleet imitates: ``bastion`` puts every node on an internal
bridge this machine has no address on, and gives the head a second interface on the external
bridge (its sshd listens on both; the workers' inventory entries jump through it); ``mixed``
gives each node its own sshd port and interface name (users and homes differ already); ``vm``
gives every node the same user and home path and its own ``/tmp`` (``launch.fleets.local.mountns``).
"""

from __future__ import annotations

import pwd
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launch.fleets.local import containers, mountns
from launch.fleets.local.naming import NODES_PER_BLOCK, FleetNames
from launch.fleets.local.prereqs import SSHD, run
from launch.job.inventory import Host, JumpHost

Record = Callable[[str, str], None]


@dataclass(frozen=True)
class Shape:
    """How the fleet's network and nodes look (``LocalFleet.up(bastion=, mixed=)``)."""

    bastion: bool = False
    mixed: bool = False
    vm: bool = False
    containers: bool = False
    """Each node's own ``/etc/containers`` for rootless podman (``launch.fleets.local.containers``)."""

    def user(self, names: FleetNames, i: int) -> str:
        """Node ``i``'s login: its own (a lab) or, in VM mode, the fleet's one user (a cloud image)."""
        return names.vm_user if self.vm else names.node_name(i)

    def sshd_dir(self, names: FleetNames, i: int) -> Path:
        """Where the node's sshd keeps its host key, config, pid and log: in VM mode not under the
        state directory, which may be under /tmp (tests, benches) and /tmp is the node's own there."""
        return mountns.sshd_dir(names, i) if self.vm else names.node_dir(i)

    def listen(self, names: FleetNames, i: int) -> list[str]:
        port = names.ssh_port(i, self.mixed)
        extra = [names.external_address] if self.bastion and i == 0 else []
        return [f"{address}:{port}" for address in [names.address(i), *extra]]


def sshd_config(names: FleetNames, i: int, host_key: Path, shape: Shape = Shape()) -> str:
    """The node's sshd: own host key, listens only on the node's address(es), only this user."""
    node_dir = shape.sshd_dir(names, i)
    lines = [
        *(f"ListenAddress {where}" for where in shape.listen(names, i)),
        f"HostKey {host_key}",
        f"PidFile {node_dir / 'sshd.pid'}",
        f"AllowUsers {shape.user(names, i)}",
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


def make_network(names: FleetNames, i: int, total: int, record: Record, shape: Shape = Shape()) -> None:
    """Namespace, veth pair (node side renamed eth0, ``lan<i>`` when mixed), address, routes to the other blocks, overlay."""
    ns, veth, peer, addr = names.netns(i), names.veth(i), names.peer(i), names.address(i)
    iface = names.interface(i, shape.mixed)
    bridge = names.internal_bridge if shape.bastion else names.bridge
    record("netns", ns)
    run(["ip", "netns", "add", ns])
    record("link", veth)
    record("link", peer)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", ns])
    run(["ip", "-n", ns, "link", "set", peer, "name", iface])
    run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", iface])
    run(["ip", "-n", ns, "link", "set", iface, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    own_block = i // NODES_PER_BLOCK
    for block in range(names.blocks(total)):
        if block != own_block:  # one L2 bridge: the other blocks are on-link too
            run(["ip", "-n", ns, "route", "add", f"{names.block_prefix(block)}.0/24", "dev", iface])
    run(["ip", "link", "set", veth, "master", bridge])
    run(["ip", "link", "set", veth, "up"])
    if shape.bastion and i == 0:
        make_external_link(names, record)
    # Per-namespace /etc overlays: every node resolves every node; DNS fails fast (no route out).
    etc = names.netns_etc(i)
    record("netns_etc", str(etc))
    etc.mkdir(parents=True, exist_ok=False)
    hosts_lines = ["127.0.0.1 localhost"] + [f"{names.address(j)} {names.node_name(j)}" for j in range(total)]
    (etc / "hosts").write_text("\n".join(hosts_lines) + "\n")
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    if shape.containers:
        containers.node_etc(etc)


def make_external_link(names: FleetNames, record: Record) -> None:
    """Bastion mode: the head's second interface (``ext0``) on the external bridge."""
    ns, veth, peer = names.netns(0), names.external_veth(), names.external_peer()
    record("link", veth)
    record("link", peer)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", ns])
    run(["ip", "-n", ns, "link", "set", peer, "name", "ext0"])
    run(["ip", "-n", ns, "addr", "add", f"{names.external_address}/24", "dev", "ext0"])
    run(["ip", "-n", ns, "link", "set", "ext0", "up"])
    run(["ip", "link", "set", veth, "master", names.bridge])
    run(["ip", "link", "set", veth, "up"])


def make_user(
    names: FleetNames,
    i: int,
    operator_pub: str,
    record: Record,
    name: str = "",
    home: Path | None = None,
    shared_subids: bool = False,
) -> None:
    """The node's user, marked as the fleet's (GECOS), own home, no password ('*': usable with UsePAM no).
    ``shared_subids``: the one subordinate id range of every ``--containers`` node user
    (``containers.SHARED_SUBIDS``) instead of a range of its own."""
    name, home = name or names.node_name(i), home or names.home(i)
    record("user", name)
    record("home", str(home))
    no_own_range = ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"] if shared_subids else []
    run(
        [
            "useradd",
            *no_own_range,
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
    if shared_subids:
        first, count = containers.SHARED_SUBIDS
        ids = f"{first}-{first + count - 1}"
        run(["usermod", "--add-subuids", ids, "--add-subgids", ids, name])
        # podman run state a removed user of the same uid left in /tmp would be taken for this one's
        containers.remove_tmp_of(pwd.getpwnam(name).pw_uid)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(operator_pub + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    shutil.chown(ssh_dir, name, name)
    shutil.chown(ssh_dir / "authorized_keys", name, name)


def make_node(
    names: FleetNames,
    i: int,
    total: int,
    operator_pub: str,
    python: str,
    record: Record,
    shape: Shape = Shape(),
) -> Host:
    make_network(names, i, total, record, shape)
    if shape.vm:
        if i == 0:  # one user for the whole fleet; its home path is a bind of each node's own
            make_user(names, i, operator_pub, record, names.vm_user, names.home(0).with_name(names.vm_user))
        mountns.make_node_home(names, i, names.vm_user, operator_pub, record)
        mountns.make_mount_ns(names, i, names.home(0).with_name(names.vm_user), record)
    else:
        make_user(names, i, operator_pub, record, shared_subids=shape.containers)
        if shape.containers:
            containers.user_storage_conf(names.home(i), names.node_name(i))
    names.node_dir(i).mkdir(parents=True, exist_ok=True)
    node_dir = shape.sshd_dir(names, i)
    node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    host_key = node_dir / "ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", names.node_name(i), "-f", str(host_key)])
    (node_dir / "sshd_config").write_text(sshd_config(names, i, host_key, shape))
    return Host(
        name=names.node_name(i),
        address=names.external_address if shape.bastion and i == 0 else names.address(i),
        private_address=names.address(i),
        user=shape.user(names, i),
        port=names.ssh_port(i, shape.mixed),
        key=names.key_path,
        host_key=host_key.with_suffix(".pub").read_text().strip(),
        gpus=0,
        interface=names.interface(i, shape.mixed),
        python=python,
    )


def behind_head(hosts: list[Host]) -> list[Host]:
    """Bastion mode: the workers reach this machine only through the head (its external address
    and its own pinned host key)."""
    head = hosts[0]
    jump = JumpHost(
        address=head.address, port=head.port, user=head.user, key=head.key, host_key=head.host_key
    )
    return [head] + [h.model_copy(update={"proxy_jump": jump}) for h in hosts[1:]]


def start_sshd(names: FleetNames, i: int, shape: Shape = Shape()) -> None:
    """sshd inside the node's namespace, with the node's own UTS hostname (``unshare --uts``);
    in VM mode entered through the node's mount namespace, so its sessions see the node's home and /tmp.
    A ``--containers`` node's sshd first mounts this machine's cgroups at ``/sys/fs/cgroup``, which
    ``ip netns exec``'s fresh ``/sys`` lacks and every container runtime needs
    (``containers.cgroup_mount_commands``)."""
    node_dir = shape.sshd_dir(names, i)
    cgroups = containers.node_cgroup_mounts() if shape.containers and not shape.vm else []
    script = " && ".join(
        [
            *cgroups,
            f"hostname {names.node_name(i)}",
            f"exec {SSHD} -f {node_dir / 'sshd_config'} -E {node_dir / 'sshd.log'}",
        ]
    )
    if not shape.vm:
        run(["ip", "netns", "exec", names.netns(i), "unshare", "--uts", "sh", "-c", script])
        return
    # VM mode: also a PID namespace of its own, with sshd in the foreground as its init (it reaps
    # what it adopts), so a node sees only its own processes: `ray stop` or `pkill -u` on one node
    # cannot reach another node's processes of the same user. `unshare` waits in the background.
    subprocess.Popen(
        [
            *mountns.enter_argv(names, i),
            *["ip", "netns", "exec", names.netns(i), "unshare", "--uts", "--pid", "--fork", "--mount-proc"],
            *["sh", "-c", script.replace(f"exec {SSHD} ", f"exec {SSHD} -D ")],
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
