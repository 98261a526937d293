"""Launcher registry: name -> launcher. Each launcher lives in its own module.

Adding a launcher means adding a module and one line here; nothing else branches on the name.
"""

from __future__ import annotations

from launch.errors import SpecError
from launch.planning.launchers.base import Launcher
from launch.planning.launchers.horovod import HorovodLauncher
from launch.planning.launchers.torchrun import TorchrunLauncher

LAUNCHERS: dict[str, type[Launcher]] = {
    TorchrunLauncher.name: TorchrunLauncher,
    HorovodLauncher.name: HorovodLauncher,
}


def launcher_class(name: str) -> type[Launcher]:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise SpecError(
            f"launcher {name!r} is not available; available: {', '.join(sorted(LAUNCHERS))}"
        ) from None


def get_launcher(name: str) -> Launcher:
    """A launcher with no inventory-specific preparation (tests, dry runs of pure plans)."""
    return launcher_class(name)()
