"""How long one poll may wait for answers, so that an unreachable verdict is never late.

The ``unreachable`` rule counts from the last successful contact with a node (when its last good
answer arrived). A poll that waits its full answer timeout on a node that went silent would
push the verdict past the limit by that timeout: with a 10 s limit and a 15 s answer timeout the
verdict came after 21 s. So the watcher gives each poll round a budget that ends just after the
earliest moment a silent node is due, and the verdict lands within the limit plus a poll.
Pure: the caller passes the clock reading, so it is unit-tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DUE_MARGIN_S", "MIN_POLL_BUDGET_S", "poll_budget"]

MIN_POLL_BUDGET_S = 1.0
"""Never less: a healthy but busy node needs a round trip, even when another node is nearly due."""
DUE_MARGIN_S = 0.25
"""Past the due time, so the observation made when the poll gives up is already at the limit."""


def poll_budget(
    limit_s: float | None,
    last_contacts: Iterable[float | None],
    now: float,
    longest_s: float,
) -> float:
    """Seconds the next poll round may wait: ``longest_s``, cut to end just after the earliest due
    node (``last contact + limit``). A node never reached (None) or already past due (its
    verdict fires at this very evaluation) does not shorten it below ``MIN_POLL_BUDGET_S``."""
    if limit_s is None:
        return longest_s
    budget = longest_s
    for last in last_contacts:
        if last is None:
            continue
        budget = min(budget, last + limit_s - now + DUE_MARGIN_S)
    return max(MIN_POLL_BUDGET_S, budget)
