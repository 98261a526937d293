"""Per-node cells of the live table: the node's pace (steps/s, its probe against the median node's)
and its GPUs' telemetry (utilisation, memory, temperature, power), from what the watcher polled.

Everything shown came from a node, already parsed into numbers (``launch.rules.gpu_health``,
``launch.rules.stragglers``), so no text of the node's reaches the terminal here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.text import Text

from launch.rules.stoprules import NodeObservation
from launch.rules.stragglers import pace_ratios


def ratios(nodes: Sequence[NodeObservation]) -> dict[str, float]:
    return pace_ratios({n.node: n.pace for n in nodes if n.state == "running"})


def pace_cell(node: NodeObservation, ratio: Mapping[str, float], flagged: set[str]) -> Text:
    """``1.20 (2.3x)``: the node's own steps/s, and how much slower its probe runs than the median
    node's when that is 1.2x or more (bold red when the straggler rule flags it)."""
    pace = node.pace
    slow = ratio.get(node.node, 1.0)
    if math.isinf(slow):  # its ranks stopped reporting while the others go on
        return Text("stalled", style="bold red" if node.node in flagged else "")
    if pace is None:
        return Text("")
    rate = "-" if pace.steps_per_s is None else f"{pace.steps_per_s:.2f}"
    if node.node in flagged:
        return Text(f"{rate} ({slow:.1f}x)", style="bold red")
    return Text(f"{rate} ({slow:.1f}x)" if slow >= 1.2 else rate)


def gpu_cell(node: NodeObservation) -> str:
    """``87% 61/80G 71C 412W``: mean utilisation, memory used/total (GiB), hottest GPU, total power."""
    health = node.gpu_health
    if health is None or not health.gpus:
        return "-" if node.gpu_util is None else f"{node.gpu_util:.0f}%"
    parts = ["-" if node.gpu_util is None else f"{node.gpu_util:.0f}%"]
    used = [g.mem_used_mib for g in health.gpus if g.mem_used_mib is not None]
    total = [g.mem_total_mib for g in health.gpus if g.mem_total_mib is not None]
    if used and total:
        parts.append(f"{sum(used) / 1024:.0f}/{sum(total) / 1024:.0f}G")
    temps = [g.temp_c for g in health.gpus if g.temp_c is not None]
    if temps:
        parts.append(f"{max(temps):.0f}C")
    power = [g.power_w for g in health.gpus if g.power_w is not None]
    if power:
        parts.append(f"{sum(power):.0f}W")
    if any(g.throttle for g in health.gpus):
        parts.append("throttled")
    return " ".join(parts)


def pace_caption(nodes: Sequence[NodeObservation]) -> str:
    """``slowest/median pace 2.3x (node-2)``, or '' with fewer than two nodes reporting."""
    found = ratios(nodes)
    if not found:
        return ""
    node, ratio = max(found.items(), key=lambda item: item[1])
    if math.isinf(ratio):
        return f"no pace report from {node} (its ranks stopped stepping)"
    return f"slowest/median pace {ratio:.1f}x ({node})"
