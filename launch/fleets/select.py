"""Turn the ``--inventory`` argument into an ``Inventory``: the one place that knows the selectors.

Kept apart from ``launch.cli.app`` so light commands (``fab exec``) load an inventory without
importing the whole launch pipeline: their start-up time is part of what they cost at 64 nodes.
"""

from __future__ import annotations

import os
from pathlib import Path

from launch.errors import SpecError
from launch.fleets.localfleet import LocalFleet
from launch.job.inventory import Inventory
from launch.job.validation import load_json_mapping

DEFAULT_LOCAL_PREFIX = "fr"


def local_fleet(prefix: str | None = None, subnet: int | None = None) -> LocalFleet:
    prefix = prefix or os.environ.get("FLEETRUN_LOCAL_PREFIX") or DEFAULT_LOCAL_PREFIX
    if subnet is None:
        subnet = int(os.environ.get("FLEETRUN_LOCAL_SUBNET", "0"))
    return LocalFleet(prefix=prefix, subnet=subnet)


def load_inventory(selector: str | None, save_keys: bool = True) -> Inventory:
    """``local`` / ``local:<prefix>`` (default), ``stack:<name>``, a ``.json`` of stack outputs, or a YAML inventory.

    ``save_keys=False`` (``--dry-run``): a stack's generated operator key is not written.
    """
    selector = selector or "local"
    if selector == "local" or selector.startswith("local:"):
        prefix = selector.split(":", 1)[1] if ":" in selector else None
        return local_fleet(prefix).inventory()
    if selector.startswith("stack:"):
        from launch.fleets.cloud_stack import stack_inventory  # lazy: only cloud users need Pulumi

        return stack_inventory(selector.split(":", 1)[1])
    path = Path(selector)
    if not path.exists():
        raise SpecError(
            f"inventory {selector!r}: no such file (expected 'local', 'stack:<name>', a .json or .yaml file)"
        )
    if path.suffix == ".json":
        return stack_outputs_file_inventory(path, save_keys)
    return Inventory.from_static_yaml(path)


def stack_outputs_file_inventory(path: Path, save_key: bool = True) -> Inventory:
    """``--inventory out.json``: the outputs are validated first, then the stack's generated
    operator key (``ssh_private_key``) is saved 0600 like ``fab up`` saves it, and used."""
    from launch.fleets.cloud_stack import save_operator_key

    inventory = Inventory.from_stack_outputs_file(path)
    if not save_key:
        return inventory
    data = load_json_mapping(path, "stack outputs")
    key_path = save_operator_key(data)
    return inventory if key_path is None else Inventory.from_stack_outputs(data, key_path)
