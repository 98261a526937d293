"""Fleet kinds by name: from an inventory's fleet reference to its ``FleetKind``, and from an
``--inventory`` selector to the loader of the kind that owns it.

Each kind's module is imported when that kind is first asked for, not with this registry: a light
command (``fab exec --inventory local:<prefix>``) should not import the stack kind's clouds and
node protocol models it never uses (about a quarter of that command's imports). The tables name
modules and attributes; ``tests/test_fleet_kinds.py`` checks them against the kinds' own names.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.errors import SpecError

if TYPE_CHECKING:
    from launch.fleets.kinds.base import FleetKind
    from launch.fleets.kinds.refs import FleetRef
    from launch.job.inventory import Inventory

PACKAGE = "launch.fleets.kinds"

KINDS: dict[str, tuple[str, str]] = {
    "lab": ("lab", "LabKind"),
    "local": ("local", "LocalFleetKind"),
    "stack": ("stack", "StackKind"),
    "slurm": ("slurm", "SlurmKind"),
}
"""Kind name (the reference's ``kind``) -> (module in this package, the class built from that reference)."""

SELECTORS: dict[str, tuple[str, str]] = {
    "local": ("local", "load_local_inventory"),
    "stack": ("stack", "load_stack_inventory"),
    "slurm": ("slurm", "load_slurm_inventory"),
}
"""``--inventory NAME[:ARG]`` -> the loader for that kind: fleetrun's own state (trusted) for
``local`` and ``stack``; the user's cluster file (untrusted, ``slurm:PATH``) for Slurm."""

FILE_LOADERS: dict[str, tuple[str, str]] = {".json": ("stack", "load_outputs_file")}
"""File suffix -> loader; any other file is a lab inventory (the untrusted loader)."""

LAB_LOADER = ("lab", "load_lab_inventory")


def resolve(entry: tuple[str, str]) -> Any:
    """The attribute a table entry names, its kind's module imported now if it was not yet."""
    module, attr = entry
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), attr)


def fleet_kind(ref: FleetRef) -> FleetKind:
    kind: FleetKind = resolve(KINDS[ref.kind])(ref)
    return kind


def load_inventory(selector: str, save_keys: bool = True) -> Inventory:
    """``local`` / ``local:<prefix>``, ``stack:<name>``, a ``.json`` of stack outputs, or a lab YAML.

    ``save_keys=False`` (``--dry-run``): a stack's generated operator key is not written.
    """
    name, _, arg = selector.partition(":")
    if name in SELECTORS:
        inventory: Inventory = resolve(SELECTORS[name])(arg or None, save_keys)
        return inventory
    path = Path(selector)
    if not path.exists():
        raise SpecError(
            f"inventory {selector!r}: no such file (expected 'local', 'stack:<name>', a .json or .yaml file)"
        )
    loader = FILE_LOADERS.get(path.suffix)
    if loader is not None:
        from_file: Inventory = resolve(loader)(path, save_keys)
        return from_file
    lab: Inventory = resolve(LAB_LOADER)(path)
    return lab
