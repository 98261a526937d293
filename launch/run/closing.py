"""A run's last stages, after the wrap-up: the report the operator reads, then ``on_end``.

Every way a run ends goes through ``close_run``: ``fab train`` and each ``fab sweep`` variant at
the end of ``launch.run.lifecycle.execute``, ``fab watch RUN`` at the end of ``reattach``, and
``fab pull RUN`` after its pull and teardown. So the report is printed and the playbook's
``on_end`` commands run (``launch.run.hooks``) the same way whichever command ended the run.
The hooks run once per run: when an earlier command already ran them (``hooks.json`` exists), a
later one (``fab pull`` after a blocked teardown) does not run them again. What they did goes
into ``summary.json`` (``hooks``) and the run record's artifacts, beside ``hooks.json``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.text import Text

from launch.job.spec import JobSpec
from launch.reports.safe_text import clean
from launch.run.hooks import RESULTS_FILE, run_on_end
from launch.run.records import RunRecords
from launch.run.reporter import Reporter
from launch.run.run_folder import RunFolder
from launch.run.summary import RunSummary

__all__ = ["close_run", "end_hooks", "missing_profile_ranks_line", "report", "teardown_words", "world_line"]


def close_run(
    summary: RunSummary, reporter: Reporter, records: RunRecords | None, spec: JobSpec | None
) -> RunSummary:
    """The report, then the ``on_end`` hooks (once per run); the summary with what they did."""
    report(summary, reporter)
    line = missing_profile_ranks_line(spec, summary.world) if spec is not None else None
    if line is not None:
        reporter.say(("  profile: ", "yellow"), line)
    hooks = end_hooks(summary.folder, reporter)
    if not hooks:  # none, or run by an earlier command: the record's files are as they were
        return summary
    with contextlib.suppress(Exception):  # the record's list of files now names the hooks' logs
        if records is not None:
            records.update(summary.run_id, artifacts=RunFolder(summary.folder).artifacts())
    return replace(summary, hooks=tuple(hooks))


def end_hooks(folder: Path, reporter: Reporter) -> list[dict[str, Any]] | None:
    """The run's ``on_end`` commands, unless a command before this one ran them already (None
    then); what they did is added to ``summary.json`` as ``hooks`` (command, ok, rc, skipped)."""
    if (folder / RESULTS_FILE).exists():
        return None
    results = run_on_end(folder, say=lambda line: reporter.say((line, "yellow")))
    if not results:
        return results
    with contextlib.suppress(OSError, ValueError):
        path = folder / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        if isinstance(summary, dict):
            summary["hooks"] = [
                {k: r.get(k) for k in ("hook", "command", "ok", "rc", "skipped") if k in r} for r in results
            ]
            RunFolder(folder).write_json("summary.json", summary)
    return results


def _profiled_past(spec: JobSpec, world_size: int) -> list[int]:
    return [r for r in spec.profile.ranks if r >= world_size] if spec.profile is not None else []


def missing_profile_ranks_line(spec: JobSpec, world: object) -> str | None:
    """After the run, once the nodes said the world size (``procs_per_node: auto`` resolved on
    the nodes): why no trace came from a profiled rank that never existed."""
    size = world.get("world_size") if isinstance(world, Mapping) else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    missing = _profiled_past(spec, size)
    if not missing:
        return None
    return (
        f"no trace from rank(s) {', '.join(map(str, missing))} (profile.ranks): the job ran "
        f"{size} process(es), ranks 0-{size - 1}"
    )


def world_line(world: object) -> Text | None:
    """``world size N: rank@host(addr), ...`` from the job's ``world`` event, whatever its shape."""
    if not isinstance(world, Mapping):
        return None
    ranks = world.get("ranks")
    parts = []
    for r in ranks[:64] if isinstance(ranks, list) else []:
        if isinstance(r, Mapping):
            parts.append(
                f"{clean(r.get('rank'), 20)}@{clean(r.get('host'), 100)}({clean(r.get('addr'), 100)})"
            )
    more = f", ... ({len(ranks) - 64} more)" if isinstance(ranks, list) and len(ranks) > 64 else ""
    return Text(f"  world size {clean(world.get('world_size'), 20)}: {', '.join(parts)}{more}")


def teardown_words(teardown: object) -> str:
    """``skipped (teardown: never, ...)``, not ``skipped: skipped (...)``: a decision's reason
    often starts with its state already."""
    state, message = getattr(teardown, "state", None), getattr(teardown, "message", None)
    if isinstance(message, str) and state is not None and message.startswith(str(state.value)):
        return message
    return str(teardown)


def report(result: RunSummary, reporter: Reporter) -> None:
    """The end of a run as the operator reads it; everything from the run is printed as text."""
    console = reporter.console
    color = "green" if result.ok else "red"
    console.print(
        Text(result.outcome, style=f"bold {color}") + Text(clean(f" ({result.rule}): {result.reason}"))
    )
    line = world_line(result.world)
    if line is not None:
        console.print(line)
    losses = [point.loss for point in RunFolder(result.folder).read_metrics()[1].history]
    if losses:
        step: Any = result.last_metrics.get("step", len(losses))
        console.print(
            Text(
                f"  loss: {losses[0]:.4f} at the first step -> {losses[-1]:.4f} at step "
                f"{clean(step, 30)} ({len(losses)} steps); plot: {result.folder / 'loss.png'}"
            )
        )
    if result.first_step_after_s is not None:
        console.print(f"  first step {result.first_step_after_s:.1f} s after launch")
    codes = ", ".join(f"{k}={v}" for k, v in result.exit_codes.items())
    console.print(Text(clean(f"  exit codes: {codes}")))
    if result.cost_usd is not None:
        console.print(f"  cost (approx.): ${result.cost_usd:,.2f}")
    console.print(Text(clean(f"  teardown: {teardown_words(result.teardown)}")))
    if result.traceback:
        console.print(Text(f"  fleetrun error: see {result.folder / result.traceback}", style="red"))
    console.print(Text(clean(f"  run folder: {result.folder}")))
