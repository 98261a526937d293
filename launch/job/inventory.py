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

import hashlib
import ipaddress
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from launch.errors import SpecError
from launch.job.endpoints import (  # noqa: F401 - re-exported: callers import them from here
    HOST_KEY_RE,
    HOSTNAME_RE,
    INTERFACE_RE,
    MAX_GPUS,
    PRINTABLE_RE,
    USER_RE,
    Host,
    JumpHost,
    SshEndpoint,
    bracketed,
    check_address,
    check_host_key_blob,
    host_port,
)
from launch.job.fleet_refs import FleetRef, LabFleet
from launch.job.known_hosts import write_known_hosts_lines
from launch.job.validation import describe_validation_error, load_yaml_mapping


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
        lines = [h.known_hosts_line() for h in self.hosts]
        lines += [h.proxy_jump.known_hosts_line() for h in self.hosts if h.proxy_jump]
        return write_known_hosts_lines(path, lines)

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
    return lab_inventory_from_mapping(path, load_yaml_mapping(path, "inventory"))


def lab_inventory_from_mapping(path: Path, data: dict[str, Any]) -> Inventory:
    """``load_lab_inventory`` of a file already read (another kind's file holds a lab inventory's
    ``defaults`` and ``hosts`` beside its own section): ``path`` names it in errors and resolves
    relative key paths."""
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
