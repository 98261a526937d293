"""What a ``fab sweep`` runs, decided before anything starts: its grid, its variants, its slots.

Pure: no connection, no file, no process. ``launch.cli.sweep`` runs what this plans.

A grid is ``--grid KEY=V1,V2,...`` items; a variant is one combination of their values, written
as the ``--set`` items of one ``fab train``. The grid can be far larger than anything a sweep
runs (ten keys of ten values is 10^10 combinations), so the combinations are never built as a
list: a variant is an index into the grid's mixed-radix product (the first key varies slowest),
and ``--random N`` draws N indices, repeatably for one ``--seed``.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launch.errors import SpecError
from launch.job.overrides import parse_override, parse_overrides
from launch.job.spec import JobSpec, load_job_spec
from launch.job.validation import printable

MAX_VARIANTS = 1000
MAX_GRID_VALUES = 100


@dataclass(frozen=True)
class Grid:
    """The grid's keys with their distinct values, in the order given; ``repeated``: one line
    per value given more than once for a key (it runs once; the sweep says so)."""

    axes: tuple[tuple[str, tuple[str, ...]], ...]
    repeated: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """How many combinations the grid makes (any size: nothing is built)."""
        return math.prod(len(values) for _key, values in self.axes)

    def combination(self, index: int) -> list[str]:
        """The ``--set`` items of combination ``index`` (0 <= index < size), in key order; the
        first key varies slowest, as in ``itertools.product``."""
        picked: list[str] = []
        for key, values in reversed(self.axes):
            index, digit = divmod(index, len(values))
            picked.append(f"{key}={values[digit]}")
        return picked[::-1]


def parse_grid(items: Sequence[str]) -> Grid:
    """``name=v1,v2`` items; each value is checked as a ``--set`` would be. A value given twice
    for one key (``0.1,0.1``, or ``0.1,0.10``: the same value once read) would run the same
    variant twice: it is kept once, and ``Grid.repeated`` says so."""
    axes: list[tuple[str, tuple[str, ...]]] = []
    repeated: list[str] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        parts = [v.strip() for v in values.split(",")] if sep else []
        if not sep or not key or not all(parts):
            raise SpecError(
                f"--grid {printable(item, 120)!r}: expected name=v1,v2,... e.g. --grid hyperparameters.lr=0.1,0.01"
            )
        if len(parts) > MAX_GRID_VALUES:
            raise SpecError(f"--grid {printable(key, 100)}: at most {MAX_GRID_VALUES} values")
        if any(key == k for k, _ in axes):
            raise SpecError(f"--grid {printable(key, 100)}: given twice; list its values in one --grid")
        kept: dict[str, str] = {}  # the value as read (its type too: 1 is not 1.0) -> as typed
        for text in parts:
            # repr keeps the type: 1 and 1.0 (or 1 and '1') are different variants
            read = repr(parse_override(f"{key}={text}").value)
            if read in kept:
                repeated.append(
                    f"--grid {printable(key, 100)}: {printable(text, 80)} is the same value as "
                    f"{printable(kept[read], 80)}; that variant runs once"
                )
            else:
                kept[read] = text
        axes.append((key, tuple(kept.values())))
    if not axes:
        raise SpecError("fab sweep needs at least one --grid name=v1,v2")
    return Grid(tuple(axes), tuple(repeated))


def sample_size(given: str | int | None) -> int | None:
    """``--random``'s value: None (not given) runs every combination; otherwise a count >= 1
    (0 once meant "every combination" by accident, and connected to the hosts)."""
    if given is None:
        return None
    text = str(given).strip()
    try:
        count = int(text) if text.isascii() else None
    except ValueError:
        count = None
    if count is None:
        raise SpecError(f"--random {printable(text, 40)!r}: expected a whole number of variants >= 1")
    if count < 1:
        raise SpecError(f"--random {count}: expected a number of variants >= 1")
    return count


def failure_budget(given: int) -> int:
    """``--max-failures``: 0 is no limit; a negative number is refused (it once read as no limit)."""
    if given < 0:
        raise SpecError(f"--max-failures {given}: expected 0 (no limit) or more")
    return given


def variants_of(grid: Grid, sample: int | None = None, seed: int | None = None) -> list[list[str]]:
    """Every combination of the grid in order, or ``sample`` of them drawn without repetition
    (all of them, drawn, when the grid has fewer); a ``seed`` repeats the draw."""
    total = grid.size
    if sample is None:
        if total > MAX_VARIANTS:
            raise SpecError(f"the grid makes {total} variants; at most {MAX_VARIANTS} (use --random N)")
        return [grid.combination(i) for i in range(total)]
    if sample < 1:
        raise SpecError(f"--random {sample}: expected a number of variants >= 1")
    count = min(sample, total)
    if count > MAX_VARIANTS:
        raise SpecError(f"--random {sample}: at most {MAX_VARIANTS} variants")
    return [grid.combination(i) for i in draw_indices(total, count, random.Random(seed))]


def draw_indices(total: int, count: int, rng: random.Random) -> list[int]:
    """``count`` distinct numbers below ``total``, in the order drawn. ``random.sample`` over a
    ``range`` builds nothing, but needs its length as a machine integer; past that (a grid of
    100^10 combinations) a draw of at most ``MAX_VARIANTS`` repeats with a chance below 10^-12
    per pair, so drawing again on a repeat ends at once."""
    if total <= sys.maxsize:
        return rng.sample(range(total), count)
    drawn: dict[int, None] = {}
    while len(drawn) < count:
        drawn.setdefault(rng.randrange(total))
    return list(drawn)


def check_parallel_grid(grid: Grid, parallel: int) -> None:
    """Slots are cut by the playbook's ``nodes``; a grid over ``nodes`` cannot share them out."""
    if parallel > 1 and any(key == "nodes" for key, _ in grid.axes):
        raise SpecError(
            "--grid nodes=... with --parallel: slots are cut by the playbook's nodes; run it sequentially"
        )


@dataclass(frozen=True)
class SweepPlan:
    """A sweep checked before anything starts: the playbook as every variant shares it, each
    variant's ``--set`` items (the sweep's own ``--set`` first), and the grid's repeated values."""

    spec: JobSpec
    variants: list[list[str]]
    repeated: tuple[str, ...]


def plan_sweep(
    playbook: Path,
    grid_items: Sequence[str],
    sets: Sequence[str] = (),
    *,
    sample: str | int | None = None,
    seed: int | None = None,
    parallel: int = 1,
    max_failures: int = 0,
    allowed: tuple[Path, ...] = (),
) -> SweepPlan:
    """Every option of ``fab sweep`` checked, and every variant validated against the playbook
    (the same one-line error ``fab train --set`` gives), before any variant starts or any host
    is reached: the hosts (``slots_of``) are the inventory's business, checked after."""
    base = parse_overrides(sets)
    failure_budget(max_failures)
    grid = parse_grid(grid_items)
    combos = variants_of(grid, sample_size(sample), seed)
    check_parallel_grid(grid, parallel)
    if parallel < 1:
        raise SpecError(f"--parallel {parallel}: expected 1 or more")
    spec = load_job_spec(playbook, base, allowed=allowed)
    for combo in combos:
        load_job_spec(playbook, (*base, *parse_overrides(combo)), allowed=allowed)
    return SweepPlan(spec, [[*sets, *combo] for combo in combos], grid.repeated)


def slots_of(host_names: Sequence[str], nodes: int, parallel: int) -> list[list[str]]:
    """``parallel`` disjoint groups of ``nodes`` hosts, in inventory order."""
    if parallel < 1:
        raise SpecError(f"--parallel {parallel}: expected 1 or more")
    if nodes * parallel > len(host_names):
        raise SpecError(
            f"--parallel {parallel}: {parallel} variants of {nodes} node(s) at once need {nodes * parallel} "
            f"hosts; the inventory has {len(host_names)}"
        )
    return [list(host_names[i * nodes : (i + 1) * nodes]) for i in range(parallel)]


ENDED_RUN_STATES = ("succeeded", "failed", "stopped", "interrupted")
"""A run record's states once its ``fab train`` ended (``launch.reports.run_record.RunState``)."""


def variant_outcome(exit_code: int, record_state: str | None) -> str:
    """What became of a variant: what its run's record says (a variant stopped by Ctrl-C or a
    stop rule is ``stopped``, as in ``fab runs``), or, where no record was written (the run was
    refused before it started), ``succeeded`` for exit code 0 and ``failed`` otherwise."""
    if record_state in ENDED_RUN_STATES:
        return record_state
    return "succeeded" if exit_code == 0 else "failed"
