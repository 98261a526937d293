"""Container runtimes on local-fleet nodes (``LocalFleet.up(containers=True)``), configured as a
lab's admin would: rootless podman per node user, images from a shared read-only image store.

A lab that runs jobs in images keeps them where every machine reads them (an image cache on
shared storage, podman's ``additionalimagestores``) rather than one copy per user and machine;
here that store is ``IMAGE_STORE`` on this machine, which root fills once (``import_image``) and
every node reads. Each node's ``/etc/containers`` is its own (``/etc/netns/<ns>/containers``,
which ``ip netns exec`` mounts over ``/etc/containers`` for the node's sshd and so for every
session): the machine's files, plus a ``storage.conf`` naming the shared store and, on a machine
whose cgroups are in hybrid mode (crun refuses it), a ``containers.conf`` choosing runc.
Rootless podman needs subordinate ids for the node user, and here every node user of a
``--containers`` fleet gets the SAME range (``SHARED_SUBIDS``, not ``useradd``'s distinct one per
user): the shared store's image was imported by root, and a file of it owned by a host uid that
the user's namespace does not map (root's 0 is not) cannot be copied up by overlay (creating a
mount point such as ``/home/<user>`` for ``-v $HOME/work:...`` failed with EOVERFLOW, "Value too
large for defined data type"). The test image's files are therefore owned by the range's first
id (``tests/containerkit.py``), which every node user's namespace maps to container uid 1. On a
real machine each user pulls the image into their own store (rootless podman maps the layers to
the user's own range as it unpacks them); the shared range is a local-fleet test arrangement
(it lets the node users' containers share host ids, so it is for a test machine only).
``userdel`` removes the user's ranges with the user (``leftovers`` says when not).

Each node's sshd runs under ``ip netns exec``, which gives it a mount namespace with ``/sys``
mounted afresh: ``/sys/fs/cgroup`` is empty there, and runc ("no cgroup mount found in
mountinfo") and crun ("invalid file system type on /sys/fs/cgroup") both refuse to start a
container. So the sshd's start script first replays this machine's cgroup mounts
(``cgroup_mount_commands``, from ``/proc/self/mounts``: cgroup v1, v2 or both), and every session
of the node (the ranks' ``podman run``) has them. Rootless podman keeps a pause process per user
whose namespaces later podman calls join: a node user's first podman call must be made in such a
session (``tests/containerkit.node_podman`` enters the sshd's namespaces for that reason).
``--ipc host`` needs the host's ``/dev/mqueue``, which systemd mounts on a normal machine;
``hold_mqueue`` mounts it where it is missing (a container as the build machine). That mount is
the machine's, shared by every containers fleet on it (other fleets' containers use it too), so
it is held, not owned: each fleet leaves a holder file under ``MQUEUE_LEDGER`` and the ledger
notes that fleetrun made the mount (and the folder, if it made that too); ``release_mqueue``
removes the fleet's holder and, when it was the last and fleetrun made the mount, undoes exactly
what fleetrun made. A mount fleetrun found in place is never unmounted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from launch.errors import LocalFleetError

IMAGE_STORE = Path("/opt/fleetrun/containers/storage")
"""The shared read-only image store every node's podman reads (root's podman writes it)."""
IMAGE_RUNROOT = Path("/opt/fleetrun/containers/run")
MQUEUE = Path("/dev/mqueue")
MQUEUE_LEDGER = Path("/run/fleetrun/mqueue")
"""Machine-wide: ``holders/<prefix>`` per containers fleet up, ``mounted`` when fleetrun made the
mount (its text ``dir`` when fleetrun made the folder too), ``lock`` serialising both."""
HOST_CONF = Path("/etc/containers")
SHARED_SUBIDS = (1_000_000_000, 65536)
"""(first id, count): the one subordinate id range of every ``--containers`` node user; the test
image's files are owned by the first id (see the module docstring)."""
CGROUP_ROOT = "/sys/fs/cgroup"
GENERIC_MOUNT_OPTIONS = frozenset(
    {"rw", "ro", "relatime", "noatime", "strictatime", "nodiratime", "nosuid", "nodev", "noexec", "seclabel"}
)
"""Options of any mount: left out when a cgroup mount is replayed (its own options are kept)."""
HYBRID_CGROUPS = Path("/sys/fs/cgroup/unified")
"""Present when cgroup v1 and v2 are mounted side by side (hybrid): crun refuses that."""


def have_podman() -> bool:
    return shutil.which("podman") is not None


def hybrid_cgroups() -> bool:
    return HYBRID_CGROUPS.is_dir()


def storage_conf() -> str:
    return (
        "# fleetrun local fleet: images from the machine's shared read-only store\n"
        '[storage]\ndriver = "overlay"\n'
        f'[storage.options]\nadditionalimagestores = ["{IMAGE_STORE}"]\n'
    )


def user_storage_conf(home: Path, user: str) -> None:
    """The node user's own ``~/.config/containers/storage.conf`` naming the shared store: rootless
    podman takes only the driver from the machine's ``storage.conf`` and drops its
    ``additionalimagestores`` (a node saw no image of the store and tried to pull it), so a lab
    puts that line in each user's file, as here."""
    folder = home / ".config" / "containers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "storage.conf").write_text(storage_conf())
    for path in (home / ".config", folder, folder / "storage.conf"):
        shutil.chown(path, user, user)


def _unescape(field: str) -> str:
    """A ``/proc/mounts`` field with its octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mount_commands(mounts: str) -> list[str]:
    """Shell commands that mount at ``/sys/fs/cgroup`` what ``mounts`` (``/proc/self/mounts``'s
    text) has there: the tmpfs holding the v1 hierarchies, each hierarchy (``cpu``, ...,
    ``name=systemd``), a cgroup2 mount (``unified``, or the root on a v2-only machine). Each mount
    point is made first; a mount point listed twice is replayed once."""
    commands: list[str] = []
    seen: set[str] = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind = _unescape(fields[1]), fields[2]
        under = where == CGROUP_ROOT or where.startswith(CGROUP_ROOT + "/")
        if not under or where in seen or kind not in ("cgroup", "cgroup2", "tmpfs"):
            continue
        if kind == "tmpfs" and where != CGROUP_ROOT:
            continue
        seen.add(where)
        own = [o for o in fields[3].split(",") if o not in GENERIC_MOUNT_OPTIONS]
        if kind == "tmpfs":
            own += ["nosuid", "nodev", "noexec"]
            source = "cgroup-root"
        elif kind == "cgroup":
            if all(o.startswith("name=") for o in own):
                own.insert(0, "none")  # a named hierarchy without controllers (name=systemd)
            source = "cgroup"
        else:
            source = "cgroup2"
        options = ["-o", ",".join(own)] if own else []
        mount = ["mount", "-t", kind, *options, source, where]
        prefix = f"mkdir -p {shlex.quote(where)} && " if where != CGROUP_ROOT else ""
        commands.append(prefix + " ".join(shlex.quote(word) for word in mount))
    return commands


def node_cgroup_mounts() -> list[str]:
    """``cgroup_mount_commands`` of this machine (the process that starts the nodes' sshd)."""
    return cgroup_mount_commands(Path("/proc/self/mounts").read_text())


def subid_lines(users: set[str]) -> list[str]:
    """Lines of ``/etc/subuid`` and ``/etc/subgid`` that give ``users`` a range (a fleet's own
    users' lines still there after ``down`` are left behind)."""
    found: list[str] = []
    for name in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(name).read_text().splitlines()
        except OSError:
            continue
        found += [f"{name}:{line}" for line in lines if line.split(":", 1)[0] in users]
    return found


def remove_tmp_of(uid: int, where: Path = Path("/tmp")) -> None:
    """Everything user ``uid`` has at the top of ``/tmp`` (this machine's, without a mount
    namespace per node). Rootless podman keeps its run state there (``/tmp/containers-user-<uid>``,
    ``/tmp/podman-run-<uid>``): a replaced node's would name the old machine's containers and
    pause process (a new VM's ``/tmp`` is empty), and one left by a removed user would be found
    by the next user given the same uid. Links are removed, not followed."""
    with contextlib.suppress(OSError), os.scandir(where) as found:
        for entry in found:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


def containers_conf() -> str:
    lines = ["# fleetrun local fleet", "[engine]"]
    if hybrid_cgroups():
        lines.append('runtime = "runc"  # crun refuses cgroups in hybrid mode')
    return "\n".join(lines) + "\n"


def node_etc(etc: Path) -> None:
    """Write the node's own ``/etc/containers`` under its ``/etc/netns/<ns>`` folder ``etc``."""
    target = etc / "containers"
    if HOST_CONF.is_dir():
        shutil.copytree(HOST_CONF, target, symlinks=True)
    else:
        target.mkdir(parents=True)
    (target / "storage.conf").write_text(storage_conf())
    (target / "containers.conf").write_text(containers_conf())


def _mounted(where: Path) -> bool:
    return any(line.split()[1:2] == [str(where)] for line in Path("/proc/mounts").read_text().splitlines())


@contextlib.contextmanager
def _ledger_lock(ledger: Path) -> Iterator[None]:
    (ledger / "holders").mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(ledger / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def hold_mqueue(prefix: str, where: Path | None = None, ledger: Path | None = None) -> None:
    """Hold POSIX message queues on ``where`` for fleet ``prefix`` (``--ipc host`` bind-mounts
    it), mounting them when the machine has none; a machine booted by systemd has them already.
    The holder file and the ``mounted`` note are written before the mount (write-ahead), so a
    crash leaves a ledger that covers it."""
    where, ledger = where or MQUEUE, ledger or MQUEUE_LEDGER
    with _ledger_lock(ledger):
        (ledger / "holders" / prefix).write_text("")
        if _mounted(where):
            return
        made_dir = not where.exists()
        (ledger / "mounted").write_text("dir" if made_dir else "")
        where.mkdir(exist_ok=True)
        done = subprocess.run(["mount", "-t", "mqueue", "mqueue", str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            raise LocalFleetError(
                f"--containers: mount -t mqueue on {where} failed: {done.stderr.strip()[-300:]}"
            )


def release_mqueue(prefix: str, where: Path | None = None, ledger: Path | None = None) -> None:
    """Drop fleet ``prefix``'s hold; the last holder out undoes the mount (and folder) fleetrun
    made, and nothing it found in place. Idempotent."""
    where, ledger = where or MQUEUE, ledger or MQUEUE_LEDGER
    if not (ledger / "holders").is_dir():
        return
    with _ledger_lock(ledger):
        (ledger / "holders" / prefix).unlink(missing_ok=True)
        if any((ledger / "holders").iterdir()):
            return
        note = ledger / "mounted"
        if not note.exists():
            return
        made_dir = note.read_text() == "dir"
        if _mounted(where):
            subprocess.run(["umount", str(where)], capture_output=True, check=False)
        if made_dir and not _mounted(where):
            with contextlib.suppress(OSError):
                where.rmdir()
        if not _mounted(where):
            note.unlink()


def holds_mqueue(prefix: str) -> bool:
    return (MQUEUE_LEDGER / "holders" / prefix).exists()


def check_ready(users: list[str]) -> None:
    """Podman, runc where needed, and a subordinate id range for every node user, or a clear error."""
    if not have_podman():
        raise LocalFleetError("--containers needs podman on this machine (make system-deps installs it)")
    if hybrid_cgroups() and shutil.which("runc") is None:
        raise LocalFleetError("--containers on hybrid cgroups needs runc (make system-deps installs it)")
    first, count = SHARED_SUBIDS
    for name in ("/etc/subuid", "/etc/subgid"):
        try:
            listed = {tuple(line.split(":")) for line in Path(name).read_text().splitlines()}
        except OSError:
            listed = set()
        missing = [user for user in users if (user, str(first), str(count)) not in listed]
        if missing:
            raise LocalFleetError(
                f"--containers: {name} has no range {first}:{count} for {', '.join(missing)} "
                "(rootless podman needs it: the fleet adds it with usermod --add-subuids)"
            )
