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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from launch.job.inventory import Host
from launch.rules.recovery import NodeEvidence

EVERY_S = 1.0
LIMIT_S = 120.0
"""The longest a re-check goes on, whatever the checks do (a check that never returns)."""
TICK_S = 0.05


def recheck(
    hosts: Sequence[Host],
    confirm_s: float,
    check: Callable[[Host], bool],
    preempted: frozenset[str] = frozenset(),
    silent_before: Mapping[str, float] | None = None,
    every_s: float = EVERY_S,
    clock: Callable[[], float] = time.monotonic,
    limit_s: float = LIMIT_S,
) -> dict[str, NodeEvidence]:
    """Evidence per node: the answers of overlapping checks (a round every ``every_s``), in the
    order the checks started. Checks still running when every node is settled are left to end
    on their own timeout (their answers are not needed)."""
    credit = dict(silent_before or {})
    results: dict[str, list[tuple[float, bool]]] = {h.name: [] for h in hosts}
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
