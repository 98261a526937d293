"""Where a job can run: one ``Inventory`` of ``Host`` entries, whatever provided the machines.

Three sources feed the same model, so everything downstream (plans, SSH, sync) is written once:
  * the local fleet (``launch.fleets.localfleet`` writes an inventory file for itself),
  * a static YAML inventory of a lab's existing machines (untrusted: ``launch.fleets.kinds.lab``),
  * a Pulumi stack's outputs (the contract in ``launch.job.stack_outputs``).

Where the machines came from is ``Inventory.fleet``, a typed reference that only fleetrun's own
state can set to anything but ``LabFleet`` (see ``launch.fleets.kinds``).

Every host carries a pinned host key. fleetrun writes a known_hosts file from those keys and
connects with strict checking: no trust on first use, ever.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from launch.errors import SpecError
from launch.fleets.kinds.refs import FleetRef, LabFleet
from launch.job.validation import describe_validation_error

HOST_KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$")
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


class Host(BaseModel):
    """One machine fleetrun can SSH into.

    ``address`` is how this laptop reaches the host; ``private_address`` is how the nodes reach
    each other (rendezvous, NCCL/Gloo). ``gpus`` is None when unknown (then ``auto`` processes per
    node is resolved on the node with ``nvidia-smi``). ``interface`` is the cluster network
    interface, exported as ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``; when unknown it is found
    on the node from ``private_address``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    address: str
    private_address: str = ""
    user: str
    port: int = Field(default=22, ge=1, le=65535)
    key: Path | None = None
    host_key: str
    gpus: int | None = Field(default=None, ge=0)
    interface: str | None = None
    python: str = "python3"
    instance_type: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not HOSTNAME_RE.match(value):
            raise ValueError("expected a host name (letters, digits, '.', '-')")
        return value

    @field_validator("address", "private_address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and not HOSTNAME_RE.match(value):
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError("expected an IP address or a DNS name") from None
        return value

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, value: str) -> str:
        value = value.strip()
        if not HOST_KEY_RE.match(value):
            raise ValueError(
                "expected an OpenSSH public host key such as 'ssh-ed25519 AAAA...' "
                "(read it on the machine: cat /etc/ssh/ssh_host_ed25519_key.pub)"
            )
        return " ".join(value.split()[:2])

    @model_validator(mode="after")
    def _default_private(self) -> Host:
        if not self.private_address:
            object.__setattr__(self, "private_address", self.address)
        return self

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko look up in known_hosts for this address and port."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def known_hosts_line(self) -> str:
        return f"{self.known_hosts_name} {self.host_key}"


class Inventory(BaseModel):
    """An ordered set of hosts; the first host is the head (rendezvous endpoint, rank 0 node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: list[Host] = Field(min_length=1)
    source: str = "inline"
    fleet: FleetRef = Field(default_factory=LabFleet)
    """Where the machines came from; decides power-off, bucket uploads and teardown."""

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        seen_names: set[str] = set()
        seen_endpoints: set[tuple[str, int]] = set()
        for i, host in enumerate(self.hosts):
            if host.name in seen_names:
                raise ValueError(f"hosts[{i}]: duplicate host name {host.name!r}")
            endpoint = (host.address, host.port)
            if endpoint in seen_endpoints:
                raise ValueError(f"hosts[{i}] ({host.name}): duplicate address {host.address}:{host.port}")
            seen_names.add(host.name)
            seen_endpoints.add(endpoint)
        return self

    @property
    def head(self) -> Host:
        return self.hosts[0]

    def first(self, count: int) -> Inventory:
        """The first ``count`` hosts (head first), or a clear error when there are fewer."""
        if count > len(self.hosts):
            raise SpecError(
                f"the job asks for {count} nodes but inventory {self.source} has only {len(self.hosts)} "
                f"({', '.join(h.name for h in self.hosts)})"
            )
        return self.model_copy(update={"hosts": self.hosts[:count]})

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    def write_known_hosts(self, path: Path) -> Path:
        """Write a known_hosts file holding exactly the pinned keys of this inventory.

        Written fresh each time (never appended to), so a key that is no longer pinned is no
        longer trusted.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(h.known_hosts_line() + "\n" for h in self.hosts))
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    # -- loaders -----------------------------------------------------------------------------
    # The loaders of each kind live with the kind (``launch.fleets.kinds``); these delegate.

    @classmethod
    def from_static_yaml(cls, path: str | Path) -> Inventory:
        """A lab's hosts.yaml (untrusted): ``launch.fleets.kinds.lab.load_lab_inventory``."""
        from launch.fleets.kinds.lab import load_lab_inventory

        return load_lab_inventory(path)

    @classmethod
    def from_stack_outputs(
        cls, data: dict[str, Any], key_path: Path | None = None, stack: str | None = None
    ) -> Inventory:
        """A stack's outputs: ``launch.fleets.kinds.stack.inventory_from_stack_outputs``."""
        from launch.fleets.kinds.stack import inventory_from_stack_outputs

        return inventory_from_stack_outputs(data, key_path, stack)

    @classmethod
    def from_stack_outputs_file(cls, path: str | Path, key_path: Path | None = None) -> Inventory:
        from launch.fleets.kinds.stack import load_outputs_file

        return load_outputs_file(path, key_path)

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
