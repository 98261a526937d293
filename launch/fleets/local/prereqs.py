"""What the host needs before a local fleet can exist: root, a few packages, the shared Python image.

Kept apart from the fleet's life cycle: these touch the host once (packages, ``/opt/fleetrun/image``)
and are shared by every fleet on it; nothing here is removed by ``down``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fleetrun_images import runtime_file
from launch.errors import LocalFleetError
from launch.paths import image_dir
from launch.processes import pid_alive  # noqa: F401 - used by the fleet and its power daemon

REQUIRED_TOOLS = {"sshd": "openssh-server", "ssh": "openssh-client", "rsync": "rsync", "ip": "iproute2"}
SSHD = "/usr/sbin/sshd"
REQUIREMENTS = runtime_file("local/requirements.txt")


ACCOUNT_TOOLS = frozenset({"useradd", "usermod", "userdel", "groupadd", "groupdel"})
LOCK_TRIES = 12


def run(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a host command; with ``check``, a failure raises ``LocalFleetError`` naming it.

    shadow's account tools give up at once with "cannot lock /etc/passwd; try again later" while
    another one holds the lock (fleets coming and going at once: the test suite's two workers, a
    second fleet beside a first): those are tried again, a little later each time."""
    for attempt in range(LOCK_TRIES):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode == 0 or argv[0] not in ACCOUNT_TOOLS or "cannot lock" not in proc.stderr:
            break
        time.sleep(0.1 * (attempt + 1))
    if check and proc.returncode != 0:
        raise LocalFleetError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalFleetError(
            "the local fleet needs root: each node is a network namespace with its own address, "
            "user and sshd, and creating namespaces, veth links and users requires root. "
            "Run as root (e.g. in a VM, a container with CAP_NET_ADMIN and CAP_SYS_ADMIN, or CI), "
            "or use an inventory of real machines instead (--inventory hosts.yaml)."
        )


def ensure_tools(say: Callable[[str], None] = print) -> None:
    """Install what the fleet needs (openssh-server, rsync, iproute2) when it is missing."""
    missing = sorted(
        {
            pkg
            for tool, pkg in REQUIRED_TOOLS.items()
            if shutil.which(tool) is None and not (tool == "sshd" and Path(SSHD).exists())
        }
    )
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LocalFleetError(f"missing packages {', '.join(missing)} and no apt-get to install them")
    say(f"installing {', '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
        if proc.returncode != 0:
            raise LocalFleetError(f"{' '.join(argv)} failed:\n{proc.stderr.strip()[-2000:]}")


def image_python() -> Path:
    return image_dir() / "venv" / "bin" / "python"


_VERIFIED: set[Path] = set()
"""Images this process has found complete (``ensure_image``): the probe imports torch, seconds of
CPU, and a test session brings a fleet up for each of its fleet modules; the image is only ever
added to, so a complete one stays complete for the life of the process."""


def ensure_image(say: Callable[[str], None] = print) -> Path:
    """Build the shared Python the nodes start from (torch CPU, numpy, the aws CLI), once.

    An image built before a requirement was added (the aws CLI) is completed in place.

    Made from Debian's ``/usr/bin/python3`` outside ``/root``: a venv of the pyenv Python under
    /root is unusable by node users (/root is mode 700).
    """
    python = image_python()
    if python in _VERIFIED and python.exists():
        return python
    if python.exists():
        probe = run([str(python), "-c", "import torch, numpy"], check=False, timeout=120)
        if probe.returncode == 0 and (python.parent / "aws").exists():
            _VERIFIED.add(python)
            return python
    if python.exists():  # completed in place: nodes of running fleets may be using this Python
        say(f"completing the local fleet image at {image_dir()} from {REQUIREMENTS}")
    else:
        base = shutil.which("python3", path="/usr/bin:/usr/local/bin") or "/usr/bin/python3"
        say(f"building the local fleet image at {image_dir()} (torch CPU, numpy; about a minute, once)")
        image_dir().mkdir(parents=True, exist_ok=True)
        run([base, "-m", "venv", str(image_dir() / "venv")], timeout=300)
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(REQUIREMENTS)],
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise LocalFleetError(f"installing the local fleet image from {REQUIREMENTS} failed")
    for path in [image_dir(), *image_dir().parents]:
        if path == Path("/"):
            break
        path.chmod(path.stat().st_mode | 0o755)
    return python
