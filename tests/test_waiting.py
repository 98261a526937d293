"""The wait for machines on a terminal: a live row (what it waits for, how long), drawn from the
first line; in a log each line as it comes; a warning always kept; the queue's words literal."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from launch.run.reporter import RecordingReporter, RichReporter
from launch.run.waiting import QueueRow, waiting


def terminal() -> tuple[RichReporter, StringIO]:
    out = StringIO()
    return RichReporter(Console(file=out, force_terminal=True, width=160, color_system=None)), out


def test_in_a_log_each_line_is_said_as_it_comes() -> None:
    reporter = RecordingReporter()
    with waiting(reporter, "machines") as say:
        say("slurm job 5: pending in partition gpu, position 2 of 3 (Priority)")
        say("slurm job 5: pending in partition gpu, position 1 of 3 (Resources)")
    assert reporter.lines == [
        "slurm job 5: pending in partition gpu, position 2 of 3 (Priority)",
        "slurm job 5: pending in partition gpu, position 1 of 3 (Resources)",
    ]


def test_on_a_terminal_the_row_shows_the_latest_line_and_the_time_waited() -> None:
    reporter, out = terminal()
    with waiting(reporter, "machines for digits from slurm cluster") as say:
        say("slurm job 5: pending in partition gpu, position 2 of 3 (Priority) [/data/x]")
        say("warning: gpu-3: queue: entry of run r1 (ann@lap) skipped: stale")
        say("slurm job 5: running on n1, n2")
    shown = out.getvalue()
    assert "machines for digits from slurm cluster" in shown and "waiting for" in shown and "waited" in shown
    assert "slurm job 5: running on n1, n2" in shown.rsplit("waiting for", 1)[1], "the last line stays"
    assert "position 2 of 3 (Priority) [/data/x]" in shown, "the queue's words, not markup"
    assert shown.count("warning: gpu-3: queue: entry of run r1") >= 1


def test_a_wait_that_says_nothing_shows_nothing() -> None:
    reporter, out = terminal()
    with waiting(reporter, "machines") as _say:
        pass
    assert out.getvalue() == ""


def test_the_time_waited_moves_without_a_new_line() -> None:
    now = [100.0]
    row = QueueRow("machines", clock=lambda: now[0])
    row.update("slurm job 5: pending (Resources)")
    assert row.waited() == "0:00:00"
    now[0] += 3725
    assert row.waited() == "1:02:05" and row.changes == 1
