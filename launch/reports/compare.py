"""Experiments side by side: which runs to compare, and the rows of ``fab compare``'s table.

Labs run dozens of variants of one job (architectures, data, hyperparameters). ``fab compare``
takes runs by id or by filter (``--playbook``, ``--outcome``, ``--since``: the same filters as
``fab runs``) and shows, per run, its hyperparameters, the final and best value of each metric,
the duration and the cost. Pure: records and metric lines in, rows and renderables out; the
command reads the run folders (``launch.cli.experiments``). Everything in a run record or a
metrics file came from a job: names and values are bounded and printed through ``safe_text``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rich.table import Table
from rich.text import Text

from launch.errors import FleetrunError
from launch.reports.run_record import RunRecord
from launch.reports.safe_text import clean, safe_text
from launch.reports.tensorboard import MAX_TAGS, metric_scalars, record_step
from launch.reports.views import PROGRESS_KEY, fmt_cost, fmt_duration, fmt_number, overrides_text

MAX_METRICS = 5
"""Metric columns in the table (``loss`` first): a job logging 200 names would make it unreadable."""
MAX_HYPERPARAMETERS = 12
MAX_CURVE_POINTS = 100_000
LOWER_IS_BETTER = re.compile(r"loss|err|perplexity|ppl|mse|mae|rmse|wer|cer|time|latency", re.IGNORECASE)
_RELATIVE = re.compile(r"(\d{1,6})\s*([mhdw])")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def lower_is_better(metric: str) -> bool:
    """Whether the best value of ``metric`` is its minimum (a loss, an error) or its maximum."""
    return LOWER_IS_BETTER.search(metric) is not None


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a date (``2026-11-20``), a date and time (``2026-11-20T14:00``, local time
    unless it says its zone), or an age (``30m``, ``12h``, ``3d``, ``2w``). Unix time."""
    value = text.strip()
    match = _RELATIVE.fullmatch(value)
    if match:
        return (time.time() if now is None else now) - int(match.group(1)) * _UNITS[match.group(2)]
    try:
        parsed = datetime.fromisoformat(value)
        # a date near year 1 or 9999 parses, but moving it into the local zone leaves the range
        return parsed.timestamp() if parsed.tzinfo else parsed.astimezone().timestamp()
    except (ValueError, OverflowError, OSError):
        raise FleetrunError(
            f"--since {clean(text, 80)!r}: expected a date (2026-11-20), a date and time "
            "(2026-11-20T14:00) or an age (30m, 12h, 3d, 2w) from 1970 on"
        ) from None


def select_runs(
    runs: Iterable[RunRecord],
    *,
    playbook: str | None = None,
    outcome: str | None = None,
    since: float | None = None,
    sweep: str | None = None,
) -> list[RunRecord]:
    """The runs matching every filter given: playbook name (or the playbook file's name),
    outcome (``succeeded``, ``failed``, ...), started at or after ``since``, variant of ``sweep``."""
    chosen = []
    for run in runs:
        if sweep is not None and run.sweep_id != sweep:
            continue
        if playbook is not None and playbook not in (run.playbook_name, _file_stem(run.playbook_path)):
            continue
        if outcome is not None and run.state != outcome:
            continue
        if since is not None and run.started_at < since:
            continue
        chosen.append(run)
    return chosen


def _file_stem(path: str | None) -> str | None:
    if not path:
        return None
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[0] if "." in name else name


@dataclass(frozen=True)
class RunMetrics:
    """What one run's metric lines say: last and best value per metric, and the loss curve."""

    final: dict[str, float] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def summarize_metrics(records: Iterable[Mapping[str, Any]], loss_key: str = "loss") -> RunMetrics:
    """Final and best value of every scalar metric (best: min for losses and errors, else max;
    non-finite values never count as best), and the ``(step, loss)`` points in order."""
    final: dict[str, float] = {}
    best: dict[str, float] = {}
    curve: list[tuple[int, float]] = []
    for record in records:
        step = record_step(record)
        if step is None:
            continue
        for name, value in metric_scalars(record).items():
            if name not in final and len(final) >= MAX_TAGS:
                continue
            final[name] = value
            if not math.isfinite(value):
                continue
            old = best.get(name)
            if old is None or (value < old if lower_is_better(name) else value > old):
                best[name] = value
            if name == loss_key and len(curve) < MAX_CURVE_POINTS:
                curve.append((step, value))
    return RunMetrics(final, best, curve)


@dataclass(frozen=True)
class ComparedRun:
    record: RunRecord
    metrics: RunMetrics


def metric_columns(runs: Sequence[ComparedRun], limit: int = MAX_METRICS) -> list[str]:
    """``loss`` first, then the names most runs logged (ties by name)."""
    counts: dict[str, int] = {}
    for run in runs:
        for name in run.metrics.final:
            if name == PROGRESS_KEY:  # how far the run got, not how well it did
                continue
            counts[name] = counts.get(name, 0) + 1
    names = sorted(counts, key=lambda n: (n != "loss", -counts[n], n))
    return names[:limit]


def _differs(runs: Sequence[ComparedRun], name: str) -> bool:
    """Whether the runs do not all have the same value (or absence) of hyperparameter ``name``."""
    return len({repr(run.record.hyperparameters.get(name)) for run in runs}) > 1


def hyperparameter_columns(runs: Sequence[ComparedRun], limit: int = MAX_HYPERPARAMETERS) -> list[str]:
    """Hyperparameter names, those whose value differs between the runs first."""
    names = sorted({str(k) for run in runs for k in run.record.hyperparameters})
    return sorted(names, key=lambda n: (not _differs(runs, n), n))[:limit]


def compare_rows(runs: Sequence[ComparedRun], now: float | None = None) -> list[dict[str, Any]]:
    """One plain dict per run (``--json`` prints these; the table shows them)."""
    rows = []
    for run in runs:
        rec = run.record
        rows.append(
            {
                "id": rec.id,
                "playbook": rec.playbook_name,
                "outcome": rec.state,
                "started_at": rec.started_at,
                "duration_s": round(rec.duration_s(now), 3),
                "cost_usd": rec.cost_usd,
                "git_commit": rec.git_commit,
                "hyperparameters": dict(rec.hyperparameters),
                "overrides": dict(rec.overrides),
                "final": dict(run.metrics.final),
                "best": dict(run.metrics.best),
            }
        )
    return rows


def curve_label(run: ComparedRun, differing: Sequence[str]) -> str:
    """A legend entry: the run id and the hyperparameters that set it apart (bounded, clean)."""
    parts = [
        f"{name}={run.record.hyperparameters[name]}"
        for name in differing
        if name in run.record.hyperparameters
    ]
    label = run.record.id + (f" ({', '.join(parts)})" if parts else "")
    return clean(label, 120)


def differing_hyperparameters(runs: Sequence[ComparedRun]) -> list[str]:
    names = hyperparameter_columns(runs, limit=10_000)
    return [n for n in names if _differs(runs, n)][:4]


def compare_table(runs: Sequence[ComparedRun], now: float | None = None) -> Table:
    """Runs as rows: id, outcome, the hyperparameters that differ, final/best of each metric,
    duration, cost; the hyperparameters every run shares go in the caption."""
    names = hyperparameter_columns(runs)
    differing = [n for n in names if _differs(runs, n)]
    shared = [n for n in names if n not in differing and len(runs) > 1]
    metrics = metric_columns(runs)
    caption = None
    if shared:  # a Text: a str caption would be parsed as markup, and these names come from jobs
        first = runs[0].record.hyperparameters
        caption = safe_text(
            "same in every run: " + ", ".join(f"{n}={fmt_number(first.get(n))}" for n in shared), limit=400
        )
    else:
        differing = names
    table = Table(title=f"fab compare: {len(runs)} run(s)", caption=caption)
    table.add_column("run", no_wrap=True)
    table.add_column("outcome")
    for name in differing:
        table.add_column(safe_text(clean(name, 40)), overflow="fold")
    with_set = any(run.record.overrides for run in runs)
    if with_set:
        table.add_column("--set", overflow="fold")
    for name in metrics:
        arrow = "min" if lower_is_better(name) else "max"
        table.add_column(
            Text.assemble(safe_text(clean(name, 40)), f"\nfinal / best ({arrow})"), justify="right"
        )
    table.add_column("duration", justify="right")
    table.add_column("cost", justify="right")
    for run in runs:
        rec = run.record
        cells = [safe_text(rec.id), safe_text(rec.state)]
        cells += [safe_text(clean(fmt_number(rec.hyperparameters.get(n)), 40)) for n in differing]
        if with_set:
            cells.append(safe_text(clean(overrides_text(rec.overrides), 200) or "-"))
        for name in metrics:
            final = run.metrics.final.get(name)
            best = run.metrics.best.get(name)
            cells.append(safe_text(f"{fmt_number(final)} / {fmt_number(best)}"))
        cells += [safe_text(fmt_duration(rec.duration_s(now))), safe_text(fmt_cost(rec.cost_usd))]
        table.add_row(*cells)
    return table


def run_json(record: RunRecord, now: float | None = None) -> dict[str, Any]:
    """One run for ``fab runs --json``: the record's fields, plain JSON types."""
    return {
        "id": record.id,
        "playbook": record.playbook_name,
        "playbook_path": record.playbook_path,
        "outcome": record.state,
        "stop_rule": record.stop_rule,
        "stop_reason": record.stop_reason,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
        "started": datetime.fromtimestamp(record.started_at, timezone.utc).isoformat(),
        "duration_s": round(record.duration_s(now), 3),
        "cost_usd": record.cost_usd,
        "energy_kwh": record.energy_kwh,
        "git_commit": record.git_commit,
        "launcher": record.launcher,
        "hyperparameters": dict(record.hyperparameters),
        "overrides": dict(record.overrides),
        "last_metrics": dict(record.last_metrics),
        "exit_codes": dict(record.exit_codes),
        "run_dir": record.run_dir,
    }
