"""One SSH endpoint of an inventory, validated: a ``Host`` (a machine fleetrun runs on) and a
``JumpHost`` (a login node in front of hosts), each with its pinned host key.

Below ``launch.job.fleet_refs`` and ``launch.job.inventory``: a fleet reference may hold pinned
endpoints of its own (a Slurm cluster's login host and the nodes it may give), and the inventory
holds both; ``launch.job.inventory`` re-exports these names, where callers import them from.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from fleetrun_contract.keys import PUBLIC_KEY_RE

HOST_KEY_RE = PUBLIC_KEY_RE
HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
"""A POSIX user name (portable characters, not starting with '-'): it goes into ssh_config and argv."""
INTERFACE_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
PRINTABLE_RE = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,4096}")


def bracketed(address: str) -> str:
    """The address as it must be written when a port or path follows: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


def host_port(address: str, port: int) -> str:
    """``host:port`` (``[v6]:port`` for IPv6), for endpoints such as torchrun's ``--rdzv-endpoint``."""
    return f"{bracketed(address)}:{port}"


def _ssh_strings(blob: bytes) -> list[bytes]:
    """The length-prefixed strings of an SSH public-key blob (RFC 4253 6.6); ValueError when malformed."""
    fields, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ValueError("truncated")
        size = int.from_bytes(blob[i : i + 4], "big")
        if i + 4 + size > len(blob):
            raise ValueError("truncated")
        fields.append(blob[i + 4 : i + 4 + size])
        i += 4 + size
    return fields


def check_host_key_blob(key_type: str, blob_b64: str) -> None:
    """Refuse a pinned key whose blob is not a well-formed key of its declared type.

    paramiko drops such a line from known_hosts without a word, and the host then reads as
    having no pinned key at all; saying so here names the inventory line instead.
    """
    try:
        blob = base64.b64decode(blob_b64, validate=True)
        fields = _ssh_strings(blob)
    except (binascii.Error, ValueError):
        raise ValueError(
            "the host key's base64 blob is truncated or corrupt (copy the whole line of the .pub file)"
        ) from None
    embedded = fields[0].decode("ascii", "replace") if fields else ""
    if embedded != key_type:
        raise ValueError(f"the host key is declared {key_type} but its blob holds a {embedded[:40]!r} key")
    expected = {"ssh-ed25519": 2, "ssh-rsa": 3}.get(key_type, 3)
    if len(fields) != expected or (key_type == "ssh-ed25519" and len(fields[1]) != 32):
        raise ValueError("the host key's blob is truncated or corrupt (copy the whole line of the .pub file)")
    if key_type.startswith("ecdsa-") and fields[1].decode("ascii", "replace") != key_type.rsplit("-", 1)[1]:
        raise ValueError(f"the host key's blob names curve {fields[1][:20]!r}, not {key_type}'s")


MAX_GPUS = 1024


class SshEndpoint(BaseModel):
    """What any SSH hop needs: where, as whom, with which key, and the pinned host key.

    Shared by ``Host`` and ``JumpHost``, so a jump host is validated exactly like a host.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    """How this machine reaches the host: an IP address (IPv6 without brackets or scope id) or a DNS name."""
    user: str
    """The login user (a POSIX user name)."""
    port: Annotated[int, Strict()] = Field(default=22, ge=1, le=65535)
    """The sshd port."""
    key: Path | None = None
    """The private key file to log in with (default: the SSH agent and ``~/.ssh`` keys)."""
    host_key: str
    """The host's public host key, pinned: ``ssh-ed25519 AAAA...`` as in ``/etc/ssh/ssh_host_ed25519_key.pub`` on the machine. Never learned; a different key is refused."""

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not USER_RE.fullmatch(value):
            raise ValueError(
                "expected a POSIX user name (letters, digits, '_', '.', '-'; at most 32 characters)"
            )
        return value

    @field_validator("key")
    @classmethod
    def _key_path(cls, value: Path | None) -> Path | None:
        if value is not None and "${" in str(value):
            raise ValueError(
                "a key path holding '${': OpenSSH (rsync, fab ssh, ssh-config) would read it as an "
                "environment variable, and has no escape for it; rename the folder or the file"
            )
        return value

    @field_validator("address")
    @classmethod
    def _endpoint_address(cls, value: str) -> str:
        if not value:
            raise ValueError("expected an IP address or a DNS name")
        return check_address(value)

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, value: str) -> str:
        value = value.strip()
        if not HOST_KEY_RE.fullmatch(value):
            raise ValueError(
                "expected an OpenSSH public host key such as 'ssh-ed25519 AAAA...' "
                "(read it on the machine: cat /etc/ssh/ssh_host_ed25519_key.pub)"
            )
        key_type, blob = value.split()[:2]
        check_host_key_blob(key_type, blob)
        return f"{key_type} {blob}"

    @property
    def endpoint(self) -> tuple[str, int]:
        return (self.address, self.port)

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko look up in known_hosts for this address and port."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def known_hosts_line(self) -> str:
        return f"{self.known_hosts_name} {self.host_key}"


class JumpHost(SshEndpoint):
    """A bastion (login node) the laptop passes through to reach a host: ``proxy_jump``.

    Itself a pinned host: its own address, port, user, key and ``host_key`` (required, never
    learned; it goes into the same known_hosts file as the hosts' keys, and both hops are checked
    strictly). It is written out in full where it is used (per host or in ``defaults``), never
    referred to by a host's name: the address the laptop uses for a login node is often not the one
    it has as a compute host, and the pinned key stays visible at each use. It may be the same
    machine as a host of the inventory (the head serving as bastion); then its ``host_key`` must be
    that host's. A jump host has no jump host of its own (one hop, as most labs have).
    """

    @property
    def label(self) -> str:
        """How errors name the jump host: ``user@address:port``."""
        return f"{self.user}@{bracketed(self.address)}:{self.port}"


def check_address(value: str) -> str:
    """A DNS name, an IPv4 address, or an IPv6 address without scope id, written plainly.

    A scope id (``fe80::1%eth0``) is free text that would reach torchrun's and horovodrun's
    arguments and ``from="..."`` restrictions; link-local addresses are not a cluster network.
    """
    if not value or HOSTNAME_RE.fullmatch(value):
        return value
    if "%" in value:
        raise ValueError("IPv6 scope ids ('%...') are not supported; use a global or unique-local address")
    if value.startswith("["):
        raise ValueError("write an IPv6 address without brackets; fleetrun adds them where a port follows")
    try:
        return ipaddress.ip_address(value).compressed
    except ValueError:
        raise ValueError("expected an IP address or a DNS name") from None


class Host(SshEndpoint):
    """One machine fleetrun can SSH into.

    ``address`` is how this laptop reaches the host (through ``proxy_jump`` when one is given);
    ``private_address`` is how the nodes reach
    each other (rendezvous, NCCL/Gloo). ``gpus`` is None when unknown (then ``auto`` processes per
    node is resolved on the node with ``nvidia-smi``), a count, or a list of the device indices
    runs may use on a shared machine (exported as ``CUDA_VISIBLE_DEVICES``). ``interface`` is the cluster network
    interface, exported as ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``; when unknown it is found
    on the node from ``private_address``.
    """

    name: str
    """The node's name in fleetrun's output, records and run folders (letters, digits, '.', '-')."""
    private_address: str = ""
    """How the nodes reach each other (rendezvous, NCCL/Gloo); default: ``address``."""
    gpus: Annotated[int, Strict()] | list[Annotated[int, Strict()]] | None = None
    """GPUs: unknown (null: found with ``nvidia-smi``), a count, or the device indices runs may use on a shared machine (``[2, 3]``, exported as ``CUDA_VISIBLE_DEVICES``)."""
    interface: str | None = None
    """The cluster network interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``); default: found on the node from ``private_address``."""
    python: str = "python3"
    """The interpreter on the host that the job's environment is built from."""
    instance_type: str | None = Field(default=None, max_length=128)
    """The machine type, for prices and expected GPU counts (set by stacks; optional on lab machines)."""
    proxy_jump: JumpHost | None = None
    """A login node (bastion) to reach this host through, itself pinned with its own ``host_key``; ``null`` reaches the host directly."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not HOSTNAME_RE.fullmatch(value):
            raise ValueError("expected a host name (letters, digits, '.', '-')")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: int | list[int] | None) -> int | list[int] | None:
        """A count (0..1024), or the device indices this host lends to fleetrun's runs: unique,
        0..1023, at most 1024 of them (a shared lab machine: ``gpus: [2, 3]``)."""
        if value is None:
            return None
        if isinstance(value, int):
            if not 0 <= value <= MAX_GPUS:
                raise ValueError(f"expected a GPU count from 0 to {MAX_GPUS} or a list of device indices")
            return value
        if not value or len(value) > MAX_GPUS:
            raise ValueError(f"expected from 1 to {MAX_GPUS} device indices")
        if any(not 0 <= i < MAX_GPUS for i in value):
            raise ValueError(f"device indices go from 0 to {MAX_GPUS - 1}")
        if len(set(value)) != len(value):
            raise ValueError("device indices must be unique")
        return value

    @property
    def gpu_count(self) -> int | None:
        """GPUs fleetrun may use on this host (None: unknown, found on the node)."""
        return len(self.gpus) if isinstance(self.gpus, list) else self.gpus

    @property
    def gpu_indices(self) -> list[int] | None:
        """The device indices of a ``gpus: [..]`` list (``CUDA_VISIBLE_DEVICES``), else None: all."""
        return list(self.gpus) if isinstance(self.gpus, list) else None

    @field_validator("private_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_address(value)

    @field_validator("interface")
    @classmethod
    def _interface(cls, value: str | None) -> str | None:
        if value is not None and not INTERFACE_RE.fullmatch(value):
            raise ValueError(
                "expected a network interface name (at most 15 letters, digits, '_', '.', ':', '@', '-')"
            )
        return value

    @field_validator("python", "instance_type")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and not PRINTABLE_RE.fullmatch(value):
            raise ValueError("expected printable text (no control characters), at most 4096 characters")
        return value

    @model_validator(mode="after")
    def _default_private(self) -> Host:
        if not self.private_address:
            object.__setattr__(self, "private_address", self.address)
        return self

    def repinned(self, new: Host) -> Host:
        """This host once ``new`` took the place of the machine named ``new.name`` (a recovery's
        replacement): ``new`` itself, or this host with its ``proxy_jump`` key re-pinned when
        ``new`` is its jump host (one machine, one key: the old one must stay trusted nowhere)."""
        if self.name == new.name:
            return new
        jump = self.proxy_jump
        if jump is None or jump.endpoint != new.endpoint:
            return self
        return self.model_copy(update={"proxy_jump": jump.model_copy(update={"host_key": new.host_key})})

    def rsync_target(self, path: str) -> str:
        """``user@host:path`` for rsync and scp (``user@[v6]:path`` for IPv6)."""
        return f"{self.user}@{bracketed(self.address)}:{path}"
