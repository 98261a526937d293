"""A lost machine's replacement made beside the survivors' stop (``launch.run.attempts.replace_lost``).

The survivors' stop (their grace, their wrapper's end: 1.5-3 s) and the replacement (a new local
node or cloud instance: 1.3 s to minutes) share nothing, so neither waits for the other.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from launch.fleets.kinds.base import FleetKind
from launch.job.inventory import Host
from launch.reports.safe_text import clean
from launch.run.state import RunContext, RunState


class Replacements:
    """The lost machines' replacements (``FleetKind.replace``), made one after the other in a
    thread that starts at once, beside the survivors' stop; ``join`` waits for them. A failed
    replacement is said and left out of ``found``, as before."""

    def __init__(self, ctx: RunContext, state: RunState, kind: FleetKind, names: Sequence[str]) -> None:
        self.ctx = ctx
        self.names = list(names)
        self.hosts = {h.name: h for h in state.hosts}
        self.kind = kind
        self.timeout_s = state.plan.recovery.replace_timeout_s
        self.found: dict[str, Host | None] = {}
        self.took_s = 0.0
        self._thread: threading.Thread | None = None
        if self.names:
            self._thread = threading.Thread(target=self._work, name="fleetrun-replace", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        started = self.ctx.clock.monotonic()
        for name in self.names:
            self.found[name] = self.one(name)
        self.took_s = self.ctx.clock.monotonic() - started

    def one(self, name: str) -> Host | None:
        """``name``'s replacement, made now; None (said) when it failed."""
        try:
            return self.kind.replace(
                self.hosts[name],
                lambda m: self.ctx.reporter.say(f"  {clean(m)}"),
                self.timeout_s,
                probe=self.ctx.port.answers,
            )
        except Exception as exc:  # noqa: BLE001 - a failed replacement is an answer, not a crash
            self.ctx.reporter.say(
                f"  {name}: replacement failed: {clean(f'{type(exc).__name__}: {exc}', 300)}"
            )
            return None

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
