"""Turn the ``--inventory`` argument into an ``Inventory``: the one place that knows the selectors.

Kept apart from ``launch.cli.app`` so light commands (``fab exec``) load an inventory without
importing the whole launch pipeline: their start-up time is part of what they cost at 64 nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launch.fleets.kinds.registry import load_inventory as load_by_kind
from launch.settings import current

if TYPE_CHECKING:
    from launch.fleets.local import LocalFleet
    from launch.job.inventory import Inventory


def local_fleet(prefix: str | None = None, subnet: int | None = None) -> LocalFleet:
    """The local fleet of this prefix and subnet (its machinery is imported only when asked for:
    ``fab exec --inventory lab.yaml`` never needs it)."""
    from launch.fleets.local import LocalFleet

    settings = current()
    return LocalFleet(
        prefix=prefix or settings.local_prefix, subnet=settings.local_subnet if subnet is None else subnet
    )


def load_inventory(selector: str | None, save_keys: bool = True) -> Inventory:
    """``local`` / ``local:<prefix>`` (default), ``stack:<name>``, a ``.json`` of stack outputs, or a
    lab YAML inventory: each selector belongs to one fleet kind (``launch.fleets.kinds.registry``).
    ``save_keys=False`` (``--dry-run``): a stack's generated operator key is not written."""
    return load_by_kind(selector or "local", save_keys)
