"""Cluster-internal SSH: a key the head node uses to reach its workers, for launchers that SSH themselves.

``horovodrun`` starts the remote ranks by SSHing from the head to every other host. The operator's
key never leaves the operator's machine, so each run gets a key pair of its own, made in memory
when the plan is made and never written on the operator's machine (so ``--dry-run`` writes no
key), and shipped as plan files:

* the head gets the private key, a known_hosts file holding the workers' *pinned* host keys (the
  same keys the operator's connection pins, listed under the workers' private addresses), an
  ``ssh_config`` with each worker's user and port, and an ``ssh`` wrapper that forces strict
  checking. Nothing is learned by ``ssh-keyscan`` or trust on first use.
* each worker authorizes the public key only from the head's private address, until it expires
  (``expiry-time``), with forwarding, PTYs and ``~/.ssh/rc`` disabled: the key can run commands
  from the head and nothing else. The line goes on a line of its own and is noted in
  ``~/.fleetrun/cluster/authorized-line``.
* at the end of the run the wrap-up calls ``revoke_command`` on every node (``revoke_cluster_keys``):
  the noted line is removed by exact match and the head's cluster files are deleted. A run that
  never got there (the laptop lost power) leaves a line that expires by itself and that the next
  run's authorize step removes first, so lines never pile up.

Why a wrapper: horovodrun 0.28.1 builds its command as
``ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no HOST -p PORT -i KEY CMD``
(``horovod/runner/util/remote.py``), and OpenSSH keeps the first value it gets for an option, so
no config file can undo ``StrictHostKeyChecking=no``. A wrapper named ``ssh`` first on the head's
``PATH`` (horovodrun runs it through the shell) puts ``StrictHostKeyChecking=yes`` and the pinned
known_hosts *before* horovodrun's options, so they win; the wrapper also selects fleetrun's config
with ``-F``, so the head user's own ``~/.ssh/config`` plays no part.

Pure but for key generation (in memory): plans are built from these strings. Revoking the key on
the nodes is I/O and lives with the wrap-up's other node steps (``launch.run.artifacts``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from launch.job.inventory import Host, Inventory
from launch.planning.authorized_keys import add_command_for_variable, expiry_time, remove_recorded_command
from launch.planning.plan import RemoteFile

CLUSTER_DIR = ".fleetrun/cluster"
PRIVATE_KEY = f"{CLUSTER_DIR}/id_ed25519"
KNOWN_HOSTS = f"{CLUSTER_DIR}/known_hosts"
SSH_CONFIG = f"{CLUSTER_DIR}/ssh_config"
BIN_DIR = f"{CLUSTER_DIR}/bin"
SSH_WRAPPER = f"{BIN_DIR}/ssh"
AUTHORIZED_NOTE = ".fleetrun/cluster-authorized-line"
# Options on the workers' authorized_keys line: the key may run commands, from the head only.
KEY_RESTRICTIONS = "no-agent-forwarding,no-port-forwarding,no-X11-forwarding,no-pty,no-user-rc"
# horovodrun SSHes to the workers when it starts; the key outlives any sensible launch by far.
CLUSTER_KEY_VALID_S = 24 * 3600


@dataclass(frozen=True)
class ClusterKey:
    """An ed25519 key pair for one run. ``tag`` (the public key's comment) names the cluster and run;
    ``expires`` is the ``expiry-time`` of the workers' line (none: no expiry, for hand-made keys)."""

    private_key: str
    public_key: str
    tag: str
    expires: str = ""


def new_ed25519_keypair() -> tuple[str, str]:
    """(private key in OpenSSH PEM, public key ``ssh-ed25519 AAAA...``), made in-process."""
    key = Ed25519PrivateKey.generate()
    private_text = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public_text = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private_text, public_text


def cluster_tag(inventory: Inventory) -> str:
    return f"fleetrun-cluster:{inventory.fingerprint()}:{secrets.token_hex(4)}"


def new_cluster_key(inventory: Inventory, valid_for_s: float = CLUSTER_KEY_VALID_S) -> ClusterKey:
    """A fresh key for one run, in memory only: nothing is written on this machine.

    What the planner should call (the key then exists only inside the plan; the head receives it
    as a 0600 plan file at setup, and the wrap-up deletes it). Generated in-process
    (``cryptography``, which paramiko already needs), so no ``ssh-keygen``.
    """
    private_text, public_text = new_ed25519_keypair()
    tag = cluster_tag(inventory)
    return ClusterKey(private_text, f"{public_text} {tag}", tag, expires=expiry_time(valid_for_s))


def revoke_command() -> str:
    """Shell, for every node at the end of a run: remove the noted cluster line, and the head's key files."""
    return f'{remove_recorded_command(AUTHORIZED_NOTE)} && rm -rf "$HOME/{CLUSTER_DIR}"'


# -- pure pieces ---------------------------------------------------------------------------------


def known_hosts_name(host: Host) -> str:
    """How OpenSSH on the head looks a worker up: its private address (and port when not 22)."""
    return host.private_address if host.port == 22 else f"[{host.private_address}]:{host.port}"


def known_hosts_text(workers: list[Host]) -> str:
    """The workers' pinned host keys under their private addresses: exactly the keys the operator pins."""
    return "".join(f"{known_hosts_name(h)} {h.host_key}\n" for h in workers)


def ssh_config_text(workers: list[Host]) -> str:
    """Per-worker user and port (horovodrun's ``-H`` has no user), and strict settings for all.

    ``~`` in IdentityFile and UserKnownHostsFile is the head user's home, as OpenSSH expands it.
    """
    lines = ["# fleetrun: cluster-internal SSH from the head node to its workers (horovodrun)"]
    for h in workers:
        lines += [f"Host {h.private_address}", f"    User {h.user}", f"    Port {h.port}"]
    lines += [
        "Host *",
        f"    IdentityFile ~/{PRIVATE_KEY}",
        "    IdentitiesOnly yes",
        "    StrictHostKeyChecking yes",
        f"    UserKnownHostsFile ~/{KNOWN_HOSTS}",
        "    GlobalKnownHostsFile /dev/null",
        "    CheckHostIP no",
        "    BatchMode yes",
        "    PasswordAuthentication no",
        "    KbdInteractiveAuthentication no",
        "    ForwardAgent no",
        "    ConnectTimeout 10",
        "    LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


def ssh_wrapper_text() -> str:
    """``ssh`` for the head's launcher: fleetrun's config and strict checking, placed first so they win."""
    return f"""#!/bin/sh
# fleetrun: the ssh that horovodrun runs on the head node (first on its PATH).
# horovodrun passes -o StrictHostKeyChecking=no; OpenSSH keeps the first value of each option,
# so the strict options below, which come first, are the ones in force.
for real in /usr/bin/ssh /usr/local/bin/ssh /bin/ssh; do
    [ -x "$real" ] && break
done
exec "$real" -F "$HOME/{SSH_CONFIG}" \\
    -o StrictHostKeyChecking=yes \\
    -o UserKnownHostsFile="$HOME/{KNOWN_HOSTS}" \\
    -o GlobalKnownHostsFile=/dev/null \\
    -o BatchMode=yes \\
    -o IdentitiesOnly=yes \\
    -o IdentityFile="$HOME/{PRIVATE_KEY}" \\
    "$@"
"""


def head_files(key: ClusterKey, workers: list[Host]) -> tuple[RemoteFile, ...]:
    """What the head needs to SSH to its workers; the private key is secret (never printed)."""
    return (
        RemoteFile(PRIVATE_KEY, key.private_key, mode=0o600, secret=True),
        RemoteFile(KNOWN_HOSTS, known_hosts_text(workers), mode=0o644),
        RemoteFile(SSH_CONFIG, ssh_config_text(workers), mode=0o644),
        RemoteFile(SSH_WRAPPER, ssh_wrapper_text(), mode=0o755),
    )


def authorized_key_line(key: ClusterKey, head: Host) -> str:
    expiry = f',expiry-time="{key.expires}"' if key.expires else ""
    return f'from="{head.private_address}",{KEY_RESTRICTIONS}{expiry} {key.public_key}'


def authorize_script(key: ClusterKey, head: Host) -> str:
    """Shell run on a worker before its setup: authorize the cluster key, idempotently.

    Runs on every run (not behind the setup hash), so a lost or edited authorized_keys is put
    right. The line an earlier run noted (and did not revoke) is removed first; every other line
    is kept byte for byte (``launch.transport.authorized_keys``).
    """
    line = authorized_key_line(key, head).replace("'", "'\"'\"'")
    return "\n".join(
        [
            "# fleetrun: let the head node's launcher (horovodrun) in, from its private address only",
            "set -e",
            f"CLUSTER_KEY='{line}'",
            add_command_for_variable("CLUSTER_KEY", AUTHORIZED_NOTE),
            "",
        ]
    )
