"""Console output of a run's life cycle, behind one small interface.

The life cycle's stages and the wrap-up say what happens through a ``Reporter``; the CLI gives them a
``RichReporter`` (the terminal), tests a ``RecordingReporter`` (kept in memory, asserted on).
Every part of a message is plain text: it is cleaned of control characters and never parsed as
Rich markup, so a node name, an error from a node or a job's message (``could not open
[/data/shard-7]``) prints as written. Styles are given next to the text, not inside it.

Progress bars and the live table need a Rich ``Console``; ``Reporter.console`` is that console
(in tests one that writes to memory).
"""

from __future__ import annotations

from io import StringIO
from typing import Protocol

from rich.console import Console
from rich.text import Text

from launch.reports.safe_text import clean

Part = str | tuple[str, str]
"""A piece of a message: plain text, or ``(text, style)``."""


def assemble(*parts: Part) -> Text:
    """One ``Text`` from plain parts: cleaned, never markup."""
    text = Text()
    for part in parts:
        if isinstance(part, tuple):
            text.append(clean(part[0]), style=part[1])
        else:
            text.append(clean(part))
    return text


class Reporter(Protocol):
    @property
    def console(self) -> Console:
        """For progress bars and the live table."""
        ...

    def say(self, *parts: Part) -> None:
        """One line of output."""
        ...


class RichReporter:
    """The terminal (or whatever ``console`` writes to)."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console()

    @property
    def console(self) -> Console:
        return self._console

    def say(self, *parts: Part) -> None:
        self._console.print(assemble(*parts), highlight=False)


class RecordingReporter:
    """Keeps every line (plain text) in ``lines``; progress bars and tables go to memory."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.buffer = StringIO()
        self._console = Console(file=self.buffer, width=200, force_terminal=False, color_system=None)

    @property
    def console(self) -> Console:
        return self._console

    def say(self, *parts: Part) -> None:
        self.lines.append(assemble(*parts).plain)

    @property
    def text(self) -> str:
        """Everything said, then everything the console printed (tables, progress)."""
        return "\n".join(self.lines) + "\n" + self.buffer.getvalue()
