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
``ensure_mqueue`` mounts it where it is missing (a container as the build machine).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from launch.errors import LocalFleetError

IMAGE_STORE = Path("/opt/fleetrun/containers/storage")
"""The shared read-only image store every node's podman reads (root's podman writes it)."""
IMAGE_RUNROOT = Path("/opt/fleetrun/containers/run")
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


def ensure_mqueue() -> None:
    """Mount POSIX message queues on ``/dev/mqueue`` when the machine has none (``--ipc host``
    bind-mounts it); a machine booted by systemd has it already."""
    mqueue = Path("/dev/mqueue")
    if mqueue.is_dir() and any(
        line.split()[1:2] == ["/dev/mqueue"] for line in Path("/proc/mounts").read_text().splitlines()
    ):
        return
    mqueue.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "mqueue", "mqueue", str(mqueue)], check=False, capture_output=True)


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
