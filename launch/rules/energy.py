"""A run's GPU energy over all its attempts. Pure: no I/O.

Each attempt's watcher integrates its nodes' power draw (``launch.rules.gpu_health.EnergyMeter``).
A run with ``recovery:`` has several attempts, and a run whose watcher died is followed on by a
new watcher (``fab watch RUN``): the run's energy is the sum over its attempts, each attempt
counted once. ``RunEnergy`` keeps one figure per attempt number, so the same attempt seen twice
(recorded when it ended, and read again from the watcher that followed it) replaces its figure
instead of adding to it. An attempt without GPU readings has no figure: unknown, never 0 kWh.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from launch.rules.gpu_health import EnergyMeter

MAX_ATTEMPTS = 10_000
"""More attempt figures than this in a record is not one fleetrun wrote (``max_restarts`` is far lower)."""
MAX_KWH = 1e9
"""A larger figure is not a reading (a 10k-GPU run for a year is about 1e8 kWh)."""


def kwh_figure(value: object) -> float | None:
    """A stored figure (untrusted: a run record a newer fleetrun or a hand may have edited)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_KWH else None


@dataclass(frozen=True)
class RunEnergy:
    """kWh per attempt number (only the attempts that had GPU power readings)."""

    by_attempt: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, figures: Iterable[tuple[int, float | None]]) -> RunEnergy:
        """From ``(attempt, kWh or None)`` pairs; a later pair for the same attempt replaces an
        earlier one (the freshest reading of that attempt), a None leaves what was there."""
        by_attempt: dict[int, float] = {}
        for attempt, kwh in figures:
            if kwh is not None:
                by_attempt[attempt] = kwh
        return cls(by_attempt)

    @classmethod
    def from_json(cls, data: object) -> RunEnergy:
        """The run record's ``energy_by_attempt`` (``{"1": 0.41, "2": 0.12}``); what is not an
        attempt number with a figure is left out."""
        if not isinstance(data, Mapping):
            return cls()
        figures: dict[int, float] = {}
        for key, value in list(data.items())[:MAX_ATTEMPTS]:
            attempt = int(key) if isinstance(key, str) and key.isdigit() and len(key) <= 6 else None
            kwh = kwh_figure(value)
            if attempt is not None and attempt >= 1 and kwh is not None:
                figures[attempt] = kwh
        return cls(figures)

    def with_attempt(self, attempt: int, kwh: float | None) -> RunEnergy:
        """This with ``attempt``'s figure set (unchanged when ``kwh`` is None: no readings)."""
        if kwh is None:
            return self
        return RunEnergy({**self.by_attempt, attempt: kwh})

    def of_attempt(self, attempt: int) -> float | None:
        return self.by_attempt.get(attempt)

    @property
    def total_kwh(self) -> float | None:
        """The run's energy; None when no attempt had GPU readings."""
        return sum(self.by_attempt.values()) if self.by_attempt else None

    @property
    def attempts(self) -> int:
        """How many attempts the total covers (those with readings)."""
        return len(self.by_attempt)

    def to_json(self) -> dict[str, float]:
        return {str(a): round(k, 9) for a, k in sorted(self.by_attempt.items())}


def resume_meter(meter: EnergyMeter, kwh_so_far: float | None) -> None:
    """Start ``meter`` (a re-attached watcher's, fresh) from what the watcher before it measured
    of the same attempt. Its first reading is not joined to the last one before it (the meter
    knows no previous reading of any node): the time no watcher ran is not counted, and nothing
    is counted twice."""
    if kwh_so_far is None:
        return
    meter.joules = kwh_so_far * 3.6e6
    if meter.last is None:
        meter.last = {}  # the meter's "has readings" mark: its kwh is then the figure carried over


def fmt_kwh(kwh: float | None) -> str:
    """``0.412`` (kWh) for the tables; empty when unknown (no GPU readings), never ``0``."""
    if kwh is None:
        return ""
    if kwh == 0:
        return "0"
    if kwh < 0.001:
        return "<0.001"
    if kwh < 10:
        return f"{kwh:.3f}"
    if kwh < 1000:
        return f"{kwh:.1f}"
    return f"{kwh:,.0f}"
