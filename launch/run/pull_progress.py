"""The image pull's live progress: a row per node (up to ``NODE_ROWS`` nodes) with the bytes its
pull has received so far, under the stage's own row (nodes done, bytes in all, the slowest node).

A pull of a 10-20 GB image takes minutes; a bar that only counts finished nodes sits at 0/N the
whole time and cannot tell a slow node from a stuck one. Each node's pull script prints a
progress line every few seconds (``launch.planning.image_pull``: the size of the blobs podman is
downloading); those lines arrive on the pull command's stdout while it runs (``on_output``).
They are a node's output, so untrusted: read through ``parse_progress`` (digits only, bounded),
line by line with a bounded buffer, and node names are escaped before Rich draws them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from launch.planning.image_pull import parse_progress
from launch.reports.safe_text import markup_safe

NODE_ROWS = 16
"""Fleets up to this size get a row per node; larger ones the stage's row alone."""
MAX_LINE = 200
"""A progress line is short: a longer run of bytes without a newline is dropped."""


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


class PullProgress:
    """The pull's rows in one Rich ``Progress``; every method may be called from any thread."""

    def __init__(self, console: Console, nodes: list[str]) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.nodes = list(nodes)
        self.received: dict[str, int] = {}
        self.finished: dict[str, str] = {}
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.stage: TaskID = self.progress.add_task(f"{'pull':<9}", total=len(nodes), status=self._summary())
        self.rows: dict[str, TaskID] = {}
        if len(nodes) <= NODE_ROWS:
            for node in nodes:
                self.rows[node] = self.progress.add_task(
                    f"  {markup_safe(node)}", total=None, status="checking"
                )

    def __enter__(self) -> PullProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _summary(self) -> str:
        text = f"{len(self.finished)}/{len(self.nodes)} nodes"
        if self.received:
            text += f", {human(sum(self.received.values()))} received"
            pulling = [n for n in self.nodes if n not in self.finished]
            if pulling and len(self.nodes) > NODE_ROWS:
                slowest = min(pulling, key=lambda n: self.received.get(n, 0))
                text += f", slowest {markup_safe(slowest)} {human(self.received.get(slowest, 0))}"
        return text

    def on_output(self, node: str) -> Callable[[bytes], None]:
        """What receives node ``node``'s pull output as it comes."""

        def feed(chunk: bytes) -> None:
            with self._lock:
                data = self._partial.get(node, b"") + chunk
                *lines, rest = data.split(b"\n")
                self._partial[node] = rest if len(rest) <= MAX_LINE else b""
            for line in lines:
                size = parse_progress(line[:MAX_LINE].decode("ascii", "replace"))
                if size is not None:
                    self.update(node, size)

        return feed

    def update(self, node: str, size: int) -> None:
        """Node ``node``'s pull has received ``size`` bytes so far."""
        with self._lock:
            if node in self.finished:
                return
            # the in-flight blobs shrink as podman moves a finished layer out: never go backwards
            size = self.received[node] = max(size, self.received.get(node, 0))
            summary = self._summary()
        if node in self.rows:
            self.progress.update(self.rows[node], status=f"{human(size)} received")
        self.progress.update(self.stage, status=summary)

    def done(self, node: str, what: str) -> None:
        """Node ``node``'s pull ended: ``what`` says how (``pulled``, ``present``, ``failed``)."""
        with self._lock:
            self.finished[node] = what
            summary = self._summary()
            size = self.received.get(node)
        if node in self.rows:
            status = what if size is None or what == "present" else f"{what}, {human(size)}"
            self.progress.update(self.rows[node], total=1, completed=1, status=status)
        self.progress.update(self.stage, advance=1, status=summary)
