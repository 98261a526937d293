"""Fleet kinds by name: from an inventory's fleet reference to its ``FleetKind``, and from an
``--inventory`` selector to the loader of the kind that owns it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.errors import SpecError
from launch.fleets.kinds import lab, local, stack
from launch.fleets.kinds.base import FleetKind
from launch.fleets.kinds.refs import FleetRef

if TYPE_CHECKING:
    from launch.job.inventory import Inventory

KINDS: dict[str, Callable[[Any], FleetKind]] = {
    lab.LabKind.name: lab.LabKind,
    local.LocalFleetKind.name: local.LocalFleetKind,
    stack.StackKind.name: stack.StackKind,
}
"""Kind name (the reference's ``kind``) -> the class built from that reference."""

SELECTORS: dict[str, Callable[[str | None, bool], Inventory]] = {
    local.SELECTOR: local.load_local_inventory,
    stack.SELECTOR: stack.load_stack_inventory,
}
"""``--inventory NAME[:ARG]`` -> the trusted loader of fleetrun's own state for that kind."""

FILE_LOADERS: dict[str, Callable[[Path, bool], Inventory]] = {stack.OUTPUTS_SUFFIX: stack.load_outputs_file}
"""File suffix -> loader; any other file is a lab inventory (the untrusted loader)."""


def fleet_kind(ref: FleetRef) -> FleetKind:
    return KINDS[ref.kind](ref)


def load_inventory(selector: str, save_keys: bool = True) -> Inventory:
    """``local`` / ``local:<prefix>``, ``stack:<name>``, a ``.json`` of stack outputs, or a lab YAML.

    ``save_keys=False`` (``--dry-run``): a stack's generated operator key is not written.
    """
    name, _, arg = selector.partition(":")
    if name in SELECTORS:
        return SELECTORS[name](arg or None, save_keys)
    path = Path(selector)
    if not path.exists():
        raise SpecError(
            f"inventory {selector!r}: no such file (expected 'local', 'stack:<name>', a .json or .yaml file)"
        )
    loader = FILE_LOADERS.get(path.suffix)
    return loader(path, save_keys) if loader else lab.load_lab_inventory(path)
