"""``fab doctor --collective``: find the slow node or link from all-reduce figures. Pure: the
measurements come from a callback (``launch.run.collective`` runs them through torchrun).

1. The whole group: the fleet's all-reduce bus bandwidth (GB/s).
2. Bisection, not all pairs: split the candidates in two halves and measure both at once; while
   one half is under ``ratio`` times the other, the slow node is in it (the faster half's first
   node becomes the reference). Halves alike: no single node explains it, stop.
3. Each remaining candidate paired with the reference (or, with no reference, in a ring of pairs:
   a node's figure is its best pair, so only the node in every slow pair is low).
4. A node under ``ratio`` times the median node's figure is named slow.

For 16 nodes with one slowed link: 1 + 3 halving rounds + 2 pairs = 6 measurements, about log2(N)+3.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SLOW_RATIO = 0.5
MARK = "FLEETRUN_COLLECTIVE "
MAX_LINE = 64 * 1024

Group = tuple[str, ...]
Measure = Callable[[Sequence[Group]], Mapping[Group, "GroupResult"]]


@dataclass(frozen=True)
class GroupResult:
    busbw_gbps: float | None
    """None: the test did not complete in this group (the reason in ``error``)."""
    gflops: Mapping[str, float] = field(default_factory=dict)
    backend: str = ""
    error: str = ""


def parse_result(stdout: str, hosts_by_hostname: Mapping[str, str] | None = None) -> GroupResult:
    """Rank 0's ``FLEETRUN_COLLECTIVE {json}`` line (untrusted: bounded, typed) as a result."""
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith(MARK)), None)
    if line is None or len(line) > MAX_LINE:
        return GroupResult(None, error="no result line from rank 0")
    try:
        data = json.loads(line[len(MARK) :])
    except ValueError:
        return GroupResult(None, error="the result line is not JSON")
    if not isinstance(data, dict):
        return GroupResult(None, error="the result line is not an object")
    bw = data.get("busbw_gbps")
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or not 0 <= bw < 1e6:
        return GroupResult(None, error="no bandwidth in the result")
    flops: dict[str, float] = {}
    ranks = data.get("ranks")
    for entry in ranks[:4096] if isinstance(ranks, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("host"), str):
            value = entry.get("gflops")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                name = (hosts_by_hostname or {}).get(entry["host"], entry["host"])
                flops[name[:255]] = float(value)
    backend = data.get("backend") if data.get("backend") in ("gloo", "nccl") else ""
    return GroupResult(float(bw), flops, str(backend))


@dataclass
class CollectiveReport:
    fleet: GroupResult | None = None
    measured: list[tuple[Group, GroupResult]] = field(default_factory=list)
    per_node: dict[str, float] = field(default_factory=dict)
    """Each candidate's figure: its pair with the reference, or its best pair in the ring."""
    slow: list[str] = field(default_factory=list)
    median_gbps: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "fleet_gbps": None if self.fleet is None else self.fleet.busbw_gbps,
            "backend": None if self.fleet is None else self.fleet.backend,
            "gflops": {} if self.fleet is None else dict(self.fleet.gflops),
            "groups": [
                {"nodes": list(g), "gbps": r.busbw_gbps, "error": r.error or None} for g, r in self.measured
            ],
            "per_node_gbps": dict(self.per_node),
            "slow": list(self.slow),
        }


def _bw(result: GroupResult | None) -> float:
    return 0.0 if result is None or result.busbw_gbps is None else result.busbw_gbps


def locate(nodes: Sequence[str], measure: Measure, ratio: float = SLOW_RATIO) -> CollectiveReport:
    report = CollectiveReport()

    def run(groups: Sequence[Group]) -> Mapping[Group, GroupResult]:
        found = measure(groups)
        report.measured.extend((g, found.get(g, GroupResult(None, error="not run"))) for g in groups)
        return found

    everyone = tuple(nodes)
    if len(everyone) < 2:
        return report
    report.fleet = run([everyone]).get(everyone)
    candidates = list(everyone)
    reference: str | None = None
    while len(candidates) >= 4:
        half = len(candidates) // 2
        a, b = tuple(candidates[:half]), tuple(candidates[half:])
        found = run([a, b])
        fa, fb = _bw(found.get(a)), _bw(found.get(b))
        if fa < ratio * fb:
            candidates, reference = list(a), b[0]
        elif fb < ratio * fa:
            candidates, reference = list(b), a[0]
        else:
            break
    if reference is not None:
        for node in candidates:
            pair = (node, reference)
            report.per_node[node] = _bw(run([pair]).get(pair))
    elif len(candidates) <= 3:
        pairs = [(candidates[i], candidates[(i + 1) % len(candidates)]) for i in range(len(candidates))]
        ring: list[Group] = list(dict.fromkeys(tuple(sorted(p)) for p in pairs))  # two nodes: one pair
        figures = {p: _bw(run([p]).get(p)) for p in ring}
        for node in candidates:
            report.per_node[node] = max(v for p, v in figures.items() if node in p)
    if len(report.per_node) >= 2:
        median = statistics.median(report.per_node.values())
        if reference is not None and report.fleet is not None:
            # the reference's own half was fast: its figure is the typical one
            median = max(
                median, _bw(next((r for g, r in report.measured if reference in g and len(g) > 2), None))
            )
        report.median_gbps = median
        if len(report.per_node) >= 3 or reference is not None:
            report.slow = [n for n, v in report.per_node.items() if v < ratio * median]
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
        lines.append(
            ("fleet", "ok", f"all-reduce {fleet.busbw_gbps:.3f} GB/s over {fleet.backend or '?'}{matmul}")
        )
    for node, figure in report.per_node.items():
        if node in report.slow and report.median_gbps:
            lines.append(
                (
                    node,
                    "error",
                    f"{figure:.3f} GB/s in its pair test, under {SLOW_RATIO:g}x the typical "
                    f"{report.median_gbps:.3f} GB/s: a slow node or link",
                )
            )
        else:
            lines.append((node, "ok", f"{figure:.3f} GB/s in its pair test"))
    return lines


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
    """Each node's pair-test figure (only the nodes the bisection paired)."""
    slow: tuple[Annotated[str, Field(max_length=MAX_NAME)], ...] = Field(default=(), max_length=MAX_NODES)

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
