"""The local fleet's power button: a root daemon that stops a node when the node asks.

On a cloud, the on-node watchdog ends billing by shutting its own instance down (the instance is
created with instance-initiated shutdown = terminate). A local-fleet node cannot stop its own
sshd or namespace (it is an unprivileged user), so it writes ``~/.fleetrun/poweroff-request``
and this daemon, started by ``LocalFleet.up`` and stopped by ``down``, powers the node off:
every process of the node's user and the node's sshd are killed. The namespace and home stay
(like a stopped VM's disk) until ``local.down``.

The daemon runs as root and looks into homes its users control, so it follows no link: the
request is looked up under ``~/.fleetrun`` only when that is a real directory owned by the user,
and removed through that directory's descriptor. It serves only the fleet's own users.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import sys
import time
from pathlib import Path

import yaml

from launch.fleets.local import containers as local_containers
from launch.fleets.local.fleet import LocalFleet, remove_queue_folders
from launch.fleets.local.node import Shape, start_sshd
from launch.fleets.local.prereqs import run
from launch.job.inventory import Host, Inventory

REQUEST = "poweroff-request"


def take_request(user: str, home: str = "") -> bool:
    """True (and the request removed) when ``user`` asked for a power-off (in ``home``: a VM-mode
    node's own home directory, by default the user's)."""
    try:
        entry = pwd.getpwnam(user)
        where = os.path.join(home or entry.pw_dir, ".fleetrun")
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (KeyError, OSError):
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != entry.pw_uid:
            return False
        try:
            os.lstat(REQUEST, dir_fd=fd)
        except OSError:
            return False
        with contextlib.suppress(OSError):
            os.unlink(REQUEST, dir_fd=fd)
        return True
    finally:
        os.close(fd)


def serve(fleet: LocalFleet, interval: float = 0.5) -> None:
    while fleet.state_dir.exists():
        created = fleet.state.load()
        # per-node users (their own homes), or VM mode's one user (each node's home apart)
        asks = [(user, "", fleet.node_index(user)) for user in created["user"]]
        asks += [
            (fleet.vm_user, home, fleet.node_index(os.path.basename(home))) for home in created["node_home"]
        ]
        for user, home, index in asks:
            if index is None or not fleet.is_ours(user, created) or not take_request(user, home):
                continue
            fleet.stop_node(index)
            node_dir = fleet.node_dir(index)
            if node_dir.exists():
                (node_dir / "powered-off").write_text(f"{time.time()}\n")
            print(f"{time.strftime('%H:%M:%S')} powered off {user}", flush=True)
        time.sleep(interval)


def replace_node(fleet: LocalFleet, host: Host) -> Host:
    """A fresh machine in place of a lost node, as a cloud gives one: same name and address, an
    empty disk and a NEW host key (the operator must pin it again; the old one is refused).

    Whatever is left of the node is powered off first (its processes, its sshd), its home is
    emptied but for the operator's authorized key (what a new VM gets from its image and
    metadata), a new host key is generated, sshd starts again, and the fleet's own inventory
    file is rewritten with the new key (also where it pins the node as the others' jump host).
    Returns the new ``Host``. VM-mode nodes share one user and are refused (not ``is_ours``).
    A ``--containers`` node comes back as its image would give it: the user's ``storage.conf``
    naming the shared store, its sshd with the cgroup mounts, nothing of the old podman in /tmp.
    """
    index = fleet.node_index(host.name)
    created = fleet.state.load()
    if index is None or not fleet.is_ours(host.name, created):
        raise ValueError(f"{host.name} is not a node of local fleet {fleet.prefix}")
    fleet.stop_node(index)
    entry = pwd.getpwnam(host.name)
    home = entry.pw_dir
    # a new VM's /tmp is empty too: the old machine's run-hold entries (launch.planning.queue) would
    # otherwise hold it for the next run until their lease ran out, since the run that wrote them
    # could not remove them (the old host key is refused)
    remove_queue_folders(entry.pw_uid)
    containers = bool(created["mqueue"])  # a --containers fleet (its mqueue hold is recorded)
    if containers:  # and a pull's blobs: a new VM's /var/tmp is empty too
        local_containers.remove_tmp_of(entry.pw_uid)
        local_containers.remove_tmp_of(entry.pw_uid, Path("/var/tmp"))
    for name in os.listdir(home):
        if name == ".ssh":
            continue
        path = os.path.join(home, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    node_dir = fleet.node_dir(index)
    (node_dir / "powered-off").unlink(missing_ok=True)
    key = node_dir / "ssh_host_ed25519_key"
    for old in (key, key.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(key)])
    if containers:  # what the lab's image gives a new VM: its podman reads the shared store
        local_containers.user_storage_conf(Path(home), host.name)
    start_sshd(fleet, index, Shape(containers=containers))
    # only a bastion fleet records a route; ``fleet`` may carry subnet 0 (``LocalFleetKind.replace``):
    # the addresses come from the host's inventory entry
    fleet.wait_for_sshd({index: host}, bastion=bool(created["route"]))
    inventory = fleet.inventory()
    # the fleet's own entry, not the caller's copy: a head replaced before may have re-pinned its jump
    current = next((h for h in inventory.hosts if h.name == host.name), host)
    # validated, so the key is normalised as the inventory file's (ssh-keygen's comment dropped)
    new = Host.model_validate({**current.model_dump(), "host_key": key.with_suffix(".pub").read_text()})
    hosts = [h.repinned(new) for h in inventory.hosts]
    updated = inventory.model_copy(update={"hosts": hosts})
    Inventory.model_validate(updated.to_yaml_data())  # still a valid inventory before it is written
    tmp = fleet.inventory_path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(updated.to_yaml_data(), sort_keys=False))
    tmp.replace(fleet.inventory_path)
    return new


if __name__ == "__main__":
    serve(LocalFleet(prefix=sys.argv[1], subnet=int(sys.argv[2]) if len(sys.argv) > 2 else 0))
