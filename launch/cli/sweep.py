"""``fab sweep``: variants of one playbook, one after another or K at a time on disjoint nodes.

Researchers launch dozens of variants of one job (SkyPilot users asked for "100 runs ... cannot
cancel together or monitor % progress"). A sweep is a grid of ``--set`` overrides (``--grid
hyperparameters.lr=0.1,0.01 --grid nodes=1,2``: every combination; ``--random N``: N of them,
drawn without repetition), run as ordinary ``fab train`` runs that share one sweep id in their
records (``fab runs --sweep ID``, ``fab compare sweep:ID``).

With ``--parallel K`` the inventory's hosts are cut into K slots of the playbook's ``nodes``
hosts each (in inventory order), and each slot runs its share of the variants one after another:
no two variants ever share a node, and each run keeps its own rendezvous port and run directory.
``run_sweep`` is a loop over those runs: each variant is its own ``fab train`` process (its own
watcher, on-node watchdog and record), one run through the one life cycle, hooks, teardown and
``keep_warm_s`` included, ending as ``fab train`` ends; while the sweep still needs the fleet, a
variant's end keeps it for the others, and the one that ends last decides as the playbook says
(``launch.run.sweeps``, from this sweep's ``sweep.json``). Ctrl-C stops the whole sweep: no new
variant starts, each running one stops and wraps up (pull, record) as ``fab train`` does without
a terminal to ask, and the sweep's own file says which variants never started.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launch.job.builtin import resolve_playbook
from launch.job.overrides import overrides_record, parse_overrides
from launch.paths import fleetrun_home
from launch.planning.sweep_plan import plan_sweep, slots_of, variant_outcome
from launch.reports.safe_text import clean
from launch.run.records import RunRecords
from launch.run.sweeps import Sweep, Variant, fleet_end, sweep_folder

__all__ = ["Sweep", "Variant", "recorded_state", "run_sweep"]


def _fab() -> list[str]:
    """How to run one variant: this program's ``train`` (``fab`` in a checkout, or ``fleetrun``)."""
    here = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("fab")
    if here.name in ("fab", "fleetrun") and here.exists():
        return [str(here)]
    return [sys.executable, "-m", "launch.cli.main"]


def recorded_state(sweep_id: str, sets: Sequence[str]) -> str | None:
    """The state in the record of the sweep's run made with these ``--set`` items (each variant's
    are its own), or None when its ``fab train`` wrote no record (refused before it started)."""
    wanted = json.dumps(overrides_record(parse_overrides(sets)), sort_keys=True, default=repr)
    with RunRecords(fleetrun_home() / "runs.db") as records:
        for record in records.of_sweep(sweep_id):
            if json.dumps(record.overrides, sort_keys=True, default=repr) == wanted:
                return record.state
    return None


def run_sweep(
    playbook: str,
    grid_items: Sequence[str],
    *,
    inventory: str = "local",
    sample: str | int | None = None,
    parallel: int = 1,
    sets: Sequence[str] = (),
    seed: int | None = None,
    max_failures: int = 0,
    allow_local_hooks: bool = False,
    allow_paths: tuple[Path, ...] = (),
    say: Any = print,
) -> Sweep:
    """Run the sweep; returns what became of each variant (also in the sweep's JSON file).

    ``sample``: ``--random``, how many combinations to draw (None: every one).
    ``max_failures``: once that many variants ended without succeeding, the sweep stops as on
    Ctrl-C (0: no limit).
    ``allow_local_hooks``: the playbook's ``on_end`` may run on this machine, as with ``fab train
    --allow-local-hooks``: remembered once, before any variant starts, for the playbook's bytes
    as they are now (``launch.run.hooks``), so every variant's ``fab train`` finds it; a playbook
    edited during the sweep is another file, not allowed. ``allow_paths``: ``--allow-path``, for
    every variant as for ``fab train``."""
    from launch.fleets.select import load_inventory
    from launch.run.hooks import local_hooks_verdict

    path = resolve_playbook(playbook)
    planned = plan_sweep(
        path, grid_items, sets, sample=sample, seed=seed, parallel=parallel, max_failures=max_failures,
        allowed=allow_paths,
    )  # fmt: skip  # every variant valid before any starts
    for line in planned.repeated:
        say(f"warning: {line}")
    inv = load_inventory(inventory)
    if allow_local_hooks:
        verdict = local_hooks_verdict(path, planned.spec, allow=True, record=True)
        say(f"on_end hooks of {verdict.playbook}: {verdict.why}")
    sweep_id = time.strftime("sw-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    slots = slots_of([h.name for h in inv.hosts], planned.spec.nodes, parallel)
    sweep = Sweep(sweep_id, str(path), [Variant(i, items) for i, items in enumerate(planned.variants)], slots)
    argv = [*_fab(), "train", str(path), "--inventory", inventory, "--sweep", sweep_id]
    argv += [a for allowed in allow_paths for a in ("--allow-path", str(allowed))]
    runner = SweepRunner(sweep, argv, max_failures, say)
    say(
        f"sweep {sweep_id}: {len(sweep.variants)} variant(s) of {clean(planned.spec.name, 100)}, {parallel} at "
        f"a time on {len(slots)} slot(s) of {planned.spec.nodes} node(s); fab runs --sweep {sweep_id}"
    )
    runner.run_all()
    with RunRecords(fleetrun_home() / "runs.db") as records:
        ended = fleet_end(sweep_id, records)
    if ended is not None:
        say(f"fleet: {ended}")
    counts: dict[str, int] = {}
    for variant in sweep.variants:
        counts[variant.state] = counts.get(variant.state, 0) + 1
    say(
        f"sweep {sweep_id} {sweep.state}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; compare: fab compare sweep:{sweep_id}"
    )
    return sweep


class SweepRunner:
    """The loop over a sweep's variant runs: one thread per slot takes the next variant and runs
    it as ``fab train`` on the slot's hosts, until none is left or the sweep stops (Ctrl-C,
    ``--max-failures``); ``sweep.json`` says as it goes what each variant is doing, which is what
    a variant's end reads to know whether the sweep still needs the fleet."""

    def __init__(self, sweep: Sweep, argv: list[str], max_failures: int, say: Callable[[str], None]) -> None:
        folder = sweep_folder(sweep.sweep_id)
        assert folder is not None, "a sweep id this module made names a folder"
        folder.mkdir(parents=True, exist_ok=True)
        self.sweep, self.argv, self.max_failures, self.say, self.folder = (
            sweep,
            argv,
            max_failures,
            say,
            folder,
        )
        self.guard = threading.Lock()
        self.queue = list(sweep.variants)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.finished: list[int] = []
        self.ended_as: list[str] = []

    def save(self) -> None:
        self.sweep.save(self.folder)

    def run_all(self) -> None:
        """Every slot's thread until the sweep is over; a Ctrl-C stops it and waits for the
        running variants to wrap up. The workers say when they are done and the threads are
        joined only then (a Ctrl-C inside ``Thread.join`` can leave a live thread reading as dead)."""
        self.save()
        slots = range(len(self.sweep.slots))
        threads = [threading.Thread(target=self.worker, args=(i,), name=f"sweep-slot-{i}") for i in slots]
        for thread in threads:
            thread.start()
        try:
            while not self.all_done(len(threads)):
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.say("interrupted: no new variant starts; the running ones stop and wrap up")
            self.stop_all("interrupted")
            while not self.all_done(len(threads)):
                try:
                    time.sleep(0.5)
                except KeyboardInterrupt:
                    self.say("still wrapping up the running variants (their records and pulls); please wait")
        for thread in threads:
            thread.join()
        with self.guard:
            for variant in self.sweep.variants:
                if variant.state == "pending":
                    variant.state = "not started"
            self.sweep.state = self.ended_as[0] if self.ended_as else "finished"
            self.save()

    def all_done(self, threads: int) -> bool:
        with self.guard:
            return len(self.finished) == threads

    def stop_all(self, state: str) -> None:
        """No new variant starts (said in ``sweep.json`` first, so a variant ending now does not
        keep the fleet for one that never will); each running one gets the Ctrl-C ``fab train``
        wraps up on."""
        with self.guard:
            if self.sweep.state == "running":
                self.ended_as.append(state)
                self.sweep.state = "stopping"
                self.save()
            for child in self.children.values():
                with contextlib.suppress(OSError):
                    child.send_signal(signal.SIGINT)

    def next_variant(self, slot: int) -> Variant | None:
        with self.guard:
            if self.sweep.state != "running" or not self.queue:
                return None
            variant = self.queue.pop(0)
            variant.slot, variant.state = slot, "running"
            variant.log = str(self.folder / f"variant-{variant.index}.log")
            self.save()
            return variant

    def worker(self, slot: int) -> None:
        try:
            while (variant := self.next_variant(slot)) is not None:
                self.run_variant(variant, self.sweep.slots[slot])
        finally:
            with self.guard:
                self.finished.append(slot)

    def run_variant(self, variant: Variant, hosts: list[str]) -> None:
        """One variant's ``fab train`` on ``hosts``, to its end; then what became of it."""
        argv = [*self.argv, "--hosts", ",".join(hosts)]
        argv += [a for item in variant.sets for a in ("--set", item)]
        self.say(f"  variant {variant.index} on {','.join(hosts)}: {' '.join(variant.sets)}")
        with open(variant.log, "wb") as out:
            # its own process group: a Ctrl-C here reaches it once, from the sweep, not twice
            child = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            with self.guard:
                self.children[variant.index] = child
                variant.pid = child.pid
                self.save()
                if self.sweep.state != "running":
                    child.send_signal(signal.SIGINT)
            code = child.wait()
        with self.guard:
            self.children.pop(variant.index, None)
            variant.exit_code, variant.pid = code, None
            variant.state = variant_outcome(code, recorded_state(self.sweep.sweep_id, variant.sets))
            self.save()
            failed = sum(v.state in ("failed", "stopped", "interrupted") for v in self.sweep.variants)
            over_budget = 0 < self.max_failures <= failed and self.sweep.state == "running"
        self.say(f"  variant {variant.index}: {variant.state} (log {variant.log})")
        if over_budget:
            self.say(
                f"{failed} variant(s) did not succeed (--max-failures {self.max_failures}): stopping the sweep"
            )
            self.stop_all("stopped")
