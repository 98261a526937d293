"""Cluster-internal SSH: a key the head node uses to reach its workers, for launchers that SSH themselves.

``horovodrun`` starts the remote ranks by SSHing from the head to every other host. The operator's
key never leaves the operator's machine, so each cluster (an inventory, by its fingerprint) gets a
key pair of its own, generated once on the operator's machine under
``fleetrun_home()/cluster_keys/<fingerprint>/`` and shipped as plan files:

* the head gets the private key, a known_hosts file holding the workers' *pinned* host keys (the
  same keys the operator's connection pins, listed under the workers' private addresses), an
  ``ssh_config`` with each worker's user and port, and an ``ssh`` wrapper that forces strict
  checking. Nothing is learned by ``ssh-keyscan`` or trust on first use.
* each worker authorizes the public key only from the head's private address, with forwarding,
  PTYs and ``~/.ssh/rc`` disabled: the key can run commands from the head and nothing else.

Why a wrapper: horovodrun 0.28.1 builds its command as
``ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no HOST -p PORT -i KEY CMD``
(``horovod/runner/util/remote.py``), and OpenSSH keeps the first value it gets for an option, so
no config file can undo ``StrictHostKeyChecking=no``. A wrapper named ``ssh`` first on the head's
``PATH`` (horovodrun runs it through the shell) puts ``StrictHostKeyChecking=yes`` and the pinned
known_hosts *before* horovodrun's options, so they win; the wrapper also selects fleetrun's config
with ``-F``, so the head user's own ``~/.ssh/config`` plays no part.

Everything but key generation and loading is pure: plans are built from these strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from launch.job.inventory import Host, Inventory
from launch.paths import fleetrun_home
from launch.planning.plan import RemoteFile

CLUSTER_DIR = ".fleetrun/cluster"
PRIVATE_KEY = f"{CLUSTER_DIR}/id_ed25519"
KNOWN_HOSTS = f"{CLUSTER_DIR}/known_hosts"
SSH_CONFIG = f"{CLUSTER_DIR}/ssh_config"
BIN_DIR = f"{CLUSTER_DIR}/bin"
SSH_WRAPPER = f"{BIN_DIR}/ssh"
# Options on the workers' authorized_keys line: the key may run commands, from the head only.
KEY_RESTRICTIONS = "no-agent-forwarding,no-port-forwarding,no-X11-forwarding,no-pty,no-user-rc"


@dataclass(frozen=True)
class ClusterKey:
    """An ed25519 key pair for one cluster. ``tag`` (the public key's comment) names the cluster."""

    private_key: str
    public_key: str
    tag: str


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
    return f"fleetrun-cluster:{inventory.fingerprint()}"


def cluster_key_dir(inventory: Inventory) -> Path:
    return fleetrun_home() / "cluster_keys" / inventory.fingerprint()


def load_or_create_cluster_key(inventory: Inventory) -> ClusterKey:
    """The inventory's cluster key, generated on first use and kept (0600) for later runs.

    Kept, not regenerated per run, so a re-run finds the workers' authorized_keys already right.
    Generated in-process (``cryptography``, which paramiko already needs), so no ``ssh-keygen``.
    """
    directory = cluster_key_dir(inventory)
    private_path = directory / "id_ed25519"
    public_path = directory / "id_ed25519.pub"
    tag = cluster_tag(inventory)
    if not (private_path.exists() and public_path.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        private_text, public_text = new_ed25519_keypair()
        tmp = private_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(private_text)
        tmp.replace(private_path)
        public_path.write_text(f"{public_text} {tag}\n")
    public = " ".join(public_path.read_text().split()[:2])
    return ClusterKey(private_key=private_path.read_text(), public_key=f"{public} {tag}", tag=tag)


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
    return f'from="{head.private_address}",{KEY_RESTRICTIONS} {key.public_key}'


def authorize_script(key: ClusterKey, head: Host) -> str:
    """Shell run on a worker before its setup: authorize the cluster key, idempotently.

    Runs on every run (not behind the setup hash), so a lost or edited authorized_keys is put
    right. A line of the same cluster (same tag) with other content is replaced, others are kept.
    """
    line = authorized_key_line(key, head).replace("'", "'\"'\"'")
    tag = key.tag
    return "\n".join(
        [
            "# fleetrun: let the head node's launcher (horovodrun) in, from its private address only",
            "set -e",
            f"CLUSTER_KEY='{line}'",
            'AK="$HOME/.ssh/authorized_keys"',
            'mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh" && touch "$AK" && chmod 600 "$AK"',
            'if ! grep -qxF "$CLUSTER_KEY" "$AK"; then',
            f'    {{ grep -vF " {tag}" "$AK" || true; echo "$CLUSTER_KEY"; }} > "$AK.fleetrun-tmp"',
            '    chmod 600 "$AK.fleetrun-tmp" && mv "$AK.fleetrun-tmp" "$AK"',
            "    echo FLEETRUN_CLUSTER_KEY=installed",
            "fi",
            "",
        ]
    )
