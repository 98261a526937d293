"""``fab doctor --collective``: name the slow node or link from all-reduce figures. Pure: the
figures come from rank 0's result line (``launch.run.collective`` runs the one torchrun launch).

The schedule is fixed (``ring_rounds``, shared with the node script): round 0 the whole world (the
fleet's figure), then the ring of neighbour pairs (i, i+1 mod N) in rounds of disjoint pairs run at
the same time: 3 rounds (4 with N odd) whatever N, N pairs and not N(N-1)/2, all in one launch, no
laptop round trip between rounds (starting torch is what costs; the measurements are short).

Every node is in two pairs, so:

* a node's figure is its best pair: a node in two slow pairs is *suspected* when under ``ratio``
  times the median node's figure and under ``ratio`` times its partners' figures in their other
  pairs (its pairs were slow because of it, not of them: on a loaded shared machine CPU contention
  alone spreads healthy pairs 4x; ``suspected`` in the node script, shared);
* a suspect is *named* only when its re-measure in the same launch (paired with a node not
  suspected, ``confirm_rounds``, the best of a few repetitions) is under ``ratio`` times the
  ring's median too: a healthy 16-node fleet at load over 14 had nodes at 0.49x from CPU
  contention alone (N/2 pairs at once); the re-measure runs the suspects' pairs alone. A suspect
  whose re-measure is missing is a warning, not a name;
* a slow pair (under ``link_ratio`` times the median: one figure, so a stricter bound) whose two
  nodes are fine in their other pair is a slow *link* between them.

Two nodes: the world is the one pair, nothing to compare it with, nobody named.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launch.nodelib.fleetrun_collective import (
    LINK_RATIO,
    MARK,
    SLOW_RATIO,
    best_of_pairs,
    confirm_rounds,
    remeasure_plan,
    ring_rounds,
    suspected,
    suspected_links,
)

MAX_LINE = 4 * 1024**2
"""Rank 0's line holds every group's figure of every round: some 100 bytes a node a round."""
SAVED_VERSION = 3
"""The saved result's format: 3 adds ``suspected``, ``suspected_links`` and ``confirm`` (the re-measure), 2 ``rounds``
and ``slow_links`` (1: one launch per group)."""

Group = tuple[str, ...]

__all__ = ["LINK_RATIO", "MARK", "SLOW_RATIO", "confirm_rounds", "ring_rounds", "suspected"]


@dataclass(frozen=True)
class GroupResult:
    busbw_gbps: float | None
    """None: the test did not complete in this group (the reason in ``error``)."""
    gflops: Mapping[str, float] = field(default_factory=dict)
    backend: str = ""
    error: str = ""


@dataclass
class Measured:
    """What one launch measured: the fleet's group, then every round's groups (by node name)."""

    fleet: GroupResult
    rounds: list[list[tuple[Group, GroupResult]]] = field(default_factory=list)
    confirm: list[list[tuple[Group, GroupResult]]] = field(default_factory=list)
    """The re-measure's rounds, (suspect, partner) each, as planned from the ring's figures."""

    def with_error(self, error: str) -> Measured:
        """The same figures, the fleet's error told more precisely (by whoever ran the launch)."""
        return Measured(GroupResult(None, error=error), self.rounds, self.confirm)


def schedule(nodes: Sequence[str]) -> list[list[Group]]:
    """``ring_rounds`` by node name (rank i is ``nodes[i]``)."""
    return [[tuple(nodes[r] for r in ranks) for ranks in groups] for groups in ring_rounds(len(nodes))]


def _figure(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < 1e6 else None


def parse_result(stdout: str, nodes: Sequence[str]) -> Measured:
    """Rank 0's last ``FLEETRUN_COLLECTIVE {json}`` line (untrusted: bounded, typed) against the
    schedule the laptop expects for ``nodes`` (rank i is ``nodes[i]``): a group that is not in
    the schedule is ignored, one of the schedule missing from the line is "not measured"."""
    expected = ring_rounds(len(nodes))
    if not expected:
        return Measured(GroupResult(None, error="fewer than two nodes"))
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith(MARK)), None)

    def failed(error: str) -> Measured:
        names = schedule(nodes)
        return Measured(
            GroupResult(None, error=error),
            [[(g, GroupResult(None, error=error)) for g in groups] for groups in names[1:]],
        )

    if line is None:
        return failed("no result line from rank 0")
    if len(line) > MAX_LINE:
        return failed(f"the result line is over {MAX_LINE} bytes")
    try:
        data = json.loads(line[len(MARK) :])
    except (ValueError, RecursionError):  # RecursionError: nested a million deep
        return failed("the result line is not JSON")
    if not isinstance(data, dict):
        return failed("the result line is not an object")
    if data.get("world") != len(nodes):
        return failed(f"the result is for {str(data.get('world'))[:20]} ranks, not {len(nodes)}")
    backend = data.get("backend") if data.get("backend") in ("gloo", "nccl") else ""
    flops: dict[str, float] = {}
    ranks = data.get("ranks")
    for i, entry in enumerate(ranks[: len(nodes)] if isinstance(ranks, list) else []):
        if isinstance(entry, dict) and (value := _figure(entry.get("gflops"))) is not None:
            flops[nodes[i]] = value
    figures: dict[tuple[int, tuple[int, ...]], float | None] = {}
    rounds = data.get("rounds")
    for index, groups in enumerate(rounds[: len(expected)] if isinstance(rounds, list) else []):
        for entry in groups[: len(nodes)] if isinstance(groups, list) else []:
            members = entry.get("ranks") if isinstance(entry, dict) else None
            if isinstance(members, list) and all(type(r) is int for r in members[: len(nodes) + 1]):
                figures[(index, tuple(members))] = _figure(entry.get("busbw_gbps"))

    def result(
        index: int, ranks: tuple[int, ...], got: dict[tuple[int, tuple[int, ...]], float | None]
    ) -> GroupResult:
        key = (index, ranks)
        if key not in got:
            return GroupResult(None, error="not measured (the launch ended before this round)")
        bw = got[key]
        if bw is None:
            return GroupResult(None, error="no bandwidth in the result")
        return GroupResult(bw, flops if index == 0 and got is figures else {}, str(backend))

    measured = Measured(result(0, expected[0][0], figures))
    for index, groups in enumerate(expected[1:], start=1):
        measured.rounds.append([(tuple(nodes[r] for r in g), result(index, g, figures)) for g in groups])
    # the re-measure as rank 0 planned it: recomputed here from the same figures, so a group
    # the line claims outside that plan is ignored like any group outside the schedule
    pairs = {
        g: v
        for index, groups in enumerate(expected[1:], start=1)
        for g in groups
        if (v := figures.get((index, g))) is not None
    }
    ranks_order = list(range(len(nodes)))
    plan = remeasure_plan(ranks_order, pairs)
    again: dict[tuple[int, tuple[int, ...]], float | None] = {}
    confirm = data.get("confirm")
    for index, groups in enumerate(confirm[: len(plan)] if isinstance(confirm, list) else []):
        for entry in groups[: len(nodes)] if isinstance(groups, list) else []:
            members = entry.get("ranks") if isinstance(entry, dict) else None
            if isinstance(members, list) and len(members) == 2 and all(type(r) is int for r in members):
                again[(index, tuple(members))] = _figure(entry.get("busbw_gbps"))
    for index, pair_round in enumerate(plan):
        measured.confirm.append([((nodes[a], nodes[b]), result(index, (a, b), again)) for a, b in pair_round])
    return measured


@dataclass
class CollectiveReport:
    fleet: GroupResult | None = None
    measured: list[tuple[Group, GroupResult]] = field(default_factory=list)
    """Every group measured, the fleet's first, in schedule order, then the re-measure's."""
    rounds: int = 0
    per_node: dict[str, float] = field(default_factory=dict)
    """Each node's figure: its best pair, the re-measure's included."""
    suspected: list[str] = field(default_factory=list)
    """Nodes whose ring pairs were slow because of them (re-measured)."""
    confirm: dict[str, tuple[str, GroupResult]] = field(default_factory=dict)
    """Each suspect's re-measure: (partner, result)."""
    suspected_links: list[tuple[str, str]] = field(default_factory=list)
    """The ring's pairs under ``link_ratio`` times the median, neither node suspected (re-measured)."""
    link_confirm: dict[tuple[str, str], GroupResult] = field(default_factory=dict)
    """Each suspected link's re-measure (the same pair again)."""
    slow: list[str] = field(default_factory=list)
    """The suspects their re-measure confirmed: the named ones."""
    slow_links: list[tuple[str, str]] = field(default_factory=list)
    """Slow pairs whose two nodes are fine in their other pair."""
    ring_per_node: dict[str, float] = field(default_factory=dict)
    """Each node's best pair in the ring alone (what it was suspected on)."""
    median_gbps: float | None = None
    """The ring's median node figure (before the re-measure: what the suspects were judged by)."""

    def to_json(self) -> dict[str, object]:
        return {
            "version": SAVED_VERSION,
            "fleet_gbps": None if self.fleet is None else self.fleet.busbw_gbps,
            "backend": None if self.fleet is None else self.fleet.backend,
            "gflops": {} if self.fleet is None else dict(self.fleet.gflops),
            "rounds": self.rounds,
            "groups": [
                {"nodes": list(g), "gbps": r.busbw_gbps, "error": r.error or None} for g, r in self.measured
            ],
            "per_node_gbps": dict(self.per_node),
            "suspected": list(self.suspected),
            "suspected_links": [list(p) for p in self.suspected_links],
            "confirm": [
                {"node": n, "partner": p, "gbps": r.busbw_gbps, "error": r.error or None}
                for n, (p, r) in self.confirm.items()
            ],
            "slow": list(self.slow),
            "slow_links": [list(p) for p in self.slow_links],
        }


def locate(
    nodes: Sequence[str], measured: Measured, ratio: float = SLOW_RATIO, link_ratio: float = LINK_RATIO
) -> CollectiveReport:
    """The slow nodes and links of one launch's figures (``parse_result``)."""
    report = CollectiveReport(fleet=measured.fleet, rounds=1 + len(measured.rounds))
    report.measured.append((tuple(nodes), measured.fleet))
    pairs: dict[Group, float] = {}
    for groups in measured.rounds:
        for group, result in groups:
            report.measured.append((group, result))
            if result.busbw_gbps is not None:
                pairs[group] = result.busbw_gbps
    if len(nodes) == 2 and measured.fleet.busbw_gbps is not None:
        report.per_node = {n: measured.fleet.busbw_gbps for n in nodes}  # the world is the pair
    report.per_node.update(best_of_pairs(nodes, pairs))
    report.ring_per_node = dict(report.per_node)
    if len(report.per_node) < 3:
        return report
    report.median_gbps = median = statistics.median(report.per_node.values())
    report.suspected = suspected(nodes, pairs, ratio)
    report.suspected_links = suspected_links(nodes, pairs, report.suspected, link_ratio)
    for groups in measured.confirm:
        for group, result in groups:
            report.measured.append((group, result))
            if group[0] in report.suspected and group[0] not in report.confirm:
                report.confirm[group[0]] = (group[1], result)
            elif (link := (group[0], group[1])) in report.suspected_links:
                report.link_confirm.setdefault(link, result)
            if result.busbw_gbps is not None:  # a pair like any other: the nodes' best includes it
                for node in group:
                    report.per_node[node] = max(report.per_node.get(node, 0.0), result.busbw_gbps)
    # named: still slow when its pair runs with a node not suspected and without the ring's load
    report.slow = [
        n
        for n in report.suspected
        if n in report.confirm
        and (again := report.confirm[n][1].busbw_gbps) is not None
        and again < ratio * median
    ]
    # a link too: named when the same pair, re-measured without the ring's load, is still slow
    report.slow_links = [
        link
        for link in report.suspected_links
        if (redo := report.link_confirm.get(link)) is not None
        and redo.busbw_gbps is not None
        and redo.busbw_gbps < link_ratio * median
    ]
    return report


def verdict_lines(report: CollectiveReport) -> list[tuple[str, str, str]]:
    """(node or 'fleet', level ok/warn/error, message) for the doctor."""
    lines: list[tuple[str, str, str]] = []
    fleet = report.fleet
    if fleet is None:
        return lines
    if fleet.busbw_gbps is None:
        lines.append(("fleet", "error", f"the all-reduce test did not complete: {fleet.error}"))
    else:
        flops = sorted(fleet.gflops.values())
        matmul = f", matmul {flops[0]:.1f}-{flops[-1]:.1f} GFLOP/s per node" if flops else ""
        ring = (
            f"; {len(report.suspected)} suspected in the ring of pairs, {len(report.slow)} confirmed by a re-measure"
            if report.median_gbps is not None
            else ""
        )
        if report.suspected_links:
            ring += f"; {len(report.suspected_links)} link(s) suspected, {len(report.slow_links)} confirmed"
        lines.append(
            (
                "fleet",
                "ok",
                f"all-reduce {fleet.busbw_gbps:.3f} GB/s over {fleet.backend or '?'}{matmul}{ring}",
            )
        )
    pairs = dict(report.measured)
    for node, figure in report.per_node.items():
        links = [p for p in report.slow_links if node in p]
        ring_figure = report.ring_per_node.get(node, figure)
        partner, again = report.confirm.get(node, ("", GroupResult(None, error="no node to pair it with")))
        if node in report.slow and report.median_gbps:
            lines.append(
                (
                    node,
                    "error",
                    f"{ring_figure:.3f} GB/s in its pair test, under {SLOW_RATIO:g}x the typical "
                    f"{report.median_gbps:.3f} GB/s, confirmed with {partner} "
                    f"({_bw(again):.3f} GB/s): a slow node or link",
                )
            )
        elif node in report.suspected and again.busbw_gbps is None and report.median_gbps:
            lines.append(
                (
                    node,
                    "warn",
                    f"{ring_figure:.3f} GB/s in its pair test, under {SLOW_RATIO:g}x the typical "
                    f"{report.median_gbps:.3f} GB/s, not confirmed: its re-measure"
                    f"{f' with {partner}' if partner else ''} has no figure ({again.error})",
                )
            )
        elif node in report.suspected:
            lines.append(
                (
                    node,
                    "ok",
                    f"{figure:.3f} GB/s in its pair test: {ring_figure:.3f} GB/s in the ring, "
                    f"cleared by its re-measure with {partner}",
                )
            )
        elif links and report.median_gbps:
            a, b = links[0]
            other = b if node == a else a
            lines.append(
                (
                    node,
                    "error",
                    f"{_bw(pairs.get(links[0])):.3f} GB/s in its pair test with {other}, under "
                    f"{LINK_RATIO:g}x the typical {report.median_gbps:.3f} GB/s, both fine in their "
                    f"other pair ({figure:.3f} GB/s here): a slow link between {a} and {b}",
                )
            )
        else:
            lines.append((node, "ok", f"{figure:.3f} GB/s in its pair test"))
    return lines


def _bw(result: GroupResult | None) -> float:
    return 0.0 if result is None or result.busbw_gbps is None else result.busbw_gbps


# -- history: this result against the earlier ones -------------------------------------------------
HISTORY_RUNS = 5
"""A figure is compared with the median of the last this many comparable results."""
HISTORY_RATIO = 0.7
"""Under this times its history's median, a figure is flagged (WARN)."""
MIN_HISTORY = 2
"""Fewer earlier figures than this: nothing to compare with yet."""
MAX_NODES = 4096
MAX_NAME = 255


def _gbps(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 <= value < 1e6):
        raise ValueError(f"{value!r} is not a bandwidth in GB/s")
    return value


class SavedResult(BaseModel):
    """One ``collective/<time>.json`` as ``fab doctor --collective`` saves it (fleetrun's own file,
    parsed like any other input: a newer fleetrun's extra fields are ignored, a wrong type or a
    value out of bounds names the field)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = Field(default=1, ge=1, le=1_000_000)
    """The format (``SAVED_VERSION``): 1 (no field) the bisection's, 2 the one launch's, 3 with
    the suspects' re-measure."""
    time: float = Field(ge=0, le=1e11)
    """When the test ran (Unix time)."""
    backend: str | None = Field(default=None, max_length=16)
    """``gloo`` or ``nccl`` (None: the fleet test did not complete)."""
    nodes: tuple[Annotated[str, Field(min_length=1, max_length=MAX_NAME)], ...] = Field(max_length=MAX_NODES)
    """The hosts measured, in order."""
    fleet_gbps: float | None = None
    """The whole group's all-reduce bus bandwidth."""
    per_node_gbps: dict[Annotated[str, Field(max_length=MAX_NAME)], float] = Field(
        default_factory=dict, max_length=MAX_NODES
    )
    """Each node's pair-test figure: its best pair (version 1: only the nodes the bisection paired)."""
    slow: tuple[Annotated[str, Field(max_length=MAX_NAME)], ...] = Field(default=(), max_length=MAX_NODES)
    """The nodes named slow (version 3: the suspects their re-measure confirmed)."""
    suspected: tuple[Annotated[str, Field(max_length=MAX_NAME)], ...] = Field(
        default=(), max_length=MAX_NODES
    )
    """The nodes the ring suspected and re-measured (version 3; none before)."""
    slow_links: tuple[
        tuple[Annotated[str, Field(max_length=MAX_NAME)], Annotated[str, Field(max_length=MAX_NAME)]], ...
    ] = Field(default=(), max_length=MAX_NODES)
    """Slow pairs whose two nodes were fine in their other pair (version 2; none in version 1)."""

    @field_validator("fleet_gbps")
    @classmethod
    def _fleet(cls, value: float | None) -> float | None:
        return _gbps(value)

    @field_validator("per_node_gbps")
    @classmethod
    def _per_node(cls, value: dict[str, float]) -> dict[str, float]:
        for figure in value.values():
            _gbps(figure)
        return value


def saved_result(text: str | bytes) -> SavedResult:
    """A saved result from its JSON text (strict types: no "1.5" for a number, no true for 1);
    ``ValueError`` naming the field when it is not one."""
    try:
        return SavedResult.model_validate_json(text, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise ValueError(f"not JSON ({first['msg'].removeprefix('Invalid JSON: ')})") from None
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"field {where!r}: {first['msg']}" if where else first["msg"]) from None


def comparable(current: SavedResult, earlier: SavedResult) -> bool:
    """The same backend, and at least half of the current hosts measured then too: a fleet's bus
    bandwidth is compared with the same (or mostly the same) fleet's."""
    if not current.backend or current.backend != earlier.backend:
        return False
    common = set(current.nodes) & set(earlier.nodes)
    return bool(common) and 2 * len(common) >= len(current.nodes)


@dataclass(frozen=True)
class HistoryFinding:
    """One figure against its history: ``node`` is ``fleet`` for the fleet's figure."""

    node: str
    level: str
    """``ok`` or ``warn``."""
    gbps: float
    median_gbps: float
    runs: int
    """How many earlier figures the median is of."""
    fleet: bool = False
    """The fleet's figure (``node`` is then ``fleet``), not a node's."""

    @property
    def ratio(self) -> float:
        return self.gbps / self.median_gbps if self.median_gbps > 0 else math.inf

    @property
    def message(self) -> str:
        below = f", under {HISTORY_RATIO:g}x" if self.level == "warn" else ""
        return (
            f"{self.gbps:.3g} GB/s, {self.ratio:.2f}x its median of the last {self.runs} doctor runs "
            f"({self.median_gbps:.3g} GB/s){below}"
        )


def _judge(
    node: str, figure: float, history: Sequence[float], ratio: float, fleet: bool = False
) -> HistoryFinding | None:
    if len(history) < MIN_HISTORY:
        return None
    median = statistics.median(history)
    level = "warn" if figure < ratio * median else "ok"
    return HistoryFinding(node, level, figure, median, len(history), fleet)


def compare_history(
    current: SavedResult,
    history: Sequence[SavedResult],
    runs: int = HISTORY_RUNS,
    ratio: float = HISTORY_RATIO,
) -> list[HistoryFinding]:
    """The fleet's figure against the median of the last ``runs`` comparable results, and each
    node's pair figure against the last ``runs`` figures of that node (same backend). ``history``:
    the earlier results, any order (the current one left out)."""
    ordered = sorted((h for h in history if h.time < current.time), key=lambda h: h.time)
    findings: list[HistoryFinding] = []
    if current.fleet_gbps is not None:
        fleet = [h.fleet_gbps for h in ordered if h.fleet_gbps is not None and comparable(current, h)]
        found = _judge("fleet", current.fleet_gbps, fleet[-runs:], ratio, fleet=True)
        if found is not None:
            findings.append(found)
    for node, figure in current.per_node_gbps.items():
        own = [
            h.per_node_gbps[node] for h in ordered if h.backend == current.backend and node in h.per_node_gbps
        ]
        found = _judge(node, figure, own[-runs:], ratio)
        if found is not None:
            findings.append(found)
    return findings


@dataclass(frozen=True)
class NodeHistory:
    """One node's pair figures over time, for ``fab doctor --collective-history``."""

    node: str
    backend: str
    figures: tuple[tuple[float, float], ...]
    """(time, GB/s), oldest first."""

    @property
    def median_gbps(self) -> float:
        return statistics.median(v for _t, v in self.figures)


def node_histories(results: Sequence[SavedResult]) -> list[NodeHistory]:
    """Each (node, backend)'s figures, oldest first; nodes in the order first seen."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for result in sorted(results, key=lambda r: r.time):
        for node, figure in result.per_node_gbps.items():
            found.setdefault((node, result.backend or "?"), []).append((result.time, figure))
    return [NodeHistory(node, backend, tuple(figures)) for (node, backend), figures in found.items()]
