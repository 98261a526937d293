"""The wait for machines, live: a scheduler's queue (Slurm: position and reason) or a lab's
shared hosts (``--wait``), shown as a one-row table updated in place, with how long it has waited.

The waits themselves (``launch.fleets.slurm.allocation.wait_granted``, ``launch.run.queue_turn``)
say a line each time what they wait for changes; on a terminal those lines become this table's
row, redrawn every second so the time waited moves even when the queue does not (a user left
staring at a silent prompt for minutes cannot tell a queue from a hang). Anywhere else (a log, a
CI job, a test) the lines are printed as they come, one per change, as before. What the
scheduler or another run said is shown through ``clean``, never as markup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from launch.reports.safe_text import clean
from launch.run.reporter import Reporter


class QueueRow:
    """The latest line of the wait and when it began; drawn as a table on each refresh."""

    def __init__(self, title: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.title, self.clock = clean(title, 200), clock
        self.started = clock()
        self.line = "asking"
        self.changes = 0

    def update(self, line: str) -> None:
        self.line, self.changes = clean(line, 400), self.changes + 1

    def waited(self) -> str:
        seconds = int(max(0.0, self.clock() - self.started))
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def table(self) -> Table:
        table = Table(title=Text(self.title), title_justify="left")
        table.add_column("waiting for", overflow="fold")
        table.add_column("waited", justify="right")
        table.add_column("changes", justify="right")
        table.add_row(Text(self.line), self.waited(), str(self.changes))  # never markup
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table()


@contextmanager
def waiting(reporter: Reporter, title: str) -> Iterator[Callable[[str], None]]:
    """A ``say`` for a wait: on a terminal each line updates the live row, drawn from the first
    line on (the last one stays on screen when the wait ends; a warning is printed above it and
    stays); elsewhere each line is said as it comes."""
    console = reporter.console
    if not console.is_terminal:
        yield lambda line: reporter.say(line)
        return
    row = QueueRow(title)
    live = Live(row, console=console, refresh_per_second=1, transient=False)
    started = False

    def say(line: str) -> None:
        nonlocal started
        if line.startswith("warning"):  # printed above the live row, kept on screen
            reporter.say(line)
            return
        row.update(line)
        if not started:  # drawn from the first line on: a wait that says nothing shows nothing
            live.start()
            started = True

    try:
        yield say
    finally:
        if started:
            live.stop()
