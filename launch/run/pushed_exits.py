"""A rank's exit pushed to the watcher the moment it happens, instead of found at the next poll.

The node agent knows when its job ends (the run's wrapper ends right after writing ``rc``); the
watcher used to learn it at its next poll, half a poll interval later on average plus the round
trip. Here each running node gets a second long-lived command on its existing SSH connection, the
agent's event channel (``fleetrun_node.py events``): a ``WaitRequest`` held by the agent until the
job's state changes, answered at once when it does. A thread per node waits on that answer; the
watcher's pause between polls waits on the first such answer instead of sleeping the interval
through, so the poll that reads the exit starts one one-way trip after it.

Best effort by design: a node whose event channel fails (an older agent, a broken channel) is
simply polled as before, and the poll stays the one source of truth: a pushed answer only ends
the pause, it never decides anything by itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from launch.errors import HostError
from launch.nodelib.fleetrun_protocol import MAX_WAIT_S, ProtocolError, WaitAnswer, WaitRequest
from launch.transport.port import FleetPort

__all__ = ["HOLD_S", "Pushed", "PushedExits"]

HOLD_S = 30.0
"""How long the agent holds one wait before answering that nothing changed (then it is asked again)."""
ANSWER_MARGIN_S = 15.0
"""Past the hold, how long a wait answer may take before the channel counts as broken."""


@dataclass(frozen=True)
class Pushed:
    """One node's pushed change: its job's state and exit code when the agent answered."""

    node: str
    state: str
    rc: int | None


class PushedExits:
    """The event channels of one watched attempt: ``listen`` on running nodes, ``wait`` for a push.

    Thread-safe: listener threads record what they heard and set one event; the watcher's thread
    clears it before each poll round (``arm``) and waits on it between rounds."""

    def __init__(self, fleet: FleetPort, command: str, hold_s: float = HOLD_S) -> None:
        self.fleet = fleet
        self.command = command
        self.hold_s = min(hold_s, MAX_WAIT_S)
        self.pushed: list[Pushed] = []
        """Every change pushed so far, in the order heard."""
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._done: set[str] = set()
        self._closed = False

    def listen(self, names: Iterable[str]) -> None:
        """An event channel on each of ``names`` (nodes the last poll found running) that has none
        alive; a node whose change was already pushed, or whose channel failed, is not asked again."""
        with self._lock:
            if self._closed:
                return
            for name in names:
                thread = self._threads.get(name)
                if name in self._done or (thread is not None and thread.is_alive()):
                    continue
                conn = self.fleet.connections.get(name)
                if conn is None:
                    continue
                thread = threading.Thread(
                    target=self._listen, args=(name,), name=f"fleetrun-events-{name}", daemon=True
                )
                self._threads[name] = thread
                thread.start()

    @property
    def listening(self) -> bool:
        with self._lock:
            return any(t.is_alive() for t in self._threads.values())

    def arm(self) -> None:
        """Before a poll round: what was pushed until now, that round reads."""
        self._event.clear()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a push (real time); True when one came."""
        return self._event.wait(max(0.0, seconds))

    def close(self) -> None:
        """No more listening; the threads end with their channels (``NodeLink.close_sessions``)."""
        with self._lock:
            self._closed = True

    def _listen(self, name: str) -> None:
        request = WaitRequest(wait_s=self.hold_s, seen="running").to_json()
        conn = self.fleet.connections[name]
        try:
            while not self._closed:
                line = conn.ask(self.command, request, timeout=self.hold_s + ANSWER_MARGIN_S)
                answer = WaitAnswer.from_json(line)
                if answer.error or self._closed:
                    return
                if answer.state != "running":
                    with self._lock:
                        self._done.add(name)
                        self.pushed.append(Pushed(name, answer.state, answer.rc))
                    self._event.set()
                    return
        except (HostError, ProtocolError, OSError):
            with self._lock:
                self._done.add(name)  # polled as before; never a verdict on the node
        except Exception:  # noqa: BLE001 - a listener's bug must not end the watcher
            with self._lock:
                self._done.add(name)
