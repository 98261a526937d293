"""The fleet port: what a run needs from "the machines", whatever carries the commands.

The run life cycle (``launch.run``) talks to its nodes only through this port. Two things
implement it: the SSH pool (``launch.transport.ssh.SshPool``: Fabric connections with pinned host
keys, a bounded thread pool) and the in-memory fleet of the unit tests (``tests/fakefleet.py``),
both checked against it by the type checker. That is what lets the whole life cycle, recovery
included, run in a unit test without root, sshd or a network.

Per-node outcomes are a ``NodeResults``: a ``dict`` (name -> value or the exception that host
raised, in host order) that sorts itself into ``.ok`` and ``.failed``, as Fabric's
``GroupResult`` does. The split used to be written by hand at every call site, each time a little
differently (``dict[str, str]``, ``{"*": msg}``, ``isinstance(r, BaseException)``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from launch.job.inventory import Host
from launch.transport.jump import JumpHosts

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome on one node (a non-zero exit is a result, not an error)."""

    host: str
    exit_code: int
    stdout: str
    stderr: str
    cut: str = ""
    """Set when the node sent more than is kept (``BoundedOutput``): which node, how much was cut."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class NodeResults(dict[str, "T | BaseException"], Generic[T]):
    """Per-node outcomes of one fan-out: name -> value, or the exception that node raised.

    Still a ``dict`` (in host order), so code that reads it as one keeps working; ``.ok`` and
    ``.failed`` are the two halves every caller needs, computed once here.
    """

    @property
    def ok(self) -> dict[str, T]:
        """The nodes that answered, with their values."""
        return {name: value for name, value in self.items() if not isinstance(value, BaseException)}

    @property
    def failed(self) -> dict[str, BaseException]:
        """The nodes that failed, with their exceptions."""
        return {name: value for name, value in self.items() if isinstance(value, BaseException)}

    def errors(self) -> dict[str, str]:
        """``failed`` as text (name -> message): what reports and records keep."""
        return {name: str(exc) for name, exc in self.failed.items()}


class NodeLink(Protocol):
    """One node's connection as the life cycle uses it (``launch.transport.ssh.NodeConnection``)."""

    @property
    def host(self) -> Host: ...

    def run(self, command: str, timeout: float | None = None) -> CommandResult: ...

    def run_with_input(
        self, command: str, data: bytes, timeout: float, on_stdout: Callable[[bytes], None] | None = None
    ) -> CommandResult: ...

    def ask(self, command: str, request: str, timeout: float) -> str: ...

    def put_file(self, remote_path: str, text: str, mode: int = 0o644) -> None: ...

    def close_sessions(self) -> None: ...

    def close(self) -> None: ...


class FleetPort(Protocol):
    """The machines of one run, as the life cycle sees them.

    ``map`` runs ``fn`` on each node's connection (all hosts, or ``hosts``), bounded in
    parallelism; a node past ``deadline`` seconds gets a ``HostError`` and has its connection
    closed (which unblocks the stuck call). ``subset`` is the same fleet, same open connections,
    narrowed to some hosts: the one way a step works on fewer nodes.
    """

    @property
    def hosts(self) -> list[Host]: ...

    @property
    def connections(self) -> Mapping[str, NodeLink]: ...

    @property
    def known_hosts(self) -> Path: ...

    @property
    def jumps(self) -> JumpHosts | None: ...

    @property
    def max_parallel(self) -> int: ...

    def map(
        self,
        fn: Callable[[NodeLink], T],
        hosts: Iterable[Host] | None = None,
        on_done: Callable[[str, T | BaseException], None] | None = None,
        deadline: float | None = None,
    ) -> NodeResults[T]: ...

    def subset(self, names: Collection[str]) -> FleetPort: ...

    def reconnect(self, hosts: list[Host], known_hosts: Path) -> FleetPort:
        """The port for a later attempt's ``hosts`` (their keys pinned in ``known_hosts``): a
        node whose ``Host`` is unchanged keeps its open connection, the others get new ones;
        this port's other connections are closed."""
        ...

    def outside(self, hosts: list[Host], known_hosts: Path) -> FleetPort:
        """A port of its own for machines that are not the run's (yet), their keys pinned in
        ``known_hosts``: how recovery checks a spare or a new machine before it takes it. This
        port and its connections are untouched; the caller closes the one returned."""
        ...

    def answers(self, host: Host, timeout: float) -> bool: ...

    def close(self) -> None: ...


def without(port: FleetPort, names: Collection[str]) -> FleetPort:
    """``port`` with ``names`` left out of its fan-outs (the same port when there are none)."""
    if not names:
        return port
    return port.subset([h.name for h in port.hosts if h.name not in names])


__all__ = ["CommandResult", "FleetPort", "NodeLink", "NodeResults", "without"]
