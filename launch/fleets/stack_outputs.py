"""A stack's outputs (``pulumi stack output --json --show-secrets``) as an ``Inventory``.

Pure validation, no Pulumi: the stack fleet kind (``launch.fleets.kinds.stack``), the stack
program's driver (``launch.fleets.cloud_stack``) and the node replacement
(``launch.fleets.stack_replace``) all read outputs through it, and it imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleetrun_contract.stack_outputs import StackOutputs
from launch.errors import SpecError
from launch.job.fleet_refs import StackFleetRef
from launch.job.inventory import Host, Inventory
from launch.job.validation import describe_validation_error, printable


def inventory_from_stack_outputs(
    data: dict[str, Any], key_path: Path | None = None, stack: str | None = None
) -> Inventory:
    """Hosts from ``pulumi stack output --json --show-secrets`` (see ``fleetrun_contract.stack_outputs``).

    ``key_path`` is the operator's private key; when the stack generated the key pair it is in
    the outputs (a secret) and the caller writes it to a 0600 file first.
    """
    try:
        outputs = StackOutputs.model_validate(data)
        fleet = StackFleetRef(
            stack=stack, cluster_id=outputs.cluster_id, cloud=outputs.cloud, bucket=outputs.bucket or None
        )
    except ValidationError as exc:
        raise SpecError(describe_validation_error("stack outputs", exc)) from None
    nodes = sorted(outputs.nodes, key=lambda n: n.rank)
    hosts = []
    for n in nodes:
        try:  # each node is checked as a Host (user, addresses, host key), naming the node
            hosts.append(
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
            )
        except ValidationError as exc:
            where = f"stack outputs, node {printable(n.name, 80)!r}"
            raise SpecError(describe_validation_error(where, exc)) from None
    return Inventory(
        hosts=hosts, source=f"stack {outputs.cluster_id} ({outputs.cloud} {outputs.region})", fleet=fleet
    )


TRUSTED_OUTPUTS_DIR = "trusted-outputs"


def _trust_dir() -> Path:
    from launch.paths import fleetrun_home

    return fleetrun_home() / TRUSTED_OUTPUTS_DIR


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def record_written_outputs(path: Path, data: bytes) -> None:
    """Note that fleetrun wrote ``data`` to the outputs file ``path`` (``fab up --outputs``): its
    SHA-256, as a file name under ``$FLEETRUN_HOME/trusted-outputs`` (0700), holding the path for
    people. Only those exact bytes are trusted later: an edited copy is another file. The digest is
    of the bytes written, not of a read back (which could be another file by then)."""
    import os

    where = _trust_dir()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    note = where / _digest(data)
    fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{path.resolve()}\n")


def written_by_fleetrun(data: bytes) -> bool:
    return (_trust_dir() / _digest(data)).is_file()
