"""Former home of the local fleet, now ``launch.fleets.local``; these names keep working for callers."""

from launch.fleets.local import LocalFleet, ensure_image, ensure_tools, image_python, require_root

__all__ = ["LocalFleet", "ensure_image", "ensure_tools", "image_python", "require_root"]
