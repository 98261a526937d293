"""Container runtimes on local-fleet nodes (``LocalFleet.up(containers=True)``), configured as a
lab's admin would: rootless podman per node user, images from a shared read-only image store.

A lab that runs jobs in images keeps them where every machine reads them (an image cache on
shared storage, podman's ``additionalimagestores``) rather than one copy per user and machine;
here that store is ``IMAGE_STORE`` on this machine, which root fills once (``import_image``) and
every node reads. Each node's ``/etc/containers`` is its own (``/etc/netns/<ns>/containers``,
which ``ip netns exec`` mounts over ``/etc/containers`` for the node's sshd and so for every
session): the machine's files, plus a ``storage.conf`` naming the shared store and, on a machine
whose cgroups are in hybrid mode (crun refuses it), a ``containers.conf`` choosing runc.
Rootless podman needs subordinate ids for the node user: ``useradd`` gives every new user a
range in ``/etc/subuid`` and ``/etc/subgid`` (Debian's ``SUB_UID_COUNT``), and ``userdel``
removes it, so the fleet's own user life cycle covers them (``check_subids`` says when not).
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
    for name in ("/etc/subuid", "/etc/subgid"):
        try:
            listed = {line.split(":", 1)[0] for line in Path(name).read_text().splitlines()}
        except OSError:
            listed = set()
        missing = [user for user in users if user not in listed]
        if missing:
            raise LocalFleetError(
                f"--containers: {name} has no range for {', '.join(missing)} (rootless podman needs one; "
                "useradd adds it when SUB_UID_COUNT is set in /etc/login.defs)"
            )
