"""A run's turn on shared machines (a stage of the run's life cycle) and ``fab queue``'s listing.

The queue entries and their rules are in ``launch.planning.queue``; here are the connections.
Every real run puts its entry on every machine it uses (``take_machines``, called by
``launch.run.lifecycle.start_run`` over the run's own connection pool, before the run record is
made: a refused run leaves none). Without ``--wait`` a machine another run holds (an earlier live
entry wanting a GPU this run wants) refuses the run at once, naming the holder; with ``--wait``
the run refreshes its entries each poll and starts once it is first on all of them. Either way a
``QueueHold`` then keeps the entries fresh from a thread until the run's teardown is over, and
removes them; Ctrl-C while waiting removes them too. The refresh thread has connections of its
own (``FleetPort.outside``): it runs beside the stages, and a recovery replaces the run's pool. The GPU check at claim time (``launch.planning.claim``) still refuses GPUs that other
users' processes hold outside fleetrun, and ``--allow-busy-gpus`` starts beside both on purpose
(two runs sharing machines, as the shared-hosts docs describe).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launch.errors import FleetrunError, HostError
from launch.job.inventory import Host, Inventory
from launch.planning import queue
from launch.reports.safe_text import clean
from launch.transport.port import FleetPort, NodeLink
from launch.transport.ssh import Fleet

POLL_S = 2.0


def ttl_s() -> float:
    """How long an entry lives without a refresh (``FLEETRUN_QUEUE_TTL_S``; default 60 s)."""
    try:
        value = float(os.environ.get("FLEETRUN_QUEUE_TTL_S", queue.DEFAULT_TTL_S))
    except ValueError:
        return queue.DEFAULT_TTL_S
    return value if 1.0 <= value <= queue.MAX_LEASE_S else queue.DEFAULT_TTL_S


def owner() -> str:
    """Who waits, as ``fab queue`` shows it: this laptop's user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return clean(f"{user}@{socket.gethostname()}", 120)


def _gpus(host: Host) -> tuple[int, ...] | None:
    return None if isinstance(host.gpus, int) or not host.gpus else tuple(host.gpus)


_live_here: set[str] = set()
"""The runs of this process that hold (or wait for) machines now: an entry of this process for
any other run is left over (its run ended and its removal failed, e.g. a local fleet torn down
before it; the next run in the same process must not wait for it)."""
_live_lock = threading.Lock()


def _live(run_id: str, live: bool) -> None:
    with _live_lock:
        (_live_here.add if live else _live_here.discard)(run_id)


def gone_here(entry: queue.Entry) -> bool:
    """An entry this laptop wrote (same user@host) for a process of it that no longer exists (a
    ``fab`` killed here with kill -9, whose lease has not run out yet), or for a run of this very
    process that no longer holds anything: it does not hold anything up."""
    if entry.owner != owner() or entry.pid <= 0:
        return False
    if entry.pid == os.getpid():
        with _live_lock:
            return entry.run_id not in _live_here
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class _Warnings:
    """Each skipped folder or entry said once per command, not once per poll."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.said = say, set[str]()

    def note(self, host: str, text: str) -> None:
        line = clean(f"warning: {host}: queue: {text}", 400)
        if line not in self.said and len(self.said) < 50:
            self.said.add(line)
            self.say(line)


class QueueRefused(HostError):
    """The queue script on a host answered with a problem (a squatted folder, a bad entry): not a
    host that could not be reached."""


def _act(
    fleet: FleetPort,
    action: str,
    run_id: str,
    ttl: float,
    warn: _Warnings | None = None,
    skip_unreachable: bool = False,
) -> dict[str, list[queue.Entry]]:
    """Run one queue action on every machine; its listing per host (a failure raises ``HostError``).
    ``skip_unreachable``: a host that cannot be reached (or whose pinned key does not match) is
    left out of the listing instead; the run's pre-launch check names it with its verdict."""
    who = owner()

    def one(conn: NodeLink) -> tuple[list[queue.Entry], list[str]]:
        gpus = queue.gpus_arg(conn.host.gpus)
        command = queue.script_command(conn.host.python, action, run_id, who, ttl, os.getpid(), gpus)
        result = conn.run_with_input(command, queue.SCRIPT.encode(), timeout=30)
        problem = queue.queue_error(result.stdout)
        if not result.ok or problem:
            raise QueueRefused(conn.host.name, f"queue: {problem or clean(result.stderr.strip()[-200:])}")
        return queue.parse_listing(result.stdout), queue.skipped_notes(result.stdout)

    out: dict[str, list[queue.Entry]] = {}
    for name, res in fleet.map(one, deadline=60).items():
        if isinstance(res, BaseException):
            if action == "leave":
                continue  # best effort: an entry left behind expires by itself
            if skip_unreachable and not isinstance(res, QueueRefused):
                continue
            raise res if isinstance(res, FleetrunError) else HostError(name, f"queue: {res}")
        out[name], notes = res
        if warn is None:
            continue
        for note in notes:
            warn.note(name, note)
        for entry in res[0]:
            why = entry.why_skipped(ttl)
            if why and entry.run_id != run_id:
                warn.note(name, f"entry of run {entry.run_id} ({entry.owner or entry.user}) skipped: {why}")
    return out


class QueueHold:
    """The run's entries, refreshed from a thread until ``release`` (then removed).

    A recovery changes the run's machines: ``refused`` holds a spare before recovery takes it (or
    says who holds it), ``follow`` moves the hold to the next attempt's hosts (a new machine held,
    a machine the run left let go), so the run holds exactly what it uses, start to end."""

    def __init__(self, fleet: FleetPort, run_id: str, ttl: float, share: bool = False) -> None:
        self.fleet = fleet
        self.run_id, self.ttl, self.share = run_id, ttl, share
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="fleetrun-queue-hold", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(max(1.0, self.ttl / 4)):
            with self._lock:  # never held over the network: a lost node's touch may take its deadline
                fleet = self.fleet
            with contextlib.suppress(Exception):  # a missed refresh is retried; the lease allows 3
                _act(fleet, "touch", self.run_id, self.ttl)

    def refused(self, host: Host, known_hosts: Path) -> str | None:
        """Hold ``host`` too (a spare recovery wants), or why not: another run holds it (unless
        the run shares machines on purpose), or its queue could not be written. Refused: nothing
        of this run is left on it."""
        port = self.fleet.outside([host], known_hosts)
        try:
            listing = _act(port, "enqueue", self.run_id, self.ttl)
            blockers = _blockers_of({host.name: _gpus(host)}, listing, self.run_id, self.ttl)
            if blockers and not self.share:
                with contextlib.suppress(Exception):
                    _act(port, "leave", self.run_id, self.ttl)
                return clean(f"held by another run ({_who(blockers)})", 400)
            return None
        except FleetrunError as exc:
            return clean(f"its queue: {exc}", 400)
        finally:
            port.close()

    def follow(self, hosts: list[Host], known_hosts: Path) -> None:
        """Hold the next attempt's ``hosts``: a new one gets its entry, one the run no longer uses
        is let go (in the background: a lost machine may not answer; its entry then expires with
        its lease)."""
        with self._lock:
            old = self.fleet
            kept = {(h.name, h.address) for h in hosts}
            gone = [h for h in old.hosts if (h.name, h.address) not in kept]
            before = {(h.name, h.address) for h in old.hosts}
            if gone:
                leaving = old.outside(gone, old.known_hosts)
                threading.Thread(target=self._leave, args=(leaving,), daemon=True).start()
            self.fleet = fleet = old.reconnect(list(hosts), known_hosts)
        new = [h.name for h in hosts if (h.name, h.address) not in before]
        if new:  # a spare was held by ``refused`` already; a new machine is held here
            with contextlib.suppress(Exception):
                _act(fleet.subset(new), "enqueue", self.run_id, self.ttl, skip_unreachable=True)

    def _leave(self, port: FleetPort) -> None:
        try:
            with contextlib.suppress(Exception):
                _act(port, "leave", self.run_id, self.ttl)
        finally:
            port.close()

    def release(self) -> None:
        """Stop refreshing and remove the run's entries; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=30)
        _live(self.run_id, False)
        with self._lock:
            fleet = self.fleet
        with contextlib.suppress(Exception):
            _act(fleet, "leave", self.run_id, self.ttl)
        fleet.close()


def _blockers(
    inventory: Inventory, listing: dict[str, list[queue.Entry]], run_id: str, ttl: float
) -> dict[str, list[queue.Entry]]:
    return _blockers_of({h.name: _gpus(h) for h in inventory.hosts}, listing, run_id, ttl)


def _blockers_of(
    gpus: dict[str, tuple[int, ...] | None], listing: dict[str, list[queue.Entry]], run_id: str, ttl: float
) -> dict[str, list[queue.Entry]]:
    waiting = {
        name: queue.ahead_of(entries, run_id, ttl, gpus.get(name), gone_here)
        for name, entries in listing.items()
    }
    return {name: ahead for name, ahead in waiting.items() if ahead}


def _who(blockers: dict[str, list[queue.Entry]]) -> str:
    return "; ".join(
        f"{name}: behind {', '.join(f'{e.run_id} ({e.owner or e.user})' for e in ahead[:3])}"
        for name, ahead in sorted(blockers.items())[:4]
    )


def take_machines(
    inventory: Inventory,
    fleet: FleetPort,
    run_id: str,
    wait: bool,
    share: bool = False,
    say: Callable[[str], None] = print,
) -> QueueHold:
    """Hold every host of ``inventory`` for run ``run_id`` through ``fleet`` (the run's pool, left
    open for the run's stages), its entries kept fresh until ``QueueHold.release``. A host another
    run holds: ``wait`` queues behind it (``wait_turn``); else the run is refused
    (``FleetrunError``, one line naming host and holder) unless ``share`` (``--allow-busy-gpus``:
    sharing the machines on purpose), which holds them alongside."""
    if wait:
        return wait_turn(inventory, fleet, run_id, say)
    ttl = ttl_s()
    _live(run_id, True)
    try:
        listing = _act(fleet, "enqueue", run_id, ttl, _Warnings(say), skip_unreachable=True)
        blockers = _blockers(inventory, listing, run_id, ttl)
        if blockers and not share:
            raise FleetrunError(
                clean(
                    f"run {run_id}: the machines are held by another run ({_who(blockers)}); "
                    "fab train --wait queues behind it, --allow-busy-gpus starts beside it",
                    600,
                )
            )
        if blockers:
            say(
                clean(
                    f"warning: sharing the machines with another run (--allow-busy-gpus): {_who(blockers)}",
                    600,
                )
            )
    except BaseException:
        _live(run_id, False)
        with contextlib.suppress(Exception):
            _act(fleet, "leave", run_id, ttl)
        raise
    return QueueHold(fleet.outside(list(inventory.hosts), fleet.known_hosts), run_id, ttl, share)


def wait_turn(
    inventory: Inventory, fleet: FleetPort, run_id: str, say: Callable[[str], None] = print
) -> QueueHold:
    """Queue on every host of ``inventory`` through ``fleet`` and return once this run is first
    on all of them."""
    ttl = ttl_s()
    warn = _Warnings(say)
    shown = ""
    _live(run_id, True)
    try:
        listing = _act(fleet, "enqueue", run_id, ttl, warn)
        while True:
            blockers = _blockers(inventory, listing, run_id, ttl)
            if not blockers:
                break
            line = _who(blockers)
            if line != shown:
                say(clean(f"waiting for the machines (arrival order): {line}", 600))
                shown = line
            time.sleep(POLL_S)
            listing = _act(fleet, "touch", run_id, ttl, warn)
    except BaseException:  # Ctrl-C or an error: the entries go, nobody waits behind a ghost
        _live(run_id, False)
        with contextlib.suppress(Exception):
            _act(fleet, "leave", run_id, ttl)
        raise
    say(f"run {run_id}: its turn on {len(inventory.hosts)} machine(s)")
    return QueueHold(fleet.outside(list(inventory.hosts), fleet.known_hosts), run_id, ttl)


def show_queue(inventory: Inventory, known_hosts: Path, say: Callable[[str], None] = print) -> int:
    """``fab queue``: per machine, who holds it (first live entry) and who waits; how many live entries."""
    ttl = ttl_s()
    live = 0
    with Fleet(inventory.hosts, known_hosts) as fleet:
        listing = _act(fleet, "list", "-", ttl, _Warnings(say))
    for host in inventory.hosts:
        entries = [e for e in listing.get(host.name, []) if e.live(ttl) and not gone_here(e)]
        live += len(entries)
        if not entries:
            say(f"{clean(host.name, 100)}: free")
            continue
        first, rest = entries[0], entries[1:]
        say(
            f"{clean(host.name, 100)}: held by {clean(first.run_id, 130)} ({clean(first.owner or first.user, 130)})"
        )
        for position, entry in enumerate(rest, 1):
            say(
                f"  {position}. waiting: {clean(entry.run_id, 130)} ({clean(entry.owner or entry.user, 130)})"
            )
    return live
