"""Finding a recorded run by what the user typed: its id, a unique prefix, its short id or ``last``.

Kept apart from ``launch.cli.runs`` (re-attaching, pulling, following logs), which imports the
run's whole life cycle and SSH: ``fab runs``, ``fab compare`` and ``fab ssh`` only look a run up,
and should not pay for those imports at every start.
"""

from __future__ import annotations

from launch.errors import FleetrunError
from launch.paths import fleetrun_home
from launch.reports.safe_text import clean
from launch.run.records import RunRecord, RunRecords


def open_records() -> RunRecords:
    return RunRecords(fleetrun_home() / "runs.db")


def find_run(records: RunRecords, run: str) -> RunRecord:
    """A run by id, by unique prefix or by its short id (the last part, ``fab runs`` shows it on a
    narrow terminal); 'last' is the most recent run."""
    if not _could_be_a_run_id(run):
        # run ids are printable text; bytes a terminal passed that are not UTF-8 (``$'\xff'``)
        # cannot even be asked of SQLite, which would raise UnicodeEncodeError
        raise FleetrunError(f"no run {ascii(run)[:100]}: a run id is printable text (see 'fab runs')")
    if run == "last":
        latest = records.list(limit=1)
        if not latest:
            raise FleetrunError("no runs recorded yet")
        return latest[0]
    exact = records.get(run)
    if exact is not None:
        return exact
    known = records.list(limit=10_000)
    matches = [r for r in known if r.id.startswith(run)]
    if not matches:  # the short id `fab runs` shows on a narrow terminal: the id's last part
        matches = [r for r in known if r.id.endswith(f"-{run}")]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise FleetrunError(f"no run {clean(run, 100)!r} (see 'fab runs')")
    raise FleetrunError(
        f"run prefix {clean(run, 100)!r} is ambiguous: {', '.join(r.id for r in matches[:5])}"
    )


def _could_be_a_run_id(run: str) -> bool:
    try:
        run.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return 0 < len(run) <= 1000 and run.isprintable()
