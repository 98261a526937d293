"""What the container fleet tests ask of a node: its user's own podman, as a session on the node
has it (``node_podman``), and the containers it holds (``containers_on``). The image itself is the
local fleet's (``launch.fleets.local.container_image``)."""

from __future__ import annotations

import os
import shlex
import subprocess

from launch.fleets.local import LocalFleet


def node_podman(
    fleet: LocalFleet, i: int, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Node ``i``'s user's own podman, as a session on the node has it: in the namespaces of the
    node's sshd (its network, its /etc, the cgroup mounts its start script made). Not ``ip netns
    exec``, whose fresh mount namespace has no cgroups: podman's pause process, made by a user's
    first podman call and joined by every later one, would keep that namespace, and no container
    of the user could start after it. A node powered off (its sshd gone) is asked through ``ip
    netns exec`` (enough to list or remove; nothing starts on it any more)."""
    user = fleet.node_name(i)
    command = "cd && podman " + " ".join(shlex.quote(a) for a in args)
    try:
        sshd = int((fleet.node_dir(i) / "sshd.pid").read_text().split()[0])
        if not os.path.exists(f"/proc/{sshd}/ns/uts"):  # gone, or a zombie (it has no namespaces)
            raise OSError(f"no sshd {sshd}")
        enter = ["nsenter", "-t", str(sshd), "-m", "-n", "-u"]
    except (OSError, ValueError, IndexError):
        enter = ["ip", "netns", "exec", fleet.netns(i)]
    return subprocess.run(
        [*enter, "su", "-s", "/bin/sh", user, "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def containers_on(fleet: LocalFleet, i: int) -> list[str]:
    """Every container (any state) of node ``i``'s user, as ``podman ps -a`` lists them."""
    done = node_podman(fleet, i, "ps", "-a", "--format", "{{.Names}}")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()
