"""``keep_warm_s``: after a run, keep the fleet up that long instead of tearing it down.

A researcher who runs again in five minutes should not wait for a new cluster (SageMaker's warm
pools, SkyPilot's autostop); one who does not should not pay for an idle one. Keeping warm is the
run's teardown action, decided where every run ends (``launch.run.wrapup.finish``, ``fab pull``;
each ``fab sweep`` variant is such a run): when the playbook's teardown would remove the fleet, the fleet is
kept until a deadline instead, and then torn down unless a later run on it claimed it.

The deadline has up to four keepers, so that no single one going away leaves GPUs billing:

* each node's own timer (``fleetrun_warm``, started detached): it powers the node off with the
  laptop gone; it runs as the node user, so a process the job left behind can fool it;
* the laptop's ledger: ``$FLEETRUN_HOME/warm/<fleet>.json`` holds the deadline, and a detached
  laptop-side process (``python -m launch.run.warm FILE``) tears the fleet down when it passes;
  any later ``fab`` command does the same for a deadline that passed while the laptop slept
  (``enforce_due``, from the command-line edge). Nothing on a node can move it;
* on a cloud, the instances' lifetime, armed from the laptop in the cloud itself
  (``launch.run.warm_lifetime``: an EventBridge or Cloud Scheduler schedule that ends the
  instances a little after the deadline): it needs neither the laptop nor the nodes. A run that
  reuses the fleet disarms it as it starts (``claim``);
* "claimed" is decided from the laptop's run records: a run recorded on the same fleet after the
  fleet was kept warm owns it from then on (its own end decides again), not a folder's mtime.

The next ``fab train`` on the same inventory reuses the nodes: its sync sends only what changed
and its setup is skipped while unchanged. Only fleets whose nodes may power themselves off
(stack and local fleets) are kept warm; lab machines are never powered off, so there the
playbook's teardown applies as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launch.errors import FleetrunError
from launch.fleets.kinds.base import TeardownOutcome, TeardownState
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.teardown import tear_down
from launch.job.inventory import Inventory
from launch.paths import fleetrun_home
from launch.planning import remote_layout as layout
from launch.reports.safe_text import clean
from launch.rules.stoprules import Teardown
from launch.run import warm_lifetime
from launch.run.records import RunRecords, pid_alive
from launch.transport.port import FleetPort, NodeLink

TIMER = f"{layout.LIB}/fleetrun_warm.py"
LEDGER = "warm"
"""The folder under ``FLEETRUN_HOME`` that holds each warm fleet's deadline."""
RESULT_FILE = "keep_warm.json"
"""Written in the run's (or sweep's) folder: the deadline, then how it ended (claimed, torn down)."""
MAX_ENTRY_BYTES = 1 << 20
CLAIM_SCAN = 500
"""Run records read to decide a claim (the most recent first); a claim is a run after the arming."""

Say = Callable[[str], None]


def applies(inventory: Inventory, keep_warm_s: float | None) -> bool:
    """Whether a run on this inventory is kept warm instead of torn down."""
    return bool(keep_warm_s) and bool(getattr(fleet_kind(inventory.fleet), "can_power_off", False))


def fleet_key(inventory: Inventory) -> str:
    """What a teardown removes: the fleet (a local fleet's prefix, a stack), not these hosts: a
    sweep slot's hosts or a run's spares are the same fleet."""
    return hashlib.sha256(inventory.fleet.model_dump_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WarmEntry:
    """One warm fleet in the laptop's ledger."""

    owner: str
    """The run (or sweep) that kept the fleet warm."""
    inventory: Inventory
    armed_at: float
    deadline: float
    record_dir: Path
    """The owner's folder: ``keep_warm.json`` there, and ``summary.json``'s teardown."""
    lifetime: str | None = None
    """What the cloud was armed to do at the deadline (``launch.run.warm_lifetime``), or None."""

    @property
    def key(self) -> str:
        return fleet_key(self.inventory)

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "inventory": self.inventory.to_yaml_data(),
            "armed_at": self.armed_at,
            "deadline": self.deadline,
            "record_dir": str(self.record_dir),
            "lifetime": self.lifetime,
        }

    @classmethod
    def load(cls, path: Path) -> WarmEntry:
        """A ledger file (this laptop's, still size-bounded and validated); ValueError if it is not one."""
        with path.open("rb") as fh:
            raw = fh.read(MAX_ENTRY_BYTES + 1)
        if len(raw) > MAX_ENTRY_BYTES:
            raise ValueError(f"over {MAX_ENTRY_BYTES} bytes")
        try:
            data = json.loads(raw)
            armed_at, deadline = float(data["armed_at"]), float(data["deadline"])
            owner, lifetime = data["owner"], data.get("lifetime")
            if not isinstance(owner, str) or not isinstance(data["record_dir"], str):
                raise TypeError("owner and record_dir are text")
            if lifetime is not None and not isinstance(lifetime, str):
                raise TypeError("lifetime is text")
            return cls(
                owner=owner,
                inventory=Inventory.model_validate(data["inventory"]),
                armed_at=armed_at,
                deadline=deadline,
                record_dir=Path(data["record_dir"]),
                lifetime=lifetime,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{type(exc).__name__}: {clean(exc, 300)}") from None


def ledger() -> Path:
    return fleetrun_home() / LEDGER


def entry_path(inventory: Inventory) -> Path:
    return ledger() / f"{fleet_key(inventory)}.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def note_result(folder: Path, **fields: Any) -> None:
    """Add to the owner's ``keep_warm.json`` (what became of the warm fleet)."""
    path = folder / RESULT_FILE
    try:
        data = json.loads(path.read_text()[:MAX_ENTRY_BYTES]) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    data.update(fields)
    with contextlib.suppress(OSError):
        _write_json(path, data)


def keep_warm(
    port: FleetPort,
    inventory: Inventory,
    owner: str,
    record_dir: Path,
    policy: Teardown,
    seconds: float,
    say: Say,
    *,
    now: float | None = None,
    start_timer: bool = True,
) -> TeardownOutcome:
    """The teardown action of a kept-warm fleet: arm the nodes' timers and the laptop's deadline
    (and its detached timer). A node whose timer could not be started means a node nothing on
    it would power off: the fleet is then torn down now, as the playbook said."""
    failed = {name: why for name, why in arm_nodes(port, seconds).items() if why}
    for name, why in failed.items():
        say(f"  {name}: could not keep warm ({why}); tearing the fleet down instead")
    if failed:
        return tear_down(inventory, say=lambda m: say(f"  {m}"))
    armed_at = time.time() if now is None else now
    entry = WarmEntry(owner, inventory, armed_at, armed_at + seconds, record_dir)
    path = entry_path(inventory)
    _write_json(path, entry.to_json())
    note_result(record_dir, owner=owner, armed_at=armed_at, deadline=entry.deadline, state="warm")
    if start_timer:
        start_backstop(path)
    say(f"  kept warm: each node powers itself off in {seconds:g} s unless a new run claims it")
    # The cloud's lifetime last: its stack update takes a minute, and the laptop's deadline and
    # timer are kept already if this command is interrupted meanwhile.
    lifetime = warm_lifetime.arm(inventory, entry.deadline, say)
    if lifetime is not None:
        _write_json(path, replace(entry, lifetime=lifetime).to_json())
        note_result(record_dir, lifetime=lifetime)
    return kept_outcome(policy, seconds, lifetime)


HOLD_MIN_S = 600.0
"""A node kept for others, without ``keep_warm_s``, waits at least this long for the next run."""


def hold_for_others(
    port: FleetPort, inventory: Inventory, seconds: float, say: Say, busy: Collection[str] = ()
) -> str:
    """A run that ends while others still use its fleet (a sweep's other slot, another ``fab
    train --hosts``) leaves the fleet up for them, but its own nodes then have no run and no
    watchdog: with the laptop gone, the others' watchdogs power off only their own nodes, and
    these would bill forever. So each of them gets its own timer, as a warm fleet's nodes do:
    it powers the node off ``seconds`` from now unless a run claims it (the sweep's next variant
    on this slot does within seconds). ``busy``: nodes another live run still uses (``busy_hosts``),
    never armed (that run's own end and watchdog decide for them). Returns the words the
    teardown's report adds; nothing on a fleet that cannot power off (a lab's, a scheduler's)."""
    if not getattr(fleet_kind(inventory.fleet), "can_power_off", False):
        return ""
    idle = [name for name in port.connections if name not in busy]
    if not idle:
        return "; its nodes are still another run's: that run's end decides for them"
    failed = {name: why for name, why in arm_nodes(port.subset(idle), seconds).items() if why}
    for name, why in failed.items():
        say(f"  {name}: no idle timer ({why}); the last run's end or the fleet's own deadline ends it")
    return (
        f"; this run's {len(idle) - len(failed)} idle node(s) power themselves off after {seconds:g} s "
        "unless a run claims them"
    )


def busy_hosts(inventory: Inventory, run_id: str, records: RunRecords) -> set[str]:
    """The hosts of ``inventory``'s fleet that another live run this laptop recorded still uses."""
    key, busy = fleet_key(inventory), set()
    for record in records.list(limit=CLAIM_SCAN):
        if record.id == run_id or not _still_running(record):
            continue
        try:
            other = Inventory.model_validate(record.inventory)
        except ValueError:
            continue
        if fleet_key(other) == key:
            busy |= {h.name for h in other.hosts}
    return busy


def arm_nodes(port: FleetPort, seconds: float) -> dict[str, str]:
    """Start each node's own timer; returns every node, with why where it could not be started."""
    command = (
        f'mkdir -p "$HOME/{layout.ROOT}"; setsid nohup python3 "$HOME/{TIMER}" {shlex.quote(f"{seconds:g}")} '
        f'>> "$HOME/{layout.ROOT}/warm.log" 2>&1 < /dev/null & echo armed'
    )

    def arm(conn: NodeLink) -> str:
        result = conn.run(command, timeout=30)
        if not result.ok or "armed" not in result.stdout:
            return (result.stderr or result.stdout).strip()[-200:] or f"exit {result.exit_code}"
        return ""

    results = port.map(arm)
    outcome = {name: clean(why, 300) for name, why in results.errors().items()}
    outcome.update({name: clean(why, 300) for name, why in results.ok.items()})
    return outcome


def kept_outcome(policy: Teardown, seconds: float, lifetime: str | None = None) -> TeardownOutcome:
    """What the run's report (``summary.json``, ``fab runs``) says of its teardown when the fleet
    was kept warm instead, with the cloud's lifetime when one was armed."""
    return TeardownOutcome(
        TeardownState.SKIPPED,
        f"kept warm for {seconds:g} s instead (teardown: {Teardown(policy).value}): the fleet is torn down "
        "then unless a new run claims it" + (f"; and {lifetime}" if lifetime else ""),
    )


def start_backstop(path: Path) -> None:
    """The laptop's detached timer for one ledger entry (``python -m launch.run.warm FILE``): it
    outlives this command, not a closed lid; the next ``fab`` command covers that."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    log = path.with_suffix(".log")
    with open(log, "ab") as out:
        timer = subprocess.Popen(
            [sys.executable, "-m", "launch.run.warm", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=root,
        )
    path.with_suffix(".pid").write_text(
        f"{timer.pid}\n"
    )  # which process keeps it (fab's tests, a curious user)


# -- the deadline's keepers on the laptop ---------------------------------------------------------
def claimed_by(entry: WarmEntry, records: RunRecords) -> str | None:
    """The run this laptop recorded on the warm fleet since it was kept warm, or one that still
    runs on it (started before, on other hosts of the fleet: a sweep's other slot), if any."""
    for record in records.list(limit=CLAIM_SCAN):
        if record.id == entry.owner:
            continue
        if record.started_at < entry.armed_at and not _still_running(record):
            continue
        try:
            inventory = Inventory.model_validate(record.inventory)
        except ValueError:
            continue
        if fleet_key(inventory) == entry.key:
            return record.id
    return None


def _still_running(record: Any) -> bool:
    """A run this laptop recorded that is running with its watcher alive here."""
    return record.state == "running" and bool(record.watcher_pid) and pid_alive(record.watcher_pid)


def run_still_on(inventory: Inventory, run_id: str, records: RunRecords) -> str | None:
    """Another run this laptop recorded that is still running on ``inventory``'s fleet (other
    hosts of it: ``fab train --hosts``, a sweep's other slot), whose watcher is alive: tearing
    the fleet down would end it too. None when there is none."""
    key = fleet_key(inventory)
    for record in records.list(limit=CLAIM_SCAN):
        if record.id == run_id or not _still_running(record):
            continue
        try:
            if fleet_key(Inventory.model_validate(record.inventory)) == key:
                return record.id
        except ValueError:
            continue
    return None


@contextlib.contextmanager
def _locked() -> Iterator[bool]:
    """The ledger's lock, not waited for: True when this process holds it (another is enforcing)."""
    folder = ledger()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def claim(inventory: Inventory, run_id: str, say: Say) -> None:
    """A run is starting on this fleet: when it was kept warm with a lifetime in the cloud, disarm
    that lifetime first, so the cloud does not end the fleet under the run (the run's own end
    decides again, and arms a new one when it keeps the fleet warm). Cheap when nothing is armed:
    one file read. Raises ``FleetrunError`` when the lifetime could not be disarmed: the run would
    be cut off at a known time."""
    path = entry_path(inventory)
    if not path.is_file():
        return  # not warm
    # One disarm for the variants of a sweep starting together (waited for: a second stack update
    # at the same time would be refused); each reads the entry again once it holds the lock.
    with open(path.with_suffix(".claim"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entry = WarmEntry.load(path)
        except (OSError, ValueError):
            return  # gone meanwhile (or not a ledger entry: the next command's enforce says so)
        if entry.lifetime is None:
            return
        try:
            _disarm_for(entry, run_id, say)
        except FleetrunError as exc:
            raise FleetrunError(
                f"the fleet was kept warm by {clean(entry.owner, 100)} and {clean(entry.lifetime, 300)}; that could not "
                f"be disarmed ({clean(exc, 300)}), so this run would be cut off then. Try again, or tear the "
                "fleet down and bring it up anew"
            ) from None
        _write_json(path, replace(entry, lifetime=None).to_json())


def _disarm_for(entry: WarmEntry, run_id: str, say: Say) -> None:
    say(f"fleetrun: {clean(run_id, 100)} reuses the warm fleet: disarming its instance lifetime in the cloud")
    warm_lifetime.disarm(entry.inventory, say)
    note_result(entry.record_dir, lifetime_state="disarmed", lifetime_disarmed_by=run_id)


def enforce(path: Path, records: RunRecords, say: Say, now: float | None = None) -> TeardownOutcome | None:
    """Keep one ledger entry's deadline: past it, tear the fleet down unless a run claimed it.
    Returns the teardown's outcome, or None when nothing was torn down."""
    with _locked() as mine:
        if not mine:
            return None
        try:
            entry = WarmEntry.load(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            say(f"fleetrun: {clean(path, 300)} is not a warm fleet fleetrun wrote ({exc}); removed")
            path.unlink(missing_ok=True)
            return None
        now = time.time() if now is None else now
        if now < entry.deadline:
            return None
        claim = claimed_by(entry, records)
        if claim is not None:
            if entry.lifetime is not None:  # the claiming run started without disarming it
                try:
                    _disarm_for(entry, claim, say)
                except FleetrunError as exc:
                    say(f"fleetrun: could not disarm it ({clean(exc, 300)}): {clean(entry.lifetime, 300)}")
            path.unlink(missing_ok=True)
            note_result(entry.record_dir, state="claimed", claimed_by=claim, decided_at=now)
            return None
        say(f"fleetrun: the warm fleet of {clean(entry.owner, 100)} is past its deadline: tearing it down")
        outcome = tear_down(entry.inventory, say=lambda m: say(f"  {m}"))
        path.unlink(missing_ok=True)
        if entry.lifetime is not None:
            done = outcome.state is TeardownState.DONE
            if not done:
                say(f"  the cloud still ends the instances: {clean(entry.lifetime, 300)}")
            note_result(entry.record_dir, lifetime_state="removed with the fleet" if done else "still armed")
        note_result(entry.record_dir, state="torn_down", teardown=outcome.to_json(), decided_at=now)
        _record_teardown(entry.record_dir, outcome)
        return outcome


def _record_teardown(folder: Path, outcome: TeardownOutcome) -> None:
    """The run's ``summary.json`` says how its fleet finally went (it said "kept warm" before)."""
    path = folder / "summary.json"
    try:
        summary = json.loads(path.read_text()[: MAX_ENTRY_BYTES * 16])
    except (OSError, ValueError):
        return
    if isinstance(summary, dict):
        summary["teardown"] = outcome.to_json()
        summary["kept_warm"] = True
        with contextlib.suppress(OSError):
            _write_json(path, summary)


def due(now: float | None = None) -> list[Path]:
    """Ledger entries whose deadline passed (read without the lock: ``enforce`` checks again)."""
    now = time.time() if now is None else now
    found = []
    for path in sorted(ledger().glob("*.json")) if ledger().is_dir() else []:
        try:
            if WarmEntry.load(path).deadline <= now:
                found.append(path)
        except (OSError, ValueError):
            found.append(path)  # enforce says so and removes it
    return found


def enforce_due(say: Say = print, now: float | None = None) -> None:
    """Every passed deadline kept (any ``fab`` command calls this first). Never raises: a
    command is not refused because a warm fleet could not be torn down; it says so."""
    paths = due(now)
    if not paths:
        return
    try:
        with RunRecords(fleetrun_home() / "runs.db") as records:
            for path in paths:
                enforce(path, records, say, now)
    except Exception as exc:  # noqa: BLE001 - the command the user asked for still runs
        say(f"fleetrun: could not check the warm fleets' deadlines: {type(exc).__name__}: {clean(exc, 300)}")


def backstop(path: Path, sleep: Callable[[float], None] = time.sleep) -> int:
    """The detached laptop timer: sleep to the entry's deadline (re-read: a later run may have
    re-armed the fleet, with a timer of its own), then keep it."""
    try:
        mine = WarmEntry.load(path)
    except (OSError, ValueError):
        return 0
    while True:
        try:
            entry = WarmEntry.load(path)
        except (OSError, ValueError):
            return 0  # enforced, claimed or replaced and removed
        if (entry.owner, entry.armed_at) != (mine.owner, mine.armed_at):
            return 0  # re-armed by a later run: its own timer keeps it
        left = entry.deadline - time.time()
        if left <= 0:
            break
        sleep(min(left, 30.0))
    with RunRecords(fleetrun_home() / "runs.db") as records:
        enforce(path, records, lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(backstop(Path(sys.argv[1])) if len(sys.argv) == 2 else 2)
