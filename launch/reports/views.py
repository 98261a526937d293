"""What the user sees in the terminal: the live status table, run lists and one run's record.

Pure: functions take data (an :class:`~launch.rules.stoprules.Observation`, :class:`~launch.run.records.RunRecord`
rows) and return rich renderables or strings; the commands decide when to print.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from io import StringIO
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launch.reports.run_record import RunRecord
from launch.reports.safe_text import clean, safe_text
from launch.rules.pricing import cost_so_far
from launch.rules.stoprules import NodeObservation, Observation, StopDecision


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_cost(usd: float | None) -> str:
    return "n/a" if usd is None else f"${usd:,.2f}"


def fmt_number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def fmt_time(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(unix))


def _add_row(table: Table, *cells: RenderableType) -> None:
    """Add a row with plain strings taken literally: a reason like ``[rank_failed]`` or a
    node name must never be read as rich markup."""
    table.add_row(*(safe_text(c) if isinstance(c, str) else c for c in cells))


_STATE_STYLE = {
    "running": "green",
    "succeeded": "bold green",
    "failed": "bold red",
    "stopped": "yellow",
    "interrupted": "magenta",
    "vanished": "red",
    "unreachable": "yellow",
}


def _node_state(node: NodeObservation, now: float) -> Text:
    if node.state == "exited":
        code = node.exit_code
        return Text(f"exited {code}", style="blue" if code == 0 else "bold red")
    label: str = node.state
    if node.state == "unreachable" and node.last_reachable_at is not None:
        label += f" {fmt_duration(now - node.last_reachable_at)}"
    return safe_text(label, style=_STATE_STYLE.get(node.state, ""))


def render_text(renderable: RenderableType, *, width: int = 100) -> str:
    """Render to plain text (no colour codes): for logs, tests and non-terminal output."""
    buffer = StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(renderable)
    return buffer.getvalue()


# ---------------------------------------------------------------- live view


def live_table(obs: Observation, *, title: str | None = None, decision: StopDecision | None = None) -> Table:
    """The table the watcher redraws each poll: one row per node and a bold ``run`` row.

    Metrics come from global rank 0 only, so step, loss and steps/s belong to the run, not
    to a node. Cost is per node at the observation's price (``n/a`` when unknown).
    """
    elapsed = obs.elapsed_s
    price = obs.price_per_node_hour
    table = Table(title=None if title is None else safe_text(title), title_justify="left", expand=False)
    for name, justify in (
        ("node", "left"),
        ("state", "left"),
        ("step", "right"),
        ("loss", "right"),
        ("steps/s", "right"),
        ("GPU", "right"),
        ("elapsed", "right"),
        ("cost", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    node_cost = fmt_cost(cost_so_far(1, price, elapsed)) if price > 0 else "n/a"
    for node in obs.nodes:
        gpu = "-" if node.gpu_util is None else f"{node.gpu_util:.0f}%"
        _add_row(
            table, node.node, _node_state(node, obs.now), "", "", "", gpu, fmt_duration(elapsed), node_cost
        )
    m = obs.metrics
    rate = "-" if m.steps_per_second is None else f"{m.steps_per_second:.2f}"
    total = fmt_cost(cost_so_far(obs.fleet_size, price, elapsed)) if price > 0 else "n/a"
    state = Text(decision.outcome, style=_STATE_STYLE[decision.outcome]) if decision else Text("watching")
    table.add_section()
    _add_row(
        table,
        Text("run", style="bold"),
        state,
        fmt_number(m.last_step),
        fmt_number(m.last_loss),
        rate,
        "",
        fmt_duration(elapsed),
        total,
    )
    if m.bad_lines:
        table.caption = f"{m.bad_lines} unreadable metrics line(s) skipped"
    return table


# ---------------------------------------------------------------- records views


def _exit_codes_table(codes: Mapping[str, int | None]) -> Table:
    table = Table(show_header=True, box=None, pad_edge=False)
    table.add_column("node")
    table.add_column("exit code", justify="right")
    for node, code in codes.items():
        style = "" if code is None else "green" if code == 0 else "bold red"
        _add_row(table, node, Text("-" if code is None else str(code), style=style))
    return table


def _metrics_line(metrics: Mapping[str, Any]) -> str:
    return clean("  ".join(f"{clean(k, 100)}={fmt_number(v)}" for k, v in metrics.items()) or "-")


def summary_panel(record: RunRecord) -> Panel:
    """The end-of-run summary: outcome and reason first, then what to look at next."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    _add_row(grid, "outcome", Text(record.state, style=_STATE_STYLE.get(record.state, "")))
    if record.stop_reason:
        _add_row(
            grid,
            "reason",
            f"{record.stop_reason} [{record.stop_rule}]" if record.stop_rule else record.stop_reason,
        )
    _add_row(grid, "duration", fmt_duration(record.duration_s()))
    _add_row(grid, "cost (approx.)", fmt_cost(record.cost_usd))
    _add_row(grid, "last metrics", _metrics_line(record.last_metrics))
    if record.exit_codes:
        _add_row(grid, "exit codes", _exit_codes_table(record.exit_codes))
    _add_row(grid, "run folder", record.run_dir or "-")
    for artifact in record.artifacts:
        _add_row(grid, "", artifact)
    border = _STATE_STYLE.get(record.state, "").replace("bold ", "") or "white"
    return Panel(
        grid, title=safe_text(f"run {record.id}"), title_align="left", border_style=border, expand=False
    )


def runs_table(records: Sequence[RunRecord], *, now: float | None = None) -> Table:
    """``fab runs``: one line per run, newest first (as ``RunRecords.list`` returns them)."""
    table = Table(title="runs", title_justify="left")
    for name in ("id", "playbook", "state", "rule", "started", "duration", "cost", "commit"):
        table.add_column(name, no_wrap=name in ("id", "started", "commit", "duration", "cost"))
    for r in records:
        _add_row(
            table,
            r.id,
            r.playbook_name or r.playbook_path or "-",
            Text(r.state, style=_STATE_STYLE.get(r.state, "")),
            r.stop_rule or "-",
            fmt_time(r.started_at),
            fmt_duration(r.duration_s(now)),
            fmt_cost(r.cost_usd),
            (r.git_commit or "-")[:12] + ("-dirty" if (r.git_commit or "").endswith("-dirty") else ""),
        )
    if not records:
        table.caption = "no runs recorded yet"
    return table


def profile_traces(artifacts: Sequence[str]) -> tuple[list[str], list[str]]:
    """The profiler's files among a run's artifacts (``fleetrun_profile`` writes them on the nodes):
    the Chrome traces, and each node's ``profile`` folder in TensorBoard's profiler layout."""
    traces, boards = [], []
    for path in artifacts:
        parts = str(path).split("/")
        if len(parts) == 4 and parts[0] == "nodes" and parts[2] == "profile":
            if parts[3].startswith("trace-rank") and parts[3].endswith(".json"):
                traces.append(clean(path, 400))
        elif len(parts) >= 6 and parts[0] == "nodes" and parts[2:5] == ["profile", "plugins", "profile"]:
            board = clean("/".join(parts[:3]), 400)
            if board not in boards:
                boards.append(board)
    return traces, boards


def show_run(record: RunRecord, *, now: float | None = None) -> Group:
    """``fab show <id>``: every field of one run, then the end-of-run summary."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("playbook", f"{record.playbook_name or '-'} ({record.playbook_path or '-'})"),
        ("playbook sha256", record.playbook_hash or "-"),
        ("git commit", record.git_commit or "- (not a git repository)"),
        ("launcher", record.launcher or "-"),
        ("started", fmt_time(record.started_at)),
        ("ended", fmt_time(record.ended_at)),
        ("state", record.state),
        (
            "watcher",
            f"pid {record.watcher_pid} on {record.watcher_host}, heartbeat {fmt_time(record.heartbeat_at)}",
        ),
    ]
    for key, value in rows:
        _add_row(grid, key, value)
    traces, boards = profile_traces(record.artifacts)
    base = clean(record.run_dir, 400).rstrip("/") + "/" if record.run_dir else ""
    for i, trace in enumerate(traces):
        _add_row(grid, "profile" if i == 0 else "", f"{base}{trace}")
    if traces:
        _add_row(grid, "", "(Chrome traces: open in ui.perfetto.dev or chrome://tracing)")
    for board in boards:
        _add_row(grid, "" if traces else "profile", f"tensorboard --logdir {base}{board}")
    # the record holds the inventory as ``Inventory.to_yaml_data()``: its hosts, in rank order
    hosts = record.inventory.get("hosts") if isinstance(record.inventory, dict) else None
    if isinstance(hosts, list):
        names = [clean(h.get("name", "?"), 100) if isinstance(h, dict) else clean(h, 100) for h in hosts]
        _add_row(grid, "nodes", f"{len(names)}: {', '.join(names)}")
    if record.hyperparameters:
        hps = ", ".join(f"{k}={fmt_number(v)}" for k, v in sorted(record.hyperparameters.items()))
        _add_row(grid, "hyperparameters", clean(hps, 2000))
    if record.attempts:
        return Group(grid, attempts_table(record.attempts), summary_panel(record))
    return Group(grid, summary_panel(record))


def _listed(value: object) -> list[Any]:
    """A record's list field, or nothing when it holds something else (a string, a number)."""
    return value[:100] if isinstance(value, list) else []


def attempts_table(attempts: Sequence[Mapping[str, Any]]) -> Table:
    """One row per attempt of a run (``recovery:``): its nodes, how it ended, steps done again.

    The entries come from the run record, which a newer fleetrun may have written: every value
    is shown through ``clean`` and a missing one as ``-``."""
    table = Table(title="attempts", title_justify="left")
    for name in ("#", "nodes", "ended", "why", "steps", "recomputed", "replaced / dropped"):
        table.add_column(name, overflow="fold")
    for entry in attempts[:100]:
        if not isinstance(entry, Mapping):
            continue
        nodes = entry.get("nodes")
        first, last = entry.get("first_step"), entry.get("last_step")
        changed = [f"+{n}" for n in _listed(entry.get("replaced"))] + [
            f"-{n}" for n in _listed(entry.get("dropped"))
        ]
        _add_row(
            table,
            clean(entry.get("attempt", "-"), 10),
            clean(", ".join(str(n) for n in nodes) if isinstance(nodes, list) else "-", 400),
            Text(clean(entry.get("outcome", "-"), 20), style=_STATE_STYLE.get(str(entry.get("outcome")), "")),
            clean(f"{entry.get('loss') or entry.get('rule') or '-'}: {entry.get('reason') or ''}", 300),
            clean(f"{first if first is not None else '-'}..{last if last is not None else '-'}", 40),
            clean(entry.get("steps_recomputed") if entry.get("steps_recomputed") is not None else "-", 20),
            clean(" ".join(changed) or "-", 200),
        )
    return table
