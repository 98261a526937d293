"""Stragglers: the node that holds a synchronous job back, named from every rank's pace. Pure.

Every rank's metrics helper (``fleetrun_metrics.Pace``) writes its steps/s and the time of a
fixed tiny CPU probe; each node's agent reports its slowest rank (``fleetrun_node.pace_reading``).
In data-parallel training every rank waits for the slowest at each all-reduce, so steps/s is the
same everywhere and says only that the run is slow; the probe says where: a node whose CPU is
throttled, starved or stopped runs it slower than the others. A node is a straggler when its
probe time is ``factor`` times the median node's or more for ``window_s`` (short dips allowed: ``DIP_MAX_S``).

``action``: ``warn`` shows it in the live table (the run goes on), ``stop`` stops the run naming
the node, ``exclude`` fails the attempt so that ``recovery.on: [straggler]`` goes on without the
node (a spare takes its place, as after a ``gpu_fault``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["NodePace", "StragglerRule", "parse_pace", "pace_ratios", "slow_nodes"]


class StragglerRule(BaseModel):
    """The playbook's ``stop: {straggler: {factor: 1.3, window_s: 120, action: warn}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    factor: float = Field(default=1.3, gt=1.0, le=100.0)
    """A node is slow when its pace is this many times the median node's."""
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


def parse_pace(data: object) -> NodePace | None:
    """A poll answer's ``pace`` as facts; None when absent or not numbers in range (untrusted)."""
    if not isinstance(data, dict):
        return None
    probe, rate, ranks = data.get("probe_ms"), data.get("steps_per_s"), data.get("ranks", 1)
    if isinstance(probe, bool) or not isinstance(probe, (int, float)) or not 0 < probe < 1e6:
        return None
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
        return None
    if rate is not None and not (math.isfinite(rate) and 0 <= rate < 1e6):
        return None
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 0 < ranks <= 4096:
        return None
    return NodePace(float(probe), None if rate is None else float(rate), ranks)


def pace_ratios(paces: Mapping[str, NodePace | None]) -> dict[str, float]:
    """Each node's probe time over the median node's (1.0 = typical, 2.0 = twice as slow)."""
    known = {n: p.probe_ms for n, p in paces.items() if p is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    return {n: v / median for n, v in known.items()} if median > 0 else {}


DIP_MAX_S = 10.0
"""A slow node's pace may dip under the factor for this long (or half of ``window_s``, the
shorter) without its window starting over: under a CPU quota the slow node's ratio swings
between 1.5x and 100x from one poll to the next, and one lucky sample (a rank writes its pace
every 5 s) must not hide it."""


def slow_nodes(
    rule: StragglerRule,
    paces: Mapping[str, NodePace | None],
    now: float,
    slow_since: dict[str, float],
    fast_since: dict[str, float] | None = None,
) -> list[tuple[str, float, float]]:
    """Update ``slow_since`` (and ``fast_since``: since when a slow node has been back under the
    factor) with this poll; (node, ratio, seconds slow) of every node slow for the whole window.
    A node back under the factor for longer than the dip allowance starts over; a node is only
    flagged at a poll where it is over the factor."""
    fast = {} if fast_since is None else fast_since
    allowance = min(DIP_MAX_S, rule.window_s / 2)
    ratios = pace_ratios(paces)
    for node in list(slow_since):
        if ratios.get(node, 0.0) < rule.factor:
            if now - fast.setdefault(node, now) >= allowance:
                del slow_since[node]
                fast.pop(node, None)
        else:
            fast.pop(node, None)
    found = []
    for node, ratio in ratios.items():
        if ratio >= rule.factor:
            since = slow_since.setdefault(node, now)
            if now - since >= rule.window_s:
                found.append((node, ratio, now - since))
    return sorted(found, key=lambda f: -f[1])


def describe(found: Sequence[tuple[str, float, float]], rule: StragglerRule) -> str:
    what = ", ".join(
        f"{node} {ratio:.1f}x the median node's probe time for {dt:.0f} s" for node, ratio, dt in found
    )
    return f"straggler: {what} (factor {rule.factor:g}, window {rule.window_s:g} s)"
