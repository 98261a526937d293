"""The clock a run's life cycle reads and sleeps on, passed in through its context.

The ``time`` module is one; a unit test's ``FakeClock`` (``tests/fakefleet.py``) is another, so
stall and unreachable timeouts of minutes pass in milliseconds and no assertion waits on real time.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Wall time, a monotonic time and sleeping."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float, /) -> None: ...
