"""``fab doctor --collective-history``: the saved collective figures over time, per fleet and per
node, each against the median of the results before it (``launch.rules.collective``).

Node names and backends come from saved files: printed through ``safe_text``/``clean``, never
as markup.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from launch.reports.safe_text import clean, safe_text
from launch.rules.collective import (
    HISTORY_RATIO,
    HISTORY_RUNS,
    HistoryFinding,
    SavedResult,
    compare_history,
    node_histories,
)

SHOWN_RESULTS = 20
"""Rows of the fleet table: the newest results (the medians still use every result read)."""
STYLE = {"ok": "", "warn": "yellow"}


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(unix))


def _nodes(names: Sequence[str]) -> str:
    shown = ", ".join(clean(n, 64) for n in names[:4])
    return f"{len(names)}: {shown}" + (", ..." if len(names) > 4 else "")


def _against(finding: HistoryFinding | None) -> Text:
    if finding is None:
        return Text("-")
    return Text(f"{finding.ratio:.2f}x of {finding.median_gbps:.3g}", style=STYLE.get(finding.level, ""))


def history_view(results: Sequence[SavedResult], runs: int = HISTORY_RUNS) -> Group:
    """A table of the fleet figures (newest last) and one of each node's pair figures."""
    ordered = sorted(results, key=lambda r: r.time)
    fleet = Table(title="collective history: fleet", title_justify="left")
    for name in ("when", "backend", "nodes", "GB/s", f"vs median of last {runs}", "named slow"):
        fleet.add_column(name, no_wrap=name != "nodes", overflow="fold")
    for i, result in enumerate(ordered):
        if i < len(ordered) - SHOWN_RESULTS:
            continue
        found = next((f for f in compare_history(result, ordered[:i], runs) if f.fleet), None)
        fleet.add_row(
            _when(result.time),
            safe_text(result.backend or "-", limit=16),
            safe_text(_nodes(result.nodes), limit=400),
            "-" if result.fleet_gbps is None else f"{result.fleet_gbps:.3g}",
            _against(found),
            safe_text(", ".join(result.slow[:8]) or "-", limit=400),
        )
    if not ordered:
        fleet.caption = "no collective results saved yet: run fab doctor --collective"
    elif len(ordered) > SHOWN_RESULTS:
        fleet.caption = f"the newest {SHOWN_RESULTS} of {len(ordered)} results"
    nodes = Table(title="collective history: per node (pair tests)", title_justify="left")
    for name in ("node", "backend", "runs", "median GB/s", "latest", "latest vs the runs before", "recent"):
        nodes.add_column(name, no_wrap=name not in ("node", "recent"), overflow="fold")
    latest_of: dict[tuple[str, str], tuple[float, HistoryFinding]] = {}
    for i, result in enumerate(ordered):
        for each in compare_history(result, ordered[:i], runs):
            if not each.fleet:
                latest_of[(each.node, result.backend or "?")] = (result.time, each)
    for history in node_histories(ordered):
        last_time, last = history.figures[-1]
        seen = latest_of.get((history.node, history.backend))
        finding = seen[1] if seen is not None and seen[0] == last_time else None
        nodes.add_row(
            safe_text(history.node, limit=64),
            safe_text(history.backend, limit=16),
            str(len(history.figures)),
            f"{history.median_gbps:.3g}",
            f"{last:.3g}",
            _against(finding),
            " ".join(f"{v:.3g}" for _t, v in history.figures[-runs:]),
        )
    if ordered and not nodes.rows:
        nodes.caption = (
            "no pair figures saved yet (files from before the ring of pairs have only the fleet's)"
        )
    else:
        nodes.caption = f"flagged (yellow) under {HISTORY_RATIO:g}x the median of the last {runs} figures"
    return Group(fleet, nodes)
