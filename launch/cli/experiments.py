"""``fab runs`` with filters, ``--json`` and ``--tensorboard DIR``; ``fab compare``.

The reading side of experiments: the run records (``runs.db``) say which runs exist and their
hyperparameters; each run folder holds its metrics (``metrics.jsonl``) and TensorBoard files.
Selection and table rows are pure (``launch.reports.compare``); here are the files and printing.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, get_args

from rich.console import Console

from launch.cli.run_lookup import find_run, open_records
from launch.errors import FleetrunError
from launch.reports.compare import (
    ComparedRun,
    RunMetrics,
    compare_rows,
    compare_table,
    lower_is_better,
    parse_since,
    run_json,
    select_runs,
    summarize_metrics,
)
from launch.reports.compare_plot import plot_compare
from launch.reports.safe_text import clean, safe_text
from launch.reports.views import runs_table
from launch.run.records import RunRecord, RunRecords, RunState
from launch.run.run_folder import RunFolder

ALL_RUNS = 1_000_000
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
MAX_WALK_ENTRIES = 50_000
"""Files and folders looked at per run when finding event files (a run folder may hold a data set)."""


def filters(playbook: str, outcome: str, since: str, sweep: str = "") -> dict[str, Any]:
    """The command line's filters, checked: an unknown outcome or a bad date is an error."""
    if outcome and outcome not in get_args(RunState):
        raise FleetrunError(
            f"--outcome {clean(outcome, 40)!r}: expected one of {', '.join(get_args(RunState))}"
        )
    return {
        "playbook": playbook or None,
        "outcome": outcome or None,
        "since": parse_since(since) if since else None,
        "sweep": sweep or None,
    }


def chosen_runs(records: RunRecords, ids: str = "", **chosen: Any) -> list[RunRecord]:
    """Runs named in ``ids`` (comma- or space-separated ids, prefixes or 'last'), else every run
    matching the filters; newest first, each once."""
    records.mark_stale_as_interrupted(time.time())
    if ids.strip():
        named = [find_run(records, word) for word in re.split(r"[,\s]+", ids.strip()) if word]
        unique = {r.id: r for r in named}
        return select_runs(unique.values(), **chosen)
    return select_runs(records.list(limit=ALL_RUNS), **chosen)


def list_runs(
    console: Console,
    limit: int = 20,
    *,
    playbook: str = "",
    outcome: str = "",
    since: str = "",
    as_json: bool = False,
    tensorboard: str = "",
    sweep: str = "",
) -> list[RunRecord]:
    """``fab runs``: a table (or JSON lines' worth of one JSON list), optionally linking the
    runs' TensorBoard files into one log folder."""
    if tensorboard:
        check_writable_folder("--tensorboard", tensorboard)
    with open_records() as records:
        runs = chosen_runs(records, **filters(playbook, outcome, since, sweep))[:limit]
    if tensorboard:
        linked = link_tensorboard(runs, Path(tensorboard))
        console.print(
            safe_text(
                f"linked {sum(len(v) for v in linked.values())} event folder(s) of {len(linked)} run(s) "
                f"into {tensorboard}: tensorboard --logdir {tensorboard}"
            )
        )
        return runs
    if as_json:
        now = time.time()
        print(json.dumps([run_json(r, now) for r in runs], indent=2, sort_keys=True))
    else:
        console.print(runs_table(runs, width=console.width))
    return runs


def read_run_metrics(record: RunRecord) -> RunMetrics:
    """A run's metrics from its folder (none when the folder is gone or holds no metrics)."""
    if not record.run_dir:
        return RunMetrics()
    folder = RunFolder(Path(record.run_dir))
    if not (folder.path / "metrics.jsonl").is_file():
        return RunMetrics(final={k: float(v) for k, v in record.last_metrics.items() if _is_number(v)})
    lines, _summary = folder.read_metrics()
    return summarize_metrics(lines)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compare(
    console: Console,
    ids: str = "",
    *,
    playbook: str = "",
    outcome: str = "",
    since: str = "",
    plot: str = "compare-loss.png",
    as_json: bool = False,
) -> list[ComparedRun]:
    """``fab compare``: the table (or ``--json``) and one loss plot with a line per run."""
    sweep = ids.strip().removeprefix("sweep:") if ids.strip().startswith("sweep:") else ""
    if sweep:  # every variant of one sweep (fab sweep), best first
        ids = ""
    elif ids.strip() in ("", "all"):
        if not (playbook or since or outcome):
            raise FleetrunError(
                "name the runs to compare (fab compare RUN,RUN...) or filter them "
                "(fab compare all --playbook NAME --since 3d)"
            )
        ids = ""
    with open_records() as records:
        runs = chosen_runs(records, ids, **filters(playbook, outcome, since, sweep))
    if not runs:
        raise FleetrunError("no run matches; see 'fab runs'")
    if plot:
        check_writable_file("--plot", plot)
    runs.sort(key=lambda r: r.started_at)
    compared = [ComparedRun(r, read_run_metrics(r)) for r in runs]
    if sweep:
        compared = best_first(compared)
    now = time.time()
    if as_json:
        print(json.dumps(compare_rows(compared, now), indent=2, sort_keys=True))
    else:
        console.print(compare_table(compared, now))
    if plot:
        try:
            path = plot_compare(compared, plot)
        except OSError as exc:  # the folder changed since the check above
            raise FleetrunError(f"--plot {clean(plot, 200)!r}: cannot write it: {exc.strerror}") from None
        if not as_json:
            console.print(safe_text(f"loss curves: {path}"))
    return compared


def check_writable_file(flag: str, path: str) -> None:
    """Refuse an output path that cannot be written before anything is computed or printed, so a
    bad ``--plot`` is one error line, not a table and then a traceback: write and remove a probe
    file where the output's temporary file will go (its folder is made, as the writer makes it)."""
    target = Path(path)
    if target.is_dir():
        raise FleetrunError(f"{flag} {clean(path, 200)!r}: is a folder; name a file")
    probe = target.with_name(f".{target.name}.{os.getpid()}.probe")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe.open("xb").close()
        probe.unlink()
    except OSError as exc:
        raise FleetrunError(f"{flag} {clean(path, 200)!r}: cannot write it: {exc.strerror or exc}") from None


def check_writable_folder(flag: str, path: str) -> None:
    """Like ``check_writable_file`` for an output folder (``--tensorboard DIR``)."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".fleetrun.{os.getpid()}.probe"
        probe.open("xb").close()
        probe.unlink()
    except OSError as exc:
        raise FleetrunError(
            f"{flag} {clean(path, 200)!r}: cannot write into it: {exc.strerror or exc}"
        ) from None


def best_first(runs: list[ComparedRun], metric: str = "loss") -> list[ComparedRun]:
    """A sweep's variants, the best final ``metric`` first (runs without it last, by start)."""

    def key(run: ComparedRun) -> tuple[int, float]:
        value = run.metrics.final.get(metric)
        if value is None or value != value:  # missing or NaN
            return (1, 0.0)
        return (0, value if lower_is_better(metric) else -value)

    return sorted(runs, key=key)


def event_folders(run_folder: Path) -> list[Path]:
    """Folders of a run folder that TensorBoard reads: those holding event files (fleetrun's
    ``tensorboard/``, a job's own writer output) or a profiler's ``plugins/`` tree. Links are
    not followed; the walk is bounded."""
    found: list[Path] = []
    seen = 0
    for root, dirs, files in os.walk(run_folder, followlinks=False):
        seen += len(dirs) + len(files)
        if seen > MAX_WALK_ENTRIES:
            break
        here = Path(root)
        if any(name.startswith("events.out.tfevents.") for name in files) or "plugins" in dirs:
            found.append(here)
            dirs[:] = []  # everything below belongs to this log folder
    return found


def link_tensorboard(runs: list[RunRecord], logdir: Path) -> dict[str, list[Path]]:
    """``logdir/<run id>/<path in the run folder>`` -> each event folder, as symlinks, so
    ``tensorboard --logdir logdir`` shows every run (named by id) together. Re-running refreshes
    the links; anything in ``logdir`` that is not a link fleetrun made is left alone."""
    logdir.mkdir(parents=True, exist_ok=True)
    linked: dict[str, list[Path]] = {}
    for record in runs:
        if not SAFE_NAME.fullmatch(record.id) or not record.run_dir:
            continue
        source = Path(record.run_dir)
        if not source.is_dir():
            continue
        for folder in event_folders(source):
            relative = folder.relative_to(source)
            if any(not SAFE_NAME.fullmatch(part) for part in relative.parts):
                continue
            link = logdir / record.id / relative if relative.parts else logdir / record.id / "run"
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink():
                link.unlink()
            elif link.exists():
                continue
            link.symlink_to(folder.resolve(), target_is_directory=True)
            linked.setdefault(record.id, []).append(link)
    return linked
