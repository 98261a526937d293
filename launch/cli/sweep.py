"""``fab sweep``: variants of one playbook, one after another or K at a time on disjoint nodes.

Researchers launch dozens of variants of one job (SkyPilot users asked for "100 runs ... cannot
cancel together or monitor % progress"). A sweep is a grid of ``--set`` overrides (``--grid
hyperparameters.lr=0.1,0.01 --grid nodes=1,2``: every combination; ``--random N``: N of them,
drawn without repetition), run as ordinary ``fab train`` runs that share one sweep id in their
records (``fab runs --sweep ID``, ``fab compare sweep:ID``).

With ``--parallel K`` the inventory's hosts are cut into K slots of the playbook's ``nodes``
hosts each (in inventory order), and each slot runs its share of the variants one after another:
no two variants ever share a node, and each run keeps its own rendezvous port and run directory.
Each variant is its own ``fab train`` process (its own watcher, on-node watchdog and record),
one run through the one life cycle, hooks included; its ``--sweep-id`` makes the run keep the
fleet for the next variant (``launch.run.opening.teardown_policy``), and the playbook's teardown
policy, and its ``keep_warm_s``, are applied once, when the sweep is over
(``launch.run.lifecycle.end_sweep``). Ctrl-C stops the whole sweep: no new variant starts, each
running one stops and wraps up (pull, record) as ``fab train`` does without a terminal to ask,
and the sweep's own file says which variants never started.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.job.builtin import resolve_playbook
from launch.job.overrides import overrides_record, parse_overrides
from launch.paths import fleetrun_home
from launch.planning.sweep_plan import plan_sweep, slots_of, variant_outcome
from launch.reports.safe_text import clean


@dataclass
class Variant:
    """One combination of the grid: its ``--set`` items, and what became of it."""

    index: int
    sets: list[str]
    slot: int | None = None
    state: str = (
        "pending"  # pending, running, not started, or its run's: succeeded, failed, stopped, interrupted
    )
    exit_code: int | None = None
    log: str = ""


@dataclass
class Sweep:
    """What a sweep ran, written to ``$FLEETRUN_HOME/sweeps/<id>.json`` as it goes."""

    sweep_id: str
    playbook: str
    variants: list[Variant]
    slots: list[list[str]]
    state: str = "running"
    started_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "playbook": self.playbook,
            "state": self.state,
            "started_at": self.started_at,
            "slots": self.slots,
            "variants": [v.__dict__ for v in self.variants],
        }


def _fab() -> list[str]:
    """How to run one variant: this program's ``train`` (``fab`` in a checkout, or ``fleetrun``)."""
    here = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("fab")
    if here.name in ("fab", "fleetrun") and here.exists():
        return [str(here)]
    return [sys.executable, "-m", "launch.cli.main"]


def recorded_state(sweep_id: str, sets: Sequence[str]) -> str | None:
    """The state in the record of the sweep's run made with these ``--set`` items (each variant's
    are its own), or None when its ``fab train`` wrote no record (refused before it started)."""
    from launch.run.records import RunRecords

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
    from launch.run.lifecycle import end_sweep

    path = resolve_playbook(playbook)
    planned = plan_sweep(
        path,
        grid_items,
        sets,
        sample=sample,
        seed=seed,
        parallel=parallel,
        max_failures=max_failures,
        allowed=allow_paths,
    )  # every variant valid before any starts
    spec = planned.spec
    for line in planned.repeated:
        say(f"warning: {line}")
    inv = load_inventory(inventory)
    if allow_local_hooks:
        verdict = local_hooks_verdict(path, spec, allow=True, record=True)
        say(f"on_end hooks of {verdict.playbook}: {verdict.why}")
    slots = slots_of([h.name for h in inv.hosts], spec.nodes, parallel)
    sweep = Sweep(
        sweep_id=time.strftime("sw-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2),
        playbook=str(path),
        variants=[Variant(i, items) for i, items in enumerate(planned.variants)],
        slots=slots,
    )
    folder = fleetrun_home() / "sweeps" / sweep.sweep_id
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "sweep.json"
    guard = threading.Lock()
    stopping = threading.Event()
    children: dict[int, subprocess.Popen[bytes]] = {}

    def save() -> None:
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(sweep.to_json(), indent=2))
        tmp.replace(record)

    queue = list(sweep.variants)

    ended_as: list[str] = []

    def stop_all(state: str) -> None:
        """No new variant starts; each running one gets the Ctrl-C ``fab train`` wraps up on."""
        if not stopping.is_set():
            ended_as.append(state)
        stopping.set()
        with guard:
            for child in children.values():
                with contextlib.suppress(OSError):
                    child.send_signal(signal.SIGINT)

    def next_variant() -> Variant | None:
        with guard:
            if stopping.is_set() or not queue:
                return None
            return queue.pop(0)

    finished: list[int] = []

    def worker(slot: int) -> None:
        try:
            run_slot(slot)
        finally:
            with guard:
                finished.append(slot)

    def run_slot(slot: int) -> None:
        while (variant := next_variant()) is not None:
            log = folder / f"variant-{variant.index}.log"
            argv = [*_fab(), "train", str(path), "--inventory", inventory]
            argv += ["--hosts", ",".join(slots[slot]), "--sweep-id", sweep.sweep_id]
            for allowed in allow_paths:
                argv += ["--allow-path", str(allowed)]
            for item in variant.sets:
                argv += ["--set", item]
            with guard:
                variant.slot, variant.state, variant.log = slot, "running", str(log)
                save()
            say(f"  variant {variant.index} on {','.join(slots[slot])}: {' '.join(variant.sets)}")
            with open(log, "wb") as out:
                # its own process group: a Ctrl-C here reaches it once, from run_sweep, not twice
                child = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                with guard:
                    children[variant.index] = child
                if stopping.is_set():
                    child.send_signal(signal.SIGINT)
                code = child.wait()
            with guard:
                children.pop(variant.index, None)
                variant.exit_code = code
                variant.state = variant_outcome(code, recorded_state(sweep.sweep_id, variant.sets))
                save()
                failed = sum(v.state in ("failed", "stopped", "interrupted") for v in sweep.variants)
                over_budget = max_failures > 0 and failed >= max_failures and not stopping.is_set()
            say(f"  variant {variant.index}: {variant.state} (log {log})")
            if over_budget:
                say(
                    f"{failed} variant(s) did not succeed (--max-failures {max_failures}): stopping the sweep"
                )
                stop_all("stopped")

    say(
        f"sweep {sweep.sweep_id}: {len(sweep.variants)} variant(s) of {clean(spec.name, 100)}, {parallel} at a time "
        f"on {len(slots)} slot(s) of {spec.nodes} node(s); fab runs --sweep {sweep.sweep_id}"
    )
    save()
    threads = [threading.Thread(target=worker, args=(i,), name=f"sweep-slot-{i}") for i in range(parallel)]
    for thread in threads:
        thread.start()

    def all_done() -> bool:
        with guard:
            return len(finished) == len(threads)

    # The workers say when they are done; the threads are joined only then. (A Ctrl-C that lands
    # inside ``Thread.join`` can leave a live thread reading as dead, and the sweep would end
    # before its running variants had wrapped up.)
    try:
        while not all_done():
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("interrupted: no new variant starts; the running ones stop and wrap up")
        stop_all("interrupted")
        while not all_done():
            try:
                time.sleep(0.5)
            except KeyboardInterrupt:
                say("still wrapping up the running variants (their records and pulls); please wait")
    for thread in threads:
        thread.join()
    with guard:
        for variant in sweep.variants:
            if variant.state == "pending":
                variant.state = "not started"
        sweep.state = ended_as[0] if ended_as else "finished"
        save()
    ok = all(v.state == "succeeded" for v in sweep.variants)
    say(f"sweep over: teardown: {end_sweep(inv, spec, ok, sweep.sweep_id, folder, say)}")
    counts: dict[str, int] = {}
    for variant in sweep.variants:
        counts[variant.state] = counts.get(variant.state, 0) + 1
    say(
        f"sweep {sweep.sweep_id} {sweep.state}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; compare: fab compare sweep:{sweep.sweep_id}"
    )
    return sweep
