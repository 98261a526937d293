"""VM-like local-fleet nodes: each node also has its own mount namespace (``LocalFleet.up(vm=True)``).

A cloud image gives every node the same user (``ubuntu``), the same home path and a ``/tmp`` of its
own; tools written for clouds (Ray's cluster launcher takes one ``ssh_user`` for all nodes) assume
it. A plain local-fleet node is a network namespace with a user of its own (``<prefix>node<i>``), as
a lab gives; both stay supported. In VM mode every node's user is ``<prefix>fleet``, home
``/home/<prefix>fleet``, and in each node's mount namespace that path is a bind mount of the node's
own directory (``/home/<prefix>node<i>`` on this machine) and ``/tmp`` a bind of the node's own
``tmp`` under its state directory.

The namespaces are persistent: ``unshare --mount=<file>`` binds each one to a file under
``/run/fleetrun-mnt/<prefix>/`` (a directory bind-mounted on itself and made private, which the
kernel requires of a namespace file's parent mount), so fleet operations (``sshd``'s start, a test
looking around a node) enter it with ``nsenter --mount=<file>``. Propagation is private both ways:
nothing a node mounts reaches this machine, nor the other nodes. Each node's sshd also runs in a
PID namespace of its own (``node.start_sshd``), as its init: every node shares one uid, and without
it ``ray stop`` or ``pkill -u`` on one node would reach the others. ``down`` unmounts the files and the
directory and removes them; the per-node directories go with the fleet's records (``node_home``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

from launch.fleets.local.naming import FleetNames
from launch.fleets.local.prereqs import run
from launch.fleets.local.state import Created

Record = Callable[[str, str], None]

MOUNT_ROOT = Path("/run/fleetrun-mnt")


def mount_dir(names: FleetNames) -> Path:
    return MOUNT_ROOT / names.prefix


def ns_file(names: FleetNames, i: int) -> Path:
    return mount_dir(names) / f"node{i}"


def sshd_dir(names: FleetNames, i: int) -> Path:
    """The node's sshd files (root only), under the namespace directory: visible in the node's
    mount namespace whatever it binds over /tmp."""
    return mount_dir(names) / f"node{i}.sshd"


def node_tmp(names: FleetNames, i: int) -> Path:
    return names.node_dir(i) / "tmp"


def enter_argv(names: FleetNames, i: int) -> list[str]:
    """Prefix for a command that must run in node ``i``'s mount namespace."""
    return ["nsenter", f"--mount={ns_file(names, i)}"]


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point in this (the root) mount namespace."""
    target = str(path)
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                return True
    return False


def make_mount_dir(names: FleetNames, record: Record) -> None:
    """``/run/fleetrun-mnt/<prefix>``, bind-mounted on itself and private (namespace files need it)."""
    where = mount_dir(names)
    record("mount_dir", str(where))
    where.mkdir(parents=True, exist_ok=False, mode=0o700)
    run(["mount", "--bind", str(where), str(where)])
    run(["mount", "--make-private", str(where)])


def make_node_home(names: FleetNames, i: int, user: str, operator_pub: str, record: Record) -> None:
    """The node's own home directory (its ``/home/<user>`` once bound), with the operator's key."""
    home = names.home(i)
    record("node_home", str(home))
    home.mkdir(mode=0o700, exist_ok=False)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(operator_pub + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    for path in (home, ssh_dir, ssh_dir / "authorized_keys"):
        shutil.chown(path, user, user)


def make_mount_ns(names: FleetNames, i: int, user_home: Path, record: Record) -> None:
    """Node ``i``'s persistent mount namespace: its home over ``user_home`` and its own ``/tmp``."""
    tmp = node_tmp(names, i)
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o1777)
    target = ns_file(names, i)
    record("mountns", str(target))
    target.touch(mode=0o600, exist_ok=False)
    binds = (
        f"mount --bind {shlex.quote(str(names.home(i)))} {shlex.quote(str(user_home))} && "
        f"mount --bind {shlex.quote(str(tmp))} /tmp"
    )
    run(["unshare", f"--mount={target}", "--propagation", "private", "sh", "-c", binds])


def remove_mounts(created: Created) -> None:
    """Unmount and remove the recorded namespace files, then their directory (idempotent)."""
    for name in created["mountns"]:
        path = Path(name)
        if mounted(path):
            run(["umount", str(path)], check=False)
        if path.is_file() and not path.is_symlink() and not mounted(path):
            path.unlink()
    for name in created["mount_dir"]:
        path = Path(name)
        if mounted(path):
            run(["umount", str(path)], check=False)
        if path.is_dir() and not path.is_symlink() and not mounted(path):
            shutil.rmtree(path, ignore_errors=True)  # the sshd directories (root's own, under /run)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # /run/fleetrun-mnt, when no other fleet uses it


def mount_leftovers(created: Created) -> list[str]:
    """Recorded namespace files and directories still mounted or present."""
    return [
        name
        for name in created["mountns"] + created["mount_dir"]
        if mounted(Path(name)) or os.path.lexists(name)
    ]
