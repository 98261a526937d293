"""Errors a user can act on.

Every error that reaches the command line names what is wrong (a file, a field, a host) and
what was expected, so the user never has to read a traceback to fix their input.
"""

from __future__ import annotations


class FleetrunError(Exception):
    """Base class: printed to the user as one clear message, exit code 2."""


class SpecError(FleetrunError):
    """A playbook or inventory file is broken."""


class HostError(FleetrunError):
    """A host could not be reached, refused us, or presented a key we do not trust."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class HostKeyMismatch(HostError):
    """The host presented a host key different from the pinned one: possible impostor."""


class LocalFleetError(FleetrunError):
    """The local fleet could not be built or torn down."""
