"""Stragglers: the node that holds a synchronous job back, named from every rank's pace. Pure.

Every rank's metrics helper (``fleetrun_metrics.Pace``) writes its steps/s and the time of a
fixed tiny CPU probe; each node's agent reports its slowest rank and how old that node's stalest
rank's report is (``fleetrun_node.pace_reading``). In data-parallel training every rank waits
for the slowest at each all-reduce, so steps/s is the same everywhere and says only that the run
is slow; the probe says where: a node whose CPU is throttled, starved or stopped runs it slower
than the others. A node whose ranks stopped reporting while most nodes go on is stalled: it
counts as slow (infinitely), never drops out of the comparison. A node that has not reported
in this launch yet is left out (unknown), never judged slow.

A node is a straggler once ``window_s`` has passed since its first reading over ``factor`` times
the median of the other nodes' and the median of its readings over that window is still over
the factor.
Under a CPU quota the slow node's ratio swings from 1.5x to 100x between two reports: the median
rides over the swings (the flag does not wait for a lucky poll), and a dip under the factor
shorter than ``DIP_MAX_S`` does not start the window over. A healthy fleet that is slow as a
whole (load, a slow step) is slow everywhere: ratios stay near 1 and nothing is flagged.

``action``: ``warn`` shows it in the live table (the run goes on), ``stop`` stops the run naming
the node, ``exclude`` fails the attempt so that ``recovery.on: [straggler]`` goes on without the
node (a spare takes its place, as after a ``gpu_fault``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "NodePace",
    "PaceHistory",
    "StragglerRule",
    "describe",
    "pace_ratios",
    "parse_pace",
    "slow_nodes",
    "stalled",
]


class StragglerRule(BaseModel):
    """The playbook's ``stop: {straggler: {factor: 1.3, window_s: 120, action: warn}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    factor: float = Field(default=1.3, gt=1.0, le=100.0)
    """A node is slow when its pace is this many times the other nodes' median."""
    window_s: float = Field(default=120.0, gt=0.0, le=86400.0)
    """...and stays that slow for this many seconds (a short hiccup is not a straggler)."""
    action: Literal["warn", "stop", "exclude"] = "warn"
    """``warn`` names the node in the live table and the record; ``stop`` ends the run (failed);
    ``exclude`` ends the attempt and, with ``recovery.on: [straggler]``, goes on without the node."""


@dataclass(frozen=True)
class NodePace:
    probe_ms: float
    """The slowest local rank's mean probe time (ms) over its last few seconds."""
    steps_per_s: float | None = None
    ranks: int = 1
    age_s: float = 0.0
    """Seconds since the node's stalest rank last reported (on the node's own clock)."""


MAX_AGE_S = 1e7
"""An age beyond this (115 days) is not a reading's age but garbage."""


def _number(value: object, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and low <= value < high else None


def parse_pace(data: object) -> NodePace | None:
    """A poll answer's ``pace`` as facts; None when absent or not numbers in range (untrusted)."""
    if not isinstance(data, dict):
        return None
    probe, rate, ranks = data.get("probe_ms"), data.get("steps_per_s"), data.get("ranks", 1)
    age = data.get("age_s", 0.0)
    probe_ms = _number(probe, 0.0, 1e6)
    if probe_ms is None or probe_ms <= 0:
        return None
    steps = None if rate is None else _number(rate, 0.0, 1e6)
    if rate is not None and steps is None:
        return None
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 0 < ranks <= 4096:
        return None
    age_s = _number(age, 0.0, MAX_AGE_S)
    if age_s is None:
        return None
    return NodePace(probe_ms, steps, ranks, age_s)


STALE_MIN_S = 10.0
"""A node's ranks silent this long (and ``STALE_TIMES`` the median node's silence) are stalled.
Ranks write their pace every ``fleetrun_metrics.PACE_WRITE_S`` (2 s) or at their next step,
whichever is later; a job whose every step takes longer is silent everywhere alike."""
STALE_TIMES = 3.0


def stalled(paces: Mapping[str, NodePace | None]) -> set[str]:
    """Nodes whose ranks stopped reporting (a pace much older than the median node's) while more
    than half of the nodes report: they count as slow. When most nodes are silent (the whole job
    waits: a checkpoint, a collective) nobody is. A node with no pace at all in this launch is
    unknown, not stalled: its ranks may still be importing torch on a busy machine, or the job
    may log metrics from some ranks only; a node that hangs is the watcher's heartbeat and
    hang rules' business, not this comparison's."""
    ages = {n: p.age_s for n, p in paces.items() if p is not None}
    if len(ages) < 2:
        return set()
    limit = max(STALE_MIN_S, STALE_TIMES * statistics.median(ages.values()))
    silent = {n for n, age in ages.items() if age >= limit}
    return silent if 2 * len(silent) < len(ages) else set()


def pace_ratios(paces: Mapping[str, NodePace | None]) -> dict[str, float]:
    """Each node's probe time over the median of the *other* reporting nodes' (1.0 = typical,
    2.0 = twice as slow); ``inf`` for a stalled node (:func:`stalled`).

    The others', not all nodes': the median of all includes the node itself, so on two nodes a
    slow one could never reach 2x (``a / ((a + b) / 2) < 2`` whatever ``a``), and a factor of 2
    would never flag anything on the smallest multi-node job. From three nodes on the two agree
    for one slow node."""
    silent = stalled(paces)
    known = {n: p.probe_ms for n, p in paces.items() if p is not None and n not in silent}
    if len(known) < 2:
        return {}
    ratios = {}
    for node, value in known.items():
        median = statistics.median(v for n, v in known.items() if n != node)
        if median <= 0:
            return {}
        ratios[node] = value / median
    return {**ratios, **dict.fromkeys(silent, math.inf)}


DIP_MAX_S = 10.0
"""A slow node's pace may dip under the factor for this long (or half of ``window_s``, the
shorter) without its window starting over: under a CPU quota the slow node's ratio swings
between 1.5x and 100x from one report to the next, and a lucky report must not hide it."""
MAX_SAMPLES = 512
"""Readings kept per slow node (one a poll, the last ``window_s``): bounded whatever the window
(a longer window at one poll a second is judged on its last 512 s)."""


@dataclass
class PaceHistory:
    """What the straggler rule remembers between polls (one per watched run)."""

    slow_since: dict[str, float] = field(default_factory=dict)
    """Since when each node has been slow: its first reading over the factor (the window's start)."""
    fast_since: dict[str, float] = field(default_factory=dict)
    """Since when a slow node has been back under the factor (a dip shorter than
    :data:`DIP_MAX_S` does not restart its window)."""
    readings: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    """A slow node's ratios since its window began, one a poll, over the last ``window_s``: the
    flag looks at their median (:func:`held_median`), not at one poll's reading."""

    def forget(self, node: str) -> None:
        self.slow_since.pop(node, None)
        self.fast_since.pop(node, None)
        self.readings.pop(node, None)


def held_median(readings: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The median ratio over ``[start, end]``, each reading holding until the next one (so
    weighted by how long it held, whatever the polls' spacing); the newest, at ``end``, decides
    alone only when nothing held before it."""
    spans: list[tuple[float, float]] = []
    for (at, ratio), (until, _) in zip(readings, list(readings)[1:], strict=False):
        if until > start:
            spans.append((ratio, until - max(at, start)))
    total = sum(w for _, w in spans)
    if total <= 0:
        return readings[-1][1]
    held, ordered = 0.0, sorted(spans)
    for ratio, weight in ordered:
        held += weight
        if held >= total / 2:
            return ratio
    return ordered[-1][0]


def slow_nodes(
    rule: StragglerRule, paces: Mapping[str, NodePace | None], now: float, history: PaceHistory
) -> list[tuple[str, float, float]]:
    """Fold this poll into ``history``; (node, median ratio, seconds slow) of every node slow for
    the whole window, slowest first.

    The window starts at a node's first reading over the factor and ends ``window_s`` later;
    the node is flagged from then on while the median of its readings over the last ``window_s``
    is over the factor, whatever this one poll says. Back under the factor for longer than the dip
    allowance (``min(DIP_MAX_S, window_s / 2)``), or gone from the comparison as long, it starts
    over."""
    allowance = min(DIP_MAX_S, rule.window_s / 2)
    ratios = pace_ratios(paces)
    for node, ratio in ratios.items():
        if ratio >= rule.factor:
            history.slow_since.setdefault(node, now)
            history.fast_since.pop(node, None)
    for node in list(history.slow_since):
        now_ratio = ratios.get(node)
        dipped = now_ratio is None or now_ratio < rule.factor
        if dipped and now - history.fast_since.setdefault(node, now) >= allowance:
            history.forget(node)
            continue
        if now_ratio is not None:
            recent = history.readings.setdefault(node, deque(maxlen=MAX_SAMPLES))
            recent.append((now, now_ratio))
            while len(recent) > 1 and recent[1][0] <= now - rule.window_s:
                recent.popleft()  # the one reading left before the window still holds at its start
    found = []
    for node, since in history.slow_since.items():
        kept = history.readings.get(node)
        if now - since < rule.window_s or not kept:
            continue
        typical = held_median(kept, now - rule.window_s, now)
        if typical >= rule.factor:
            found.append((node, typical, now - since))
    return sorted(found, key=lambda f: -f[1])


def describe(found: Sequence[tuple[str, float, float]], rule: StragglerRule) -> str:
    what = ", ".join(
        f"{node} without a pace report (its ranks stopped stepping) for {dt:.0f} s"
        if math.isinf(ratio)
        else f"{node} {ratio:.1f}x the median node's probe time for {dt:.0f} s"
        for node, ratio, dt in found
    )
    return f"straggler: {what} (factor {rule.factor:g}, window {rule.window_s:g} s)"
