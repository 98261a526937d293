"""Where fleetrun keeps its own state on the operator's machine.

``FLEETRUN_HOME`` (default ``~/.fleetrun``) holds keys, known_hosts files, local fleets and run
folders. Tests point it at a temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def fleetrun_home() -> Path:
    return Path(os.environ.get("FLEETRUN_HOME") or Path.home() / ".fleetrun").expanduser()


def runs_dir() -> Path:
    return Path(os.environ.get("FLEETRUN_RUNS") or fleetrun_home() / "runs")


def known_hosts_file(fingerprint: str) -> Path:
    return fleetrun_home() / "known_hosts" / fingerprint


def image_dir() -> Path:
    """The local fleet's shared "machine image" (a Python with torch), outside /root so node users can run it."""
    return Path(os.environ.get("FLEETRUN_IMAGE_DIR") or "/opt/fleetrun/image")
