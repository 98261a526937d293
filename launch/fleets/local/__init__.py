"""The local fleet: real SSH machines on one computer (network namespaces + sshd), for the demo and the tests.

Split by job: ``prereqs`` (root, host packages, the shared Python image), ``naming`` (every name
and address, from the prefix and subnet), ``state`` (the record of what a fleet created),
``node`` (building one node), ``fleet`` (``up``/``down``, ownership), ``power`` (the root daemon
behind the nodes' power-off hook).
"""

from launch.fleets.local.fleet import LocalFleet
from launch.fleets.local.prereqs import ensure_image, ensure_tools, image_python, require_root

__all__ = ["LocalFleet", "ensure_image", "ensure_tools", "image_python", "require_root"]
