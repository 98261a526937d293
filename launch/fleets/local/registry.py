"""The local fleet's image registry (``fab local.up --containers --registry``): Debian's
``docker-registry`` (the CNCF Distribution server) on the fleet's bridge, so the nodes pull an
image over the network as a lab's machines pull from the lab's registry, instead of finding it
in the shared store (``launch.fleets.local.containers``) where a pull answers at once.

It listens on the bridge's address (``FleetNames.gateway``: the nodes and this machine reach it,
nothing outside), port ``PORT`` when that is free there, else any free one, and speaks plain
HTTP: the bridge never leaves this machine and the registry holds nothing secret, and plain HTTP
is what most lab registries on an internal network speak, so the nodes take the path such a lab
configures (the registry marked insecure in each node's ``registries.conf``), and the pull figure
carries no TLS cost a lab's plain-HTTP registry would not have. The mark is a drop-in in each
node's own ``/etc/containers/registries.conf.d`` (``drop_in``), which goes with the node. Anyone on
this machine may push to it (no login): it is a test machine's registry, like the fleet's sshd.

It serves as ``nobody`` (``setpriv``; a flaw in it reached from a node is not root), its
configuration and storage in ``registry_dir(prefix)``, recorded in the fleet's state
(``registry_dir``) before it is made, so ``down`` kills the server (pid file, confirmed by its
command line) and removes the folder with every image pushed into it. ``LocalFleet.up`` puts
the fleet's test image in as ``fleetrun-test:latest`` (``launch.fleets.local.image_push``).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from launch.errors import LocalFleetError
from launch.fleets.local import daemon
from launch.fleets.local.bucket import free_port
from launch.fleets.local.naming import FleetNames

REGISTRY_BIN = "/usr/bin/docker-registry"
REGISTRY_ROOT = Path("/var/tmp")
PORT = 5000
"""The registry's port on the bridge's address when free there (each fleet has its own address)."""
PID_FILE = "registry.pid"
LOG_FILE = "registry.log"
ADDRESS_FILE = "registry.address"
SERVER_USER = "nobody"
START_TIMEOUT_S = 60.0
TEST_REPOSITORY = "fleetrun-test"
DROP_IN = "90-fleetrun-fleet-registry.conf"
"""Each node's ``/etc/containers/registries.conf.d`` file marking the registry insecure."""


def have_registry() -> bool:
    return os.access(REGISTRY_BIN, os.X_OK)


DIR_PREFIX = "fleetrun-registry-"
MARK = ".fleetrun-registry"
"""Written first into the folder ``start`` made: its fleet's prefix (``remove_dir`` checks it)."""


def registry_dir(prefix: str, root: Path = REGISTRY_ROOT) -> Path:
    """The fleet's registry folder: its configuration and its storage."""
    return root / f"{DIR_PREFIX}{prefix}"


def config_text(listen: str, storage: Path) -> str:
    """The server's whole configuration: plain HTTP on ``listen`` (``host:port``), images under
    ``storage``, no login, no access log (a pull of a 1 GB image logs a line per request)."""
    return (
        "version: 0.1\n"
        "log: {level: warn, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: '{storage}'}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '{listen}'}}\n"
    )


def registries_conf(location: str) -> str:
    """A ``registries.conf`` drop-in that lets the nodes' podman use ``location`` over plain HTTP."""
    return f'# fleetrun local fleet: its own registry, plain HTTP\n[[registry]]\nlocation = "{location}"\ninsecure = true\n'


def drop_in(node_etc: Path, location: str) -> None:
    """Mark ``location`` insecure in one node's own ``/etc/containers`` (``node_etc``: its
    ``/etc/netns/<ns>`` folder, which its sshd's sessions see as ``/etc``)."""
    folder = node_etc / "containers" / "registries.conf.d"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DROP_IN).write_text(registries_conf(location))


def answers(location: str) -> bool:
    """The registry's API root says it speaks the Distribution API (``GET /v2/`` -> 200)."""
    import urllib.error
    import urllib.request  # here: ``--inventory local`` imports this module for every command

    try:
        with urllib.request.urlopen(f"http://{location}/v2/", timeout=2) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def start(names: FleetNames, address: str, root: Path = REGISTRY_ROOT) -> str:
    """Start the fleet's registry on ``address``; its ``host:port``. The caller has recorded
    ``registry_dir`` in the fleet's state (write-ahead); a folder there already is refused."""
    if not have_registry():
        raise LocalFleetError(f"--registry needs {REGISTRY_BIN} (Debian's docker-registry; make system-deps)")
    folder = registry_dir(names.prefix, root)
    if os.path.lexists(folder):
        raise LocalFleetError(
            f"--registry: {folder} exists and is not this fleet's; remove it or choose another prefix"
        )
    folder.mkdir(mode=0o755)  # exclusive: a folder made meanwhile by anyone else is refused here
    (folder / MARK).write_text(names.prefix + "\n")
    storage = folder / "storage"
    storage.mkdir(mode=0o700)
    entry = pwd.getpwnam(SERVER_USER)
    os.chown(storage, entry.pw_uid, entry.pw_gid)
    port = free_port(address, PORT)
    location = f"{address}:{port}"
    config = folder / "config.yml"
    config.write_text(config_text(location, storage))
    config.chmod(0o644)
    argv = [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--no-new-privs",
        REGISTRY_BIN,
        "serve",
        str(config),
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    daemon.start(
        names.state_dir,
        argv,
        PID_FILE,
        LOG_FILE,
        lambda: answers(location),
        START_TIMEOUT_S,
        f"the fleet's registry on {location}",
        cwd=folder,
        env=env,
    )
    (names.state_dir / ADDRESS_FILE).write_text(location + "\n")
    return location


def location_of(names: FleetNames) -> str | None:
    """The fleet's registry ``host:port`` (None when the fleet has none)."""
    try:
        text = (names.state_dir / ADDRESS_FILE).read_text()[:100].strip()
    except OSError:
        return None
    return text or None


def test_image(names: FleetNames) -> str:
    """The reference the nodes pull the test image by, from the fleet's registry."""
    location = location_of(names)
    if location is None:
        raise LocalFleetError(
            f"local fleet {names.prefix} has no registry (fab local.up --containers --registry)"
        )
    return f"{location}/{TEST_REPOSITORY}:latest"


def server_pids(names: FleetNames, root: Path = REGISTRY_ROOT) -> list[int]:
    """The fleet's registry, by its pid file, confirmed by its command line (this binary serving
    this fleet's configuration): a pid reused by another process is not it."""
    try:
        pid = int((names.state_dir / PID_FILE).read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return []
    config = str(registry_dir(names.prefix, root) / "config.yml").encode()
    return [pid] if argv[:3] == [REGISTRY_BIN.encode(), b"serve", config] else []


def remove_dir(folder: Path) -> None:
    """The registry's folder and every image in it, when fleetrun made it: its mark names the
    folder's own prefix (recorded write-ahead, the folder may be another's when ``start`` refused
    it: then it is left, and ``leftovers`` says so). A link is never followed nor removed."""
    if folder.is_symlink() or not folder.is_dir():
        return
    try:
        mark = (folder / MARK).read_text()[:100].strip()
    except OSError:
        return
    if mark == folder.name.removeprefix(DIR_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)
