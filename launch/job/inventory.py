"""Where a job can run: one ``Inventory`` of ``Host`` entries, whatever provided the machines.

Three sources feed the same model, so everything downstream (plans, SSH, sync) is written once:
  * the local fleet (``launch.fleets.localfleet`` writes a static inventory file for itself),
  * a static YAML inventory of a lab's existing machines,
  * a Pulumi stack's outputs (the contract in ``fleetrun_contract.stack_outputs``).

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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetrun_contract.stack_outputs import StackOutputs
from launch.errors import SpecError
from launch.job.validation import describe_validation_error, load_yaml_mapping

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
    bucket: str | None = None
    cluster_id: str | None = None
    stack: str | None = Field(default=None, description="Pulumi stack name, for tearing a cloud fleet down.")
    cloud: str | None = Field(default=None, description="'aws' or 'gcp' for stack fleets (bucket uploads).")
    teardown: str = Field(
        default="none",
        description="How the machines go away: 'local-fleet', 'pulumi-stack' or 'none' (lab machines).",
    )

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

    @classmethod
    def from_static_yaml(cls, path: str | Path) -> Inventory:
        """A lab's existing machines::

        defaults: {user: alice, key: ~/.ssh/id_ed25519, port: 22}
        hosts:
          - {name: gpu1, address: 192.0.2.10, private_address: 10.1.0.10, gpus: 8,
             host_key: "ssh-ed25519 AAAA..."}
        """
        path = Path(path)
        data = load_yaml_mapping(path, "inventory")
        defaults = data.pop("defaults", {}) or {}
        if not isinstance(defaults, dict):
            raise SpecError(f"{path}: field 'defaults': expected a mapping")
        hosts = data.get("hosts")
        if isinstance(hosts, list):
            merged = []
            for entry in hosts:
                merged.append({**defaults, **entry} if isinstance(entry, dict) else entry)
            data["hosts"] = merged
        for entry in data.get("hosts") or []:
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                key = Path(entry["key"]).expanduser()
                entry["key"] = key if key.is_absolute() else (path.parent / key).resolve()
        data.setdefault("source", str(path))
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(describe_validation_error(str(path), exc)) from None

    @classmethod
    def from_stack_outputs(cls, data: dict[str, Any], key_path: Path | None = None) -> Inventory:
        """Hosts from ``pulumi stack output --json --show-secrets`` (see ``fleetrun_contract.stack_outputs``).

        ``key_path`` is the operator's private key; when the stack generated the key pair it is
        in the outputs (a secret) and the caller writes it to a 0600 file first.
        """
        try:
            outputs = StackOutputs.model_validate(data)
        except ValidationError as exc:
            raise SpecError(describe_validation_error("stack outputs", exc)) from None
        nodes = sorted(outputs.nodes, key=lambda n: n.rank)
        hosts = [
            Host(
                name=n.name,
                address=n.public_ip or n.private_ip,
                private_address=n.private_ip,
                user=n.user or outputs.ssh_user,
                port=n.port,
                key=key_path,
                host_key=n.host_key,
                gpus=n.gpus,
                instance_type=n.instance_type,
            )
            for n in nodes
        ]
        return cls(
            hosts=hosts,
            source=f"stack {outputs.cluster_id} ({outputs.cloud} {outputs.region})",
            cloud=outputs.cloud,
            bucket=outputs.bucket,
            cluster_id=outputs.cluster_id,
            teardown="pulumi-stack",
        )

    @classmethod
    def from_stack_outputs_file(cls, path: str | Path, key_path: Path | None = None) -> Inventory:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError(f"{path}: cannot read stack outputs JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError(f"{path}: expected a JSON object of stack outputs")
        return cls.from_stack_outputs(data, key_path)

    def to_yaml_data(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())
