"""Turn the ``--inventory`` argument into an ``Inventory``: the one place that knows the selectors.

Kept apart from ``launch.cli.app`` so light commands (``fab exec``) load an inventory without
importing the whole launch pipeline: their start-up time is part of what they cost at 64 nodes.
"""

from __future__ import annotations

from pathlib import Path

from launch.errors import SpecError
from launch.fleets.localfleet import LocalFleet
from launch.job.inventory import Inventory
from launch.settings import current


def local_fleet(prefix: str | None = None, subnet: int | None = None) -> LocalFleet:
    settings = current()
    return LocalFleet(
        prefix=prefix or settings.local_prefix, subnet=settings.local_subnet if subnet is None else subnet
    )


def load_inventory(selector: str | None) -> Inventory:
    """``local`` / ``local:<prefix>`` (default), ``stack:<name>``, a ``.json`` of stack outputs, or a YAML inventory."""
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
        return Inventory.from_stack_outputs_file(path)
    return Inventory.from_static_yaml(path)
