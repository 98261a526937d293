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
