"""Where a job can run: one ``Inventory`` of ``Host`` entries, whatever provided the machines.

Three sources feed the same model, so everything downstream (plans, SSH, sync) is written once:
  * the local fleet (``launch.fleets.local`` writes an inventory file for itself),
  * a static YAML inventory of a lab's existing machines (untrusted: ``launch.fleets.kinds.lab``),
  * a Pulumi stack's outputs (the contract in ``fleetrun_contract.stack_outputs``).

Where the machines came from is ``Inventory.fleet``, a typed reference that only fleetrun's own
state can set to anything but ``LabFleet`` (see ``launch.fleets.kinds``).

Every host carries a pinned host key, and so does a host's jump host (``proxy_jump``: a login
node in front of the lab). fleetrun writes a known_hosts file from those keys and connects with
strict checking on every hop: no trust on first use, ever.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from fleetrun_contract.keys import PUBLIC_KEY_RE
from launch.errors import SpecError
from launch.job.fleet_refs import FleetRef, LabFleet
from launch.job.validation import describe_validation_error, load_yaml_mapping

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


def same_machine_address(address: str) -> str:
    """``address`` as the machine it names, for telling duplicates apart: an IP address in its
    one canonical spelling (``2001:DB8:0::1`` is ``2001:db8::1``), a DNS name in lower case
    without its trailing dot (DNS ignores case: ``GPU1.LAB.example`` is ``gpu1.lab.example``)."""
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address.rstrip(".").casefold()


class Inventory(BaseModel):
    """An ordered set of hosts; the first host is the head (rendezvous endpoint, rank 0 node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: list[Host] = Field(min_length=1)
    source: str = "inline"
    fleet: FleetRef = Field(default_factory=LabFleet)
    """Where the machines came from; decides power-off, bucket uploads and teardown."""

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        """No machine twice: host names compared without case (``gpu1``/``GPU1`` would share one
        run folder on a case-insensitive laptop disk), addresses as the machine they reach (DNS
        names without case or a trailing dot, IP addresses in one spelling): one machine listed
        twice would run two ranks."""
        seen_names: dict[str, str] = {}
        seen_endpoints: dict[tuple[str, int], str] = {}
        for i, host in enumerate(self.hosts):
            name = host.name.casefold()
            if name in seen_names:
                same = (
                    "" if seen_names[name] == host.name else f" (as {seen_names[name]!r}: names ignore case)"
                )
                raise ValueError(f"hosts[{i}]: duplicate host name {host.name!r}{same}")
            endpoint = (same_machine_address(host.address), host.port)
            if endpoint in seen_endpoints:
                first = seen_endpoints[endpoint]
                raise ValueError(
                    f"hosts[{i}] ({host.name}): duplicate address {host.address}:{host.port}"
                    + ("" if first == host.address else f" (the same machine as {first})")
                )
            seen_names[name] = host.name
            seen_endpoints[endpoint] = host.address
        self._check_jumps()
        return self

    def _check_jumps(self) -> None:
        """One pinned key per endpoint: a jump host that is also a host of this inventory (or
        the jump of several hosts) must carry the same ``host_key`` everywhere, or the
        known_hosts file would pin two keys for one address and accept either."""

        def machine(endpoint: tuple[str, int]) -> tuple[str, int]:  # LOGIN.lab is login.lab
            return same_machine_address(endpoint[0]), endpoint[1]

        pinned = {
            machine(h.endpoint): (f"hosts[{i}] ({h.name})", h.host_key) for i, h in enumerate(self.hosts)
        }
        for i, host in enumerate(self.hosts):
            jump = host.proxy_jump
            if jump is None:
                continue
            where = f"hosts[{i}] ({host.name}): field 'proxy_jump'"
            if machine(jump.endpoint) == machine(host.endpoint):
                raise ValueError(f"{where}: a host cannot be its own jump host ({jump.label})")
            seen = pinned.setdefault(machine(jump.endpoint), (f"{where} of {host.name}", jump.host_key))
            if seen[1] != jump.host_key:
                raise ValueError(
                    f"{where}: jump host {jump.label} is pinned with a host_key that differs from "
                    f"the one {seen[0]} gives for the same address and port; one machine has one key"
                )

    @property
    def head(self) -> Host:
        return self.hosts[0]

    def first(self, count: int) -> Inventory:
        """The first ``count`` hosts (head first), or a clear error when there are fewer."""
        if count > len(self.hosts):
            raise SpecError(
                f"playbook field 'nodes': the job asks for {count} nodes but inventory {self.source} "
                f"has only {len(self.hosts)} "
                f"({', '.join(h.name for h in self.hosts)})"
            )
        return self.model_copy(update={"hosts": self.hosts[:count]})

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    def write_known_hosts(self, path: Path) -> Path:
        """Write a known_hosts file holding exactly the pinned keys of this inventory: its hosts'
        and their jump hosts' (``proxy_jump``), each once.

        Written fresh each time (never appended to), so a key that is no longer pinned is no
        longer trusted.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = dict.fromkeys(h.known_hosts_line() for h in self.hosts)
        lines.update(dict.fromkeys(h.proxy_jump.known_hosts_line() for h in self.hosts if h.proxy_jump))
        # a temporary name of its own (0600 from the start): two runs of one inventory started at
        # once write the same file, and a shared ``.tmp`` was renamed away under the other one
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write("".join(line + "\n" for line in lines))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    # -- loaders -----------------------------------------------------------------------------
    # The loaders of each kind live with the kind (``launch.fleets.kinds``); these delegate.

    @classmethod
    def from_static_yaml(cls, path: str | Path) -> Inventory:
        """A lab's hosts.yaml (untrusted): ``load_lab_inventory``."""
        return load_lab_inventory(path)

    @classmethod
    def from_own_state(cls, path: Path) -> Inventory:
        """An inventory file fleetrun wrote itself (the local fleet's ``inventory.yaml``): trusted,
        so its ``fleet`` is kept. Callers reach it only through fleetrun's state directory."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            return cls.model_validate(data)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise SpecError(f"{path}: cannot read fleetrun's inventory file: {exc}") from None
        except ValidationError as exc:
            raise SpecError(describe_validation_error(str(path), exc)) from None

    def to_yaml_data(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


# -- the lab fleet kind's loader (``launch.fleets.kinds.lab`` re-exports it) ---------------------
# Pure parsing and validation of a file into an ``Inventory``: it lives with the inventory, so
# nothing here imports the fleet kinds above it.
ALLOWED_KEYS = ("defaults", "hosts")
REFUSED_KEYS = ("teardown", "stack", "cluster_id", "bucket", "cloud", "fleet")
"""Keys that only fleetrun's own state may set: they decide what is destroyed or powered off."""


def _resolve_key(entry: dict[str, object], path: Path) -> None:
    """``key: ~/...`` or relative to the inventory file, as an absolute path."""
    if isinstance(entry.get("key"), str):
        key_path = Path(str(entry["key"])).expanduser()
        entry["key"] = key_path if key_path.is_absolute() else (path.parent / key_path).resolve()


def load_lab_inventory(path: str | Path) -> Inventory:
    """A lab's existing machines (untrusted)::

    defaults: {user: alice, key: ~/.ssh/id_ed25519, port: 22,
               proxy_jump: {address: login.lab.example, user: alice, key: ~/.ssh/id_ed25519,
                            host_key: "ssh-ed25519 AAAA..."}}
    hosts:
      - {name: gpu1, address: 192.0.2.10, private_address: 10.1.0.10, gpus: 8,
         host_key: "ssh-ed25519 AAAA..."}

    ``proxy_jump`` (per host or in ``defaults``; ``proxy_jump: null`` on a host reaches it
    directly) is a pinned host of its own: see ``launch.job.inventory.JumpHost``.
    """
    path = Path(path)
    data = load_yaml_mapping(path, "inventory")
    for key in sorted(data, key=lambda k: k not in REFUSED_KEYS):  # the dangerous ones named first
        if key in REFUSED_KEYS:
            raise SpecError(
                f"{path}: field {key!r}: not allowed in a lab inventory (only fleetrun's own state says "
                "how machines go away; lab machines are never powered off or destroyed). Remove it; "
                "for the local fleet use --inventory local:<prefix>, for a stack stack:<name>"
            )
        if key not in ALLOWED_KEYS:
            raise SpecError(
                f"{path}: field {key!r}: unknown; a lab inventory has only 'defaults' and 'hosts'"
            )
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(f"{path}: field 'defaults': expected a mapping")
    hosts = data.get("hosts")
    if isinstance(hosts, list):
        hosts = [{**defaults, **entry} if isinstance(entry, dict) else entry for entry in hosts]
        for entry in hosts:
            if not isinstance(entry, dict):
                continue
            _resolve_key(entry, path)
            if isinstance(entry.get("proxy_jump"), dict):
                entry["proxy_jump"] = dict(entry["proxy_jump"])  # shared by every host from defaults
                _resolve_key(entry["proxy_jump"], path)
    try:
        fields: dict[str, object] = {"source": str(path), "fleet": LabFleet()}
        return Inventory.model_validate({**fields, "hosts": hosts} if "hosts" in data else fields)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(str(path), exc)) from None
