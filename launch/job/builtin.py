"""The playbooks and example code that ship with fleetrun, found the same way in a checkout and
in an installed wheel.

The README's commands name ``playbooks/digits-ddp.yaml``; a user who installed the wheel and runs
``fleetrun demo`` or ``fleetrun train digits-ddp`` from their own folder has no such file. The
wheel carries ``playbooks/`` and ``examples/`` as data files under ``<prefix>/share/fleetrun/``
(see ``setup.py``), keeping their layout so a playbook's relative ``workdir:
../examples/digits`` still points at its code. A path that exists always wins: a user's own
``playbooks/digits-ddp.yaml`` is never shadowed by the built-in one.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

__all__ = ["builtin_names", "builtin_root", "resolve_playbook"]

PLAYBOOKS_DIR = "playbooks"
EXAMPLES_DIR = "examples"


def builtin_root() -> Path | None:
    """The folder holding ``playbooks/`` and ``examples/``: the checkout's, else the installed copy."""
    checkout = Path(__file__).resolve().parents[2]
    installed = Path(sysconfig.get_path("data")) / "share" / "fleetrun"
    for root in (checkout, installed):
        if (root / PLAYBOOKS_DIR).is_dir() and (root / EXAMPLES_DIR).is_dir():
            return root
    return None


def builtin_names() -> list[str]:
    """The built-in playbooks' names (file names without ``.yaml``), sorted."""
    root = builtin_root()
    if root is None:
        return []
    return sorted(p.stem for p in (root / PLAYBOOKS_DIR).glob("*.yaml"))


def resolve_playbook(playbook: str | Path) -> Path:
    """``playbook`` as given when it exists; else the built-in playbook it names.

    A built-in is named by its bare name (``digits-ddp``, ``digits-ddp.yaml``) or by the README's
    relative form ``playbooks/digits-ddp.yaml``. Anything else is returned unchanged, so reading
    it fails with the usual "file not found" naming the path the user gave.
    """
    path = Path(playbook)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts
    if len(parts) == 2 and parts[0] == PLAYBOOKS_DIR:
        name = parts[1]
    elif len(parts) == 1:
        name = parts[0]
    else:
        return path
    name = name.removesuffix(".yaml")
    if name not in builtin_names():
        return path
    root = builtin_root()
    assert root is not None  # builtin_names() found it
    return root / PLAYBOOKS_DIR / f"{name}.yaml"
