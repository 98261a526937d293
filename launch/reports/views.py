"""What the user sees in the terminal: the live status table, run lists and one run's record.

Pure: functions take data (an :class:`~launch.rules.stoprules.Observation`, :class:`~launch.reports.run_record.RunRecord`
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

from launch.reports import gpu_view
from launch.reports.run_record import RunRecord
from launch.reports.safe_text import clean, safe_text
from launch.rules.energy import RunEnergy, fmt_kwh, kwh_figure
from launch.rules.pricing import cost_so_far
from launch.rules.stoprules import NodeObservation, Observation, RuleState, StopDecision


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


PROGRESS_KEY = "progress"
"""The metric the helper logs when the job states its total steps: step / total, 0 to 1."""


def progress_of(metrics: Mapping[str, Any]) -> float | None:
    """The run's progress (0..1) from its last metrics; None when the job stated no total."""
    value = metrics.get(PROGRESS_KEY)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1.0)


def eta_s(progress: float | None, seconds_so_far: float | None) -> float | None:
    """Seconds left if the rest goes at the pace so far: ``seconds_so_far`` took ``progress``."""
    if progress is None or seconds_so_far is None or progress <= 0 or seconds_so_far <= 0:
        return None
    return seconds_so_far * (1.0 - progress) / progress


def fmt_progress(progress: float | None, eta: float | None = None) -> str:
    """``42% ETA 3:10`` (``-`` without a total; no ETA once done or unknown)."""
    if progress is None:
        return "-"
    shown = f"{progress * 100:.0f}%"
    return f"{shown} ETA {fmt_duration(eta)}" if eta is not None and progress < 1.0 else shown


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


def live_progress(metrics: Mapping[str, Any], step: int | None, steps_per_s: float | None) -> str:
    """Progress and ETA while watching: steps left (from step and progress) at the current pace."""
    progress = progress_of(metrics)
    eta = None
    if progress is not None and progress > 0 and step and steps_per_s:
        eta = (step / progress - step) / steps_per_s
    return fmt_progress(progress, eta)


def live_table(
    obs: Observation,
    *,
    title: str | None = None,
    decision: StopDecision | None = None,
    rule_state: RuleState | None = None,
) -> Table:
    """The table the watcher redraws each poll: one row per node and a bold ``run`` row.

    The run row's step, loss and steps/s are global rank 0's; a node row shows what its own ranks
    logged last (usually only rank 0's node logs), also after the node exited. Cost is per node at
    the observation's price (``n/a`` when unknown).
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
        ("progress", "right"),
        ("GPU", "right"),
        ("elapsed", "right"),
        ("cost", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    node_cost = fmt_cost(cost_so_far(1, price, elapsed)) if price > 0 else "n/a"
    ratio, flagged = (
        gpu_view.ratios(obs.nodes),
        {n for n, _, _ in (rule_state.stragglers if rule_state else ())},
    )
    for node in obs.nodes:
        pace, gpu = gpu_view.pace_cell(node, ratio, flagged), gpu_view.gpu_cell(node)
        step = "" if node.last_step is None else fmt_number(node.last_step)
        loss = "" if node.last_loss is None else fmt_number(node.last_loss)
        _add_row(
            table,
            node.node,
            _node_state(node, obs.now),
            step,
            loss,
            pace,
            "",
            gpu,
            fmt_duration(elapsed),
            node_cost,
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
        live_progress(m.last_metrics, m.last_step, m.steps_per_second),
        "",
        fmt_duration(elapsed),
        total,
    )
    captions = [gpu_view.pace_caption(obs.nodes)]
    if m.bad_lines:
        captions.append(f"{m.bad_lines} unreadable metrics line(s) skipped")
    if any(captions):
        table.caption = "; ".join(c for c in captions if c)
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


MAX_LISTED_OUTPUTS = 20
_PLOT_SUFFIXES = (".png", ".svg", ".pdf")
_OUTPUT_DIRS = ("outputs", "output", "model", "checkpoints")


def user_artifacts(artifacts: Sequence[str]) -> tuple[list[tuple[str, list[str]]], int]:
    """What a user looks for in a run folder, grouped (plots, logs, the job's outputs, the
    TensorBoard folder), and how many other files there are: the run folder also holds
    fleetrun's own bookkeeping (``pid``, ``rc``, ``heartbeat``, ``launch.sh``, ``status.json``...),
    which listed one per line buried the loss plot and the model. Profiler files are left to
    ``show_run``'s profile lines."""
    plots: list[str] = []
    logs: list[str] = []
    outputs: list[str] = []
    boards: list[str] = []
    internal = 0
    for raw in artifacts:
        path = clean(raw, 400)
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == "nodes" and parts[2] == "profile":
            continue
        in_node = len(parts) >= 3 and parts[0] == "nodes"
        if (in_node and parts[2] in _OUTPUT_DIRS) or parts[0] in _OUTPUT_DIRS:
            outputs.append(path)
        elif parts[0] == "tensorboard" or "tensorboard" in parts[:-1]:
            board = "/".join(parts[: parts.index("tensorboard") + 1])
            if board not in boards:
                boards.append(board)
        elif path.endswith(_PLOT_SUFFIXES):
            plots.append(path)
        elif parts[-1].endswith(".log"):
            logs.append(path)
        else:
            internal += 1
    if len(outputs) > MAX_LISTED_OUTPUTS:
        more = len(outputs) - MAX_LISTED_OUTPUTS
        outputs = [*outputs[:MAX_LISTED_OUTPUTS], f"... and {more} more"]
    groups = [
        ("plots", plots),
        ("logs", logs),
        ("outputs", outputs),
        ("tensorboard", [b + "/" for b in boards]),
    ]
    return [(label, paths) for label, paths in groups if paths], internal


def energy_text(record: RunRecord) -> str:
    """``0.412 kWh over 2 attempts`` from the record (untrusted figures: ``kwh_figure``)."""
    total = kwh_figure(record.energy_kwh)
    if total is None:
        return "- (no GPU power readings)"
    counted = RunEnergy.from_json(record.energy_by_attempt).attempts
    over = f" over {counted} attempts" if counted > 1 else ""
    return f"{fmt_kwh(total)} kWh{over}"


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
    _add_row(grid, "GPU energy", energy_text(record))
    _add_row(grid, "last metrics", _metrics_line(record.last_metrics))
    if record.exit_codes:
        _add_row(grid, "exit codes", _exit_codes_table(record.exit_codes))
    _add_row(grid, "run folder", record.run_dir or "-")
    groups, internal = user_artifacts(record.artifacts)
    for label, paths in groups:
        for i, path in enumerate(paths):
            _add_row(grid, label if i == 0 else "", path)
    if internal:
        _add_row(
            grid, "", f"(and {internal} file(s) of fleetrun's own: plan, pids, exit codes, heartbeats...)"
        )
    border = _STATE_STYLE.get(record.state, "").replace("bold ", "") or "white"
    return Panel(
        grid, title=safe_text(f"run {record.id}"), title_align="left", border_style=border, expand=False
    )


RUN_COLUMNS = ("state", "id", "playbook", "rule", "started", "duration", "progress", "cost", "kWh", "commit")
"""``fab runs``' columns, left to right: the outcome first. ``kWh``: the GPU energy over every
attempt, blank without GPU power readings."""
RUN_COLUMNS_DROPPED_FIRST = ("commit", "kWh", "cost", "duration", "started", "progress", "playbook")
"""What a narrow terminal leaves out, in this order; the outcome, the id and the stop rule stay."""
_PLAYBOOK_MAX = 24  # a longer playbook name is cut ('…') rather than squeezing the other columns


def short_run_id(run_id: str) -> str:
    """The last part of a run id (``digits-ddp-20261125-153617-36db57`` -> ``36db57``): its random
    part, which ``fab show`` and the other commands accept as well (the job and the time are in
    their own columns)."""
    tail = run_id.rsplit("-", 1)[-1]
    return tail if tail and tail != run_id else run_id


def _table_width(widths: Mapping[str, int]) -> int:
    """Rich's width for columns of these cell widths: one space each side and a rule between."""
    return sum(widths.values()) + 3 * len(widths) + 1


def _run_progress(record: RunRecord, now: float | None) -> str:
    """Progress and, while running, an ETA from the run's whole duration (setup included)."""
    progress = progress_of(record.last_metrics)
    eta = eta_s(progress, record.duration_s(now)) if record.state == "running" else None
    return fmt_progress(progress, eta)


def runs_table(records: Sequence[RunRecord], *, now: float | None = None, width: int | None = None) -> Table:
    """``fab runs``: one line per run, newest first (as ``RunRecords.list`` returns them).

    ``width`` (the terminal's): the outcome comes first and is never cut; when every column does
    not fit, ids are shortened to their random part, then columns are left out in the order of
    ``RUN_COLUMNS_DROPPED_FIRST`` (the caption names them), rather than squeezing every column
    until the outcome read ``┃┃┃`` while the id and the commit kept their full width."""
    rows = [
        {
            "state": r.state,
            "id": r.id,
            "job": r.scheduler_jobs or "-",
            "playbook": r.playbook_name or r.playbook_path or "-",
            "rule": r.stop_rule or "-",
            "started": fmt_time(r.started_at),
            "duration": fmt_duration(r.duration_s(now)),
            "progress": _run_progress(r, now),
            "cost": fmt_cost(r.cost_usd),
            "kWh": fmt_kwh(kwh_figure(r.energy_kwh)),
            "commit": (r.git_commit or "-")[:12]
            + ("-dirty" if (r.git_commit or "").endswith("-dirty") else ""),
        }
        for r in records
    ]
    rows = [{k: clean(v, 400) for k, v in row.items()} for row in rows]
    columns, short_ids = list(RUN_COLUMNS), False
    if any(r.scheduler_jobs for r in records):  # a scheduler's job ids (Slurm), beside the run id
        columns.insert(columns.index("id") + 1, "job")
    if width is not None and rows:

        def needed(names: Sequence[str], short: bool) -> int:
            widths = {}
            for name in names:
                cells = [short_run_id(row[name]) if name == "id" and short else row[name] for row in rows]
                widths[name] = max(len(name), *(len(c) for c in cells))
                if name == "playbook":
                    widths[name] = min(widths[name], _PLAYBOOK_MAX)
            return _table_width(widths)

        if needed(columns, False) > width:
            short_ids = True
            for name in RUN_COLUMNS_DROPPED_FIRST:
                if needed(columns, True) <= width:
                    break
                columns.remove(name)
    table = Table(title="runs", title_justify="left")
    for name in columns:
        if name == "playbook":
            table.add_column(name, max_width=_PLAYBOOK_MAX, no_wrap=True, overflow="ellipsis")
        else:
            table.add_column(name, no_wrap=True, min_width=len(name) if name != "state" else None)
    if "state" in columns:  # the outcome is never cut: its column is as wide as its longest value
        table.columns[0].min_width = max([len("state"), *(len(row["state"]) for row in rows)])
    for record, row in zip(records, rows, strict=True):
        cells: list[RenderableType] = []
        for name in columns:
            if name == "state":
                cells.append(Text(row["state"], style=_STATE_STYLE.get(record.state, "")))
            elif name == "id" and short_ids:
                cells.append(short_run_id(row["id"]))
            else:
                cells.append(row[name])
        _add_row(table, *cells)
    if not records:
        table.caption = "no runs recorded yet"
    elif any(n not in columns for n in RUN_COLUMNS):
        left_out = ", ".join(n for n in RUN_COLUMNS if n not in columns)
        table.caption = f"too narrow for {left_out} (fab runs --json has every field)"
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


def overrides_text(overrides: Mapping[str, Any]) -> str:
    """A run's ``--set`` as typed again: ``nodes=2 hyperparameters.lr=0.01`` (values from the record)."""
    return " ".join(f"{k}={fmt_number(v)}" for k, v in list(overrides.items())[:64])


def show_run(
    record: RunRecord, *, now: float | None = None, teardown: tuple[str, str] | None = None
) -> Group:
    """``fab show <id>``: every field of one run, then the end-of-run summary. ``teardown``: how
    the run's fleet ended (state, message: ``summary.json``'s), shown as ``fleet``."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("playbook", f"{record.playbook_name or '-'} ({record.playbook_path or '-'})"),
        ("playbook sha256", record.playbook_hash or "-"),
        ("git commit", record.git_commit or "- (not a git repository)"),
        ("launcher", record.launcher or "-"),
        *([("scheduler job", record.scheduler_jobs)] if record.scheduler_jobs else []),
        ("started", fmt_time(record.started_at)),
        ("ended", fmt_time(record.ended_at)),
        ("state", record.state),
        *([("fleet", clean(f"{teardown[0]}: {teardown[1]}", 600))] if teardown else []),
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
    if record.overrides:
        _add_row(grid, "--set", clean(overrides_text(record.overrides), 2000))
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
    for name in ("#", "nodes", "ended", "why", "steps", "recomputed", "replaced / dropped", "kWh"):
        table.add_column(name, overflow="fold")
    for entry in attempts[:100]:
        if not isinstance(entry, Mapping):
            continue
        nodes = entry.get("nodes")
        first, last = entry.get("first_step"), entry.get("last_step")
        changed = [f"+{n}" for n in _listed(entry.get("replaced"))] + [
            f"-{n}" for n in _listed(entry.get("dropped"))
        ]
        changed += [  # a node given a new machine (after a gpu_fault, without a spare)
            f"({r.get('node')} renewed: {r.get('old_address')} -> {r.get('new_address')})"
            for r in _listed(entry.get("renewed"))
            if isinstance(r, Mapping)
        ]
        cut = _listed(entry.get("grace_cut"))  # survivors killed at once: none was stepping
        if cut:
            changed.append(f"(no grace: {', '.join(str(n) for n in cut[:20])})")
        not_taken = entry.get("not_taken")  # spares (new machines) found bad: the why is in attempts.json
        if isinstance(not_taken, Mapping) and not_taken:
            changed.append(f"(not taken: {', '.join(str(m) for m in list(not_taken)[:20])})")
        _add_row(
            table,
            clean(entry.get("attempt", "-"), 10),
            clean(", ".join(str(n) for n in nodes) if isinstance(nodes, list) else "-", 400),
            Text(clean(entry.get("outcome", "-"), 20), style=_STATE_STYLE.get(str(entry.get("outcome")), "")),
            clean(f"{entry.get('loss') or entry.get('rule') or '-'}: {entry.get('reason') or ''}", 300)
            + (f"; resumed from {clean(entry['resumed_from'], 300)}" if entry.get("resumed_from") else ""),
            clean(f"{first if first is not None else '-'}..{last if last is not None else '-'}", 40),
            clean(entry.get("steps_recomputed") if entry.get("steps_recomputed") is not None else "-", 20),
            clean(" ".join(changed) or "-", 200),
            fmt_kwh(kwh_figure(entry.get("energy_kwh"))),
        )
    return table
