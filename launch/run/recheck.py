"""Re-checking the nodes after a stop decision, fast where the node is silent (issue 19, item 8).

Checking a silent machine (link down, no reset) costs a full connect timeout per check: one check,
wait a second, a second check, each timing out after ``CHECK_TIMEOUT_S``, took seven seconds
where the evidence needs only two failed checks ``confirm_s`` apart. Here the checks overlap: a
new round starts every second whether the previous round answered or not, and each node is
settled as soon as it answered once (not lost) or failed often enough (two failures, their starts
``confirm_s`` apart).

When the ``unreachable`` rule itself named the node, the watcher had already seen it silent for
``unreachable_timeout_s``, poll after poll: that silence counts towards ``confirm_s``
(``NodeEvidence.silent_before_s``), so two failed checks right now confirm it. A node the rule did
not name gets no such credit. What counts as lost stays the pure rule's
(``launch.rules.recovery.confirmed_lost``).

The checks also start before the limit (``EarlyChecks``, issue 33): a node silent for
``unreachable_timeout_s - LEAD_S`` is checked in the background, a round every second, so when the
rule fires its two failed checks are already in hand (a check of a machine gone silent takes its
whole connect timeout to fail); the decision comes at the limit, not ``CHECK_TIMEOUT_S`` after it.
Only failed early checks count: an answer is asked again after the decision, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from launch.job.inventory import Host
from launch.rules.recovery import NodeEvidence
from launch.transport.reachability import CHECK_TIMEOUT_S, JumpChannels, sshd_answers

EVERY_S = 1.0
LIMIT_S = 120.0
"""The longest a re-check goes on, whatever the checks do (a check that never returns)."""
TICK_S = 0.05
LEAD_S = CHECK_TIMEOUT_S + 2 * EVERY_S
"""How long before the unreachable limit a silent node's checks start: two checks, a round
apart (they overlap), each failing only at its connect timeout, end by the limit."""
MAX_IN_FLIGHT = 4
"""Checks of one node running at once (a round a second, each up to its connect timeout)."""


def sshd_check(jumps: JumpChannels | None) -> Callable[[Host], bool]:
    """One check of a node (``sshd_answers``, looked up in this module at each call, so a test
    stands in for every re-check in one place), through the bastion where the node has one."""
    return lambda host: sshd_answers(host, CHECK_TIMEOUT_S, jumps)


def recheck(
    hosts: Sequence[Host],
    confirm_s: float,
    check: Callable[[Host], bool],
    preempted: frozenset[str] = frozenset(),
    silent_before: Mapping[str, float] | None = None,
    every_s: float = EVERY_S,
    clock: Callable[[], float] = time.monotonic,
    limit_s: float = LIMIT_S,
    failed_early: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, NodeEvidence]:
    """Evidence per node: the answers of overlapping checks (a round every ``every_s``), in the
    order the checks started. Checks still running when every node is settled are left to end
    on their own timeout (their answers are not needed). ``failed_early``: when (on ``clock``)
    each failed check of ``EarlyChecks`` started, per node: counted as this re-check's own."""
    credit = dict(silent_before or {})
    results: dict[str, list[tuple[float, bool]]] = {h.name: [] for h in hosts}
    for name, starts in (failed_early or {}).items():
        if name in results:
            results[name].extend((at, False) for at in starts)
    running: list[tuple[str, float, Future[bool]]] = []

    def settled(name: str) -> bool:
        answers = results[name]
        if any(ok for _at, ok in answers):
            return True
        if len(answers) < 2:
            return False
        starts = sorted(at for at, _ok in answers)
        return starts[-1] - starts[0] + credit.get(name, 0.0) >= confirm_s

    pool = ThreadPoolExecutor(max_workers=min(64, max(4, 4 * len(hosts))))
    started = clock()
    next_round = started
    try:
        while True:
            now = clock()
            if now >= next_round:
                for host in hosts:
                    if not settled(host.name):
                        running.append((host.name, now, pool.submit(_safe, check, host)))
                next_round = now + every_s
            still = []
            for name, at, future in running:
                if future.done():
                    results[name].append((at, future.result()))
                else:
                    still.append((name, at, future))
            running = still
            if all(settled(h.name) for h in hosts) or now - started >= limit_s:
                break
            time.sleep(TICK_S)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    evidence = {}
    for host in hosts:
        answers = sorted(results[host.name])
        starts = [at for at, _ok in answers]
        evidence[host.name] = NodeEvidence(
            node=host.name,
            checks=tuple(ok for _at, ok in answers),
            span_s=(starts[-1] - starts[0]) if starts else 0.0,
            preempted=host.name in preempted,
            silent_before_s=credit.get(host.name, 0.0),
        )
    return evidence


def _safe(check: Callable[[Host], bool], host: Host) -> bool:
    """A check that raises is a check that failed (never an exception out of the re-check)."""
    try:
        return bool(check(host))
    except Exception:  # noqa: BLE001 - no answer
        return False


Contact = tuple[str, str, float | None]
"""A node as the watcher knows it now: its name, its state, when it last answered (watcher clock)."""


class EarlyChecks:
    """Checks of the nodes that have not answered the watcher for ``limit_s - lead_s``, started
    before the unreachable limit (see the module docstring). A thread reads the watcher's last
    contact with each node (``follow``): a poll round waiting on a silent node ends only at the
    limit, so the round's results would come too late.

    ``wall`` is the watcher's clock (its contacts are on it); ``clock`` the re-check's. A failed
    check counts only while no answer came after it started.
    """

    def __init__(
        self,
        hosts: Iterable[Host],
        limit_s: float,
        check: Callable[[Host], bool],
        lead_s: float = LEAD_S,
        every_s: float = EVERY_S,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.limit_s, self.lead_s, self.every_s = limit_s, lead_s, every_s
        self.check, self.wall, self.clock = check, wall, clock
        self._failed: dict[str, list[tuple[float, float]]] = {}  # (wall, clock) at each failed start
        self._last_start: dict[str, float] = {}
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, watcher: Any) -> None:
        """Watch ``watcher``'s nodes (``NodeWatch.state``, ``last_reachable_at``) until ``stop``."""
        self.start(lambda: [(n.name, n.state, n.last_reachable_at) for n in list(watcher.nodes.values())])

    def start(self, contacts: Callable[[], Iterable[Contact]]) -> None:
        """Start (again, after ``stop``: a watch that goes on after a false alarm) the thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:  # a restart follows a re-check that heard every named node again
            self._failed.clear()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(contacts, self._stopped), daemon=True)
        self._thread.start()

    def failed(self, nodes: Iterable[str]) -> dict[str, list[float]]:
        """When each failed check of ``nodes`` started (``clock``), for ``recheck(failed_early=)``."""
        with self._lock:
            return {n: [at for _wall, at in self._failed[n]] for n in nodes if self._failed.get(n)}

    def stop(self) -> None:
        self._stopped.set()

    def _loop(self, contacts: Callable[[], Iterable[Contact]], stopped: threading.Event) -> None:
        while not stopped.wait(TICK_S):
            try:
                seen = list(contacts())
            except Exception:  # noqa: BLE001 - the watcher's nodes changed under us: next tick
                continue
            now, at = self.wall(), self.clock()
            start = []
            with self._lock:
                for name, state, last in seen:
                    if name not in self.hosts or last is None or state in ("exited", "vanished"):
                        continue
                    if self._failed.get(name):  # an answer after a failed check voids it
                        self._failed[name] = [f for f in self._failed[name] if f[0] > last]
                    if now - last < self.limit_s - self.lead_s:
                        continue
                    if (
                        self._running.get(name, 0) >= MAX_IN_FLIGHT
                        or at - self._last_start.get(name, -1e18) < self.every_s
                    ):
                        continue
                    self._running[name] = self._running.get(name, 0) + 1
                    self._last_start[name] = at
                    start.append(name)
            for name in start:
                threading.Thread(target=self._one, args=(name, now, at), daemon=True).start()

    def _one(self, name: str, wall_start: float, started: float) -> None:
        ok = _safe(self.check, self.hosts[name])
        with self._lock:
            self._running[name] -= 1
            if not ok:
                self._failed.setdefault(name, []).append((wall_start, started))
