"""A run holds exactly the machines it uses, start to end, through a recovery (``QueueHold``).

The queue script runs for real here, one folder per machine (``/tmp`` on each node); only the
connections are stand-ins. Before: a spare taken by recovery was never held (another run could
start on it mid-run) and a machine the run left stayed held until the run ended."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import pytest

from launch.job.inventory import Host
from launch.run import queue_turn
from launch.transport.port import CommandResult, NodeResults
from tests.fakefleet import fake_hosts

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


class _Machines:
    """Each machine's ``/tmp`` (by address): a folder of its own, root's and sticky like /tmp."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def tmp(self, host: Host) -> Path:
        folder = self.base / host.address
        if not folder.exists():
            folder.mkdir()
            folder.chmod(0o1777)
        return folder

    def entries(self, host: Host) -> list[str]:
        return sorted(p.name.split("-", 1)[1] for d in self.tmp(host).iterdir() for p in d.iterdir())


class _Conn:
    def __init__(self, host: Host, machines: _Machines) -> None:
        self.host, self.machines = host, machines

    def run_with_input(self, command: str, data: bytes, timeout: float) -> CommandResult:
        words = shlex.split(command)
        assert words[-1] == "/tmp", command
        words[0], words[-1] = SYSTEM_PYTHON, str(self.machines.tmp(self.host))
        done = subprocess.run(words, input=data, capture_output=True, timeout=timeout, check=False)
        return CommandResult(self.host.name, done.returncode, done.stdout.decode(), done.stderr.decode())


class _Port:
    """The part of ``FleetPort`` a hold uses, over ``_Machines``; closed ports refuse work."""

    def __init__(self, hosts: list[Host], machines: _Machines, known_hosts: Path) -> None:
        self._hosts, self.machines, self._known = list(hosts), machines, known_hosts
        self.closed = False

    @property
    def hosts(self) -> list[Host]:
        return self._hosts

    @property
    def known_hosts(self) -> Path:
        return self._known

    def map(
        self, fn: Callable[[Any], Any], hosts: Iterable[Host] | None = None, **_: Any
    ) -> NodeResults[Any]:
        assert not self.closed, "a closed port was used"
        out: NodeResults[Any] = NodeResults()
        for host in hosts or self._hosts:
            try:
                out[host.name] = fn(_Conn(host, self.machines))
            except Exception as exc:  # noqa: BLE001 - as the real port: a value per node
                out[host.name] = exc
        return out

    def subset(self, names: Collection[str]) -> _Port:
        return _Port([h for h in self._hosts if h.name in names], self.machines, self._known)

    def outside(self, hosts: list[Host], known_hosts: Path) -> _Port:
        return _Port(hosts, self.machines, known_hosts)

    def reconnect(self, hosts: list[Host], known_hosts: Path) -> _Port:
        self.closed = True
        return _Port(hosts, self.machines, known_hosts)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def machines() -> Iterable[_Machines]:
    base = Path(tempfile.mkdtemp(prefix="fleetrun-hold-test-"))
    yield _Machines(base)
    shutil.rmtree(base, ignore_errors=True)


def _hold(machines: _Machines, hosts: list[Host], run_id: str, share: bool = False) -> queue_turn.QueueHold:
    port = _Port(hosts, machines, Path("/dev/null"))
    queue_turn._live(run_id, True)  # this process's live run, as take_machines marks it
    queue_turn._act(port, "enqueue", run_id, 60)  # what take_machines does before it holds
    return queue_turn.QueueHold(port, run_id, 60, share)


def test_a_spare_is_held_before_it_is_taken_and_one_another_run_holds_is_refused(machines: _Machines) -> None:
    n0, n1, n2, n3 = fake_hosts(4)
    other = _hold(machines, [n3], "run-other")
    hold = _hold(machines, [n0, n1], "run-mine")
    try:
        assert hold.refused(n2, Path("/dev/null")) is None
        assert machines.entries(n2) == ["run-mine"], "held from the moment recovery takes it"
        why = hold.refused(n3, Path("/dev/null"))
        assert why is not None and "held by another run" in why and "run-other" in why
        assert machines.entries(n3) == ["run-other"], "nothing of the refused run left on it"
        sharing = _hold(machines, [n0], "run-sharing", share=True)
        assert sharing.refused(n3, Path("/dev/null")) is None, "--allow-busy-gpus shares on purpose"
        sharing.release()
    finally:
        hold.release()
        other.release()


def test_the_hold_follows_the_next_attempts_hosts(machines: _Machines) -> None:
    n0, n1, n2 = fake_hosts(3)
    renewed = n1.model_copy(update={"address": "203.0.113.99"})  # a new machine under n1's name
    hold = _hold(machines, [n0, n1], "run-mine")
    try:
        hold.follow([n0, renewed], Path("/dev/null"))
        assert machines.entries(renewed) == ["run-mine"], "the new machine is held"
        for _ in range(100):  # the old machine is let go in the background (it may not answer)
            if not machines.entries(n1):
                break
            subprocess.run(["sleep", "0.05"], check=False)
        assert machines.entries(n1) == [], "the machine the run left is let go"
        assert machines.entries(n0) == ["run-mine"]
        hold.follow([n0, renewed, n2], Path("/dev/null"))
        assert machines.entries(n2) == ["run-mine"]
    finally:
        hold.release()
    assert [machines.entries(h) for h in (n0, renewed, n2)] == [[], [], []], "all let go at the end"
