"""Where fleetrun keeps its own state on the operator's machine (from ``launch.settings``).

``FLEETRUN_HOME`` (default ``~/.fleetrun``) holds keys, known_hosts files, local fleets and run
folders. Tests point it at a temporary directory. The environment is read by
``launch.settings`` only; these are the names the rest of the code asks for.
"""

from __future__ import annotations

from pathlib import Path

from launch.settings import current


def fleetrun_home() -> Path:
    return current().home


def runs_dir() -> Path:
    return current().runs


def known_hosts_file(fingerprint: str) -> Path:
    return fleetrun_home() / "known_hosts" / fingerprint


def image_dir() -> Path:
    """The local fleet's shared "machine image" (a Python with torch), outside /root so node users can run it."""
    return current().image_dir
