"""Nodes the fleet itself says are gone, asked in the background while the watcher polls.

A scheduler can take a node from a run while the node still answers SSH: Slurm marks it DOWN or
DRAIN (an administrator, a failed health check), and the run's processes on it go on as if
nothing happened, so no SSH poll would ever see the loss. The fleet kind knows
(``FleetKind.lost_nodes``); this asks it every ``EVERY_S`` on a thread of its own, so a slow or
hung login host never delays a poll round, and hands the watcher the last answer. A failing
question is said once and never ends the watch (the SSH polls go on deciding as before).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from launch.reports.safe_text import clean

__all__ = ["EVERY_S", "SiteLost"]

EVERY_S = 5.0
"""How often the fleet is asked (one ``sinfo`` on a Slurm login host)."""
MAX_NODES = 4096
MAX_WHY = 200

Ask = Callable[[list[str]], dict[str, str]]


class SiteLost:
    """The fleet's answer about the run's nodes, refreshed in the background."""

    def __init__(self, ask: Ask, every_s: float = EVERY_S, monotonic: Callable[[], float] = time.monotonic):
        self.ask = ask
        self.every_s = every_s
        self.monotonic = monotonic
        self.lost: dict[str, str] = {}
        """The last answer: node -> why (escaped, bounded); only nodes the run asked about."""
        self.error = ""
        """Why the last question failed ("" when it did not)."""
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[dict[str, str]] | None = None
        self._asked: list[str] = []
        self._due = 0.0

    def refresh(self, names: list[str]) -> str:
        """Take a finished answer and start the next question when due; never blocks. Returns a
        line to show when the question failed for a new reason, else ""."""
        said = ""
        if self._pending is not None and self._pending.done():
            try:
                answer = self._pending.result()
                asked = set(self._asked)
                self.lost = {
                    clean(str(name), 100): clean(str(why), MAX_WHY)
                    for name, why in list(answer.items())[:MAX_NODES]
                    if name in asked
                }
                self.error = ""
            except Exception as exc:  # noqa: BLE001 - the fleet's question never ends the watch
                why = clean(f"{type(exc).__name__}: {exc}", 300)
                said = "" if why == self.error else f"  could not ask the fleet which nodes it took: {why}"
                self.error = why
            self._pending = None
        now = self.monotonic()
        if self._pending is None and names and now >= self._due:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="site-lost")
            self._asked = list(names)
            self._pending = self._pool.submit(self.ask, list(names))
            self._due = now + self.every_s
        return said

    def close(self) -> None:
        """Stop asking; a question in flight ends on its own timeout."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
