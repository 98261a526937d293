"""Holding shared machines without becoming a scheduler: the queue entries on each machine.

Labs that share a few machines without Slurm retry by hand when ``fab train`` finds the GPUs
busy. Every real run (``fab train``, with or without ``--wait``) puts an entry on every machine
it uses and keeps it fresh until it ends: that is how a run *holds* its machines. Without
``--wait`` a run that finds an earlier live entry on one of its machines (for GPUs it would
share) is refused at once, naming who holds it; with ``--wait`` it starts when its entry is the
first such one on each machine: arrival order, nothing else (no priorities, no fair share: labs
that need those run Slurm). Runs on disjoint GPU lists of one machine (inventory ``gpus: [0, 1]``
and ``gpus: [2, 3]``) do not hold each other up.

Where entries live, and why they can be trusted. Each user of a machine writes only in a folder
of their own directly under ``/tmp`` (root's sticky folder), ``fleetrun-queue-<hostname>.u<uid>``,
mode 0755 (everyone reads it, only its owner writes), and reads everyone's. A folder counts only
when it is a real folder owned by the uid its name says and writable by nobody else; an entry
only when it is a regular file owned by that same uid. So no user can forge, remove or block
another user's entries: a folder squatted under someone else's name is skipped with a warning
(its rightful user then writes in ``...u<uid>.<random>``, made with ``O_EXCL``), a FIFO or a
symlink in place of an entry is skipped and never opened (``O_NONBLOCK | O_NOFOLLOW`` besides),
and nothing depends on a shared folder's owner or mode (the old design's
``/tmp/fleetrun-queue-<host>``, which whoever created first owned, is not read).

An entry is a file named by its arrival time (nanoseconds) and run id, holding JSON: who waits
(``owner``, user@laptop), the laptop process (``pid``), the GPUs it wants (``gpus``, null for all)
and its lease (``lease_s``: how long it lives without a refresh). Its laptop refreshes it (its
mtime) each poll while waiting and every ``lease_s / 4`` while the run runs, and removes it when
the run ends or on Ctrl-C (and the user's folder with it once it is empty: a machine is left
without a trace of the queue). The reader checks the lease: an entry not refreshed within it (a
laptop that went away: killed, lid closed, network lost) is stale, and one dated in the future
(its mtime or its name; an honest entry never is, both come from the machine's own clock) is
skipped too: each with a warning, never blocking the next run for longer than the lease. An
entry's lease is at most ``MAX_LEASE_S``.

Pure: the node-side script (standard library only, sent on stdin so it needs nothing synced) and
the parsing of what it prints.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launch.nodelib.fleetrun_wire import ProtocolError, decode

DEFAULT_TTL_S = 60.0
MAX_LEASE_S = 3600.0
MAX_ENTRIES = 1000
FUTURE_SLACK_S = 5.0
"""How far in the future an entry's dates may be (one clock, the machine's: only rounding)."""
_RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ALL_GPUS = "all"

SCRIPT = r"""
import json, os, re, secrets, socket, stat, sys, time
action, run_id, owner, lease, pid, gpus = sys.argv[1:7]
top_dir = sys.argv[7] if len(sys.argv) > 7 else "/tmp"
lease = float(lease)
uid = os.getuid()
host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:64]
prefix = "fleetrun-queue-" + host + ".u"
name_re = re.compile(r"fleetrun-queue-" + re.escape(host) + r"\.u([0-9]{1,10})(\.[0-9a-f]{8})?")
entry_re = re.compile(r"[0-9]{20}-[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
def skip(why):
    print("QUEUE-SKIP " + json.dumps(why[:300]))
top = os.stat(top_dir)
if not stat.S_ISDIR(top.st_mode) or top.st_uid != 0 or (top.st_mode & 0o002 and not top.st_mode & 0o1000):
    print("QUEUE-ERROR " + top_dir + " is not root's folder (sticky when others may write in it)"); sys.exit(0)
folders = []  # (path, owner uid)
with os.scandir(top_dir) as found:
    for d in found:
        m = name_re.fullmatch(d.name)
        if not m:
            continue
        if len(folders) >= 200:
            skip("more than 200 queue folders; the rest not read"); break
        path = os.path.join(top_dir, d.name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        claimed = int(m.group(1))
        if not stat.S_ISDIR(st.st_mode):
            skip(path + " is not a folder"); continue
        if st.st_uid != claimed:
            skip(path + " is owned by uid %d, not by uid %d its name gives" % (st.st_uid, claimed)); continue
        if st.st_mode & 0o022:
            skip(path + " is writable by others than its owner"); continue
        folders.append((path, claimed))
mine = [p for p, u in folders if u == uid]
if action == "enqueue" and not mine:
    for name in (prefix + str(uid), prefix + str(uid) + "." + secrets.token_hex(4)):
        path = os.path.join(top_dir, name)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue  # squatted (skipped above with a warning): a name of our own instead
        os.chmod(path, 0o755)
        mine = [path]; folders.append((path, uid)); break
    else:
        print("QUEUE-ERROR cannot make a queue folder of this user's in " + top_dir); sys.exit(0)
def entries(path, owner_uid):
    out = []
    try:
        names = sorted(os.listdir(path))[:1000]
    except OSError:
        return out
    for n in names:
        if not entry_re.fullmatch(n):
            continue
        full = os.path.join(path, n)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            skip(full + " is not a regular file"); continue
        if st.st_uid != owner_uid:
            skip(full + " is owned by uid %d, not by its folder's owner" % st.st_uid); continue
        out.append((n, full, st))
    return out
own = [e for p in mine for e in entries(p, uid) if e[0].split("-", 1)[1] == run_id]
if action == "enqueue" and not own:
    name = "%020d-%s" % (time.time_ns(), run_id)
    full = os.path.join(mine[0], name)
    try:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileNotFoundError:  # the folder went empty and was removed by a "leave" of ours just now
        os.mkdir(mine[0], 0o755); os.chmod(mine[0], 0o755)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    body = {"owner": owner[:200], "pid": int(pid) if pid.isdigit() else 0, "lease_s": lease}
    body["gpus"] = None if gpus == "all" else [int(g) for g in gpus.split(",") if g.isdigit()][:1024]
    os.write(fd, json.dumps(body).encode()); os.close(fd)
    own = [(name, full, os.lstat(full))]
for n, full, st in own:
    try:
        if action == "leave":
            os.unlink(full)
        elif action in ("enqueue", "touch"):
            os.utime(full, None)
    except OSError:
        pass
if action == "leave":
    for path in mine:  # an emptied folder goes too: a machine is left as the run found it
        try:
            os.rmdir(path)
        except OSError:
            pass  # another run of this user still has an entry in it
    sys.exit(0)
now = time.time()
for path in mine:  # this user's own entries whose lease ran out (a laptop of theirs that went away)
    for n, full, st in entries(path, uid):
        if n.split("-", 1)[1] != run_id and now - st.st_mtime > lease:
            try:
                os.unlink(full)
            except OSError:
                pass
for path, owner_uid in folders:
    for n, full, st in entries(path, owner_uid):
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                data = json.loads(os.read(fd, 2000) or b"{}")
            finally:
                os.close(fd)
        except (OSError, ValueError, RecursionError):
            skip(full + " cannot be read as an entry"); continue
        if not isinstance(data, dict):
            skip(full + " is not an entry"); continue
        try:
            import pwd; user = pwd.getpwuid(owner_uid).pw_name
        except (KeyError, ImportError):
            user = str(owner_uid)
        print("QUEUE " + json.dumps({"name": n, "user": user, "owner": str(data.get("owner", ""))[:200],
              "age": now - st.st_mtime, "now_ns": time.time_ns(), "lease_s": data.get("lease_s"),
              "pid": data.get("pid"), "gpus": data.get("gpus"), "mine": owner_uid == uid}))
"""


def script_command(
    python: str,
    action: str,
    run_id: str,
    owner: str,
    lease_s: float,
    pid: int = 0,
    gpus: str = ALL_GPUS,
    top_dir: str = "/tmp",
) -> str:
    """The shell command that runs ``SCRIPT`` (given on stdin) for one action. ``gpus``: the
    host's GPU list (``gpus_arg``), or ``all``; ``top_dir``: where the users' queue folders lie
    (``/tmp``; a test's own root-owned folder)."""
    if action not in ("enqueue", "touch", "leave", "list"):
        raise ValueError(f"unknown queue action {action!r}")
    return (
        f"{shlex.quote(python)} - {action} {shlex.quote(run_id)} {shlex.quote(owner)} {lease_s:g} "
        f"{int(pid)} {shlex.quote(gpus)} {shlex.quote(top_dir)}"
    )


def gpus_arg(gpus: int | Sequence[int] | None) -> str:
    """What a host's inventory ``gpus`` means for holding it: a list is that subset, anything
    else (a count, unknown) the whole machine."""
    if isinstance(gpus, int) or gpus is None:
        return ALL_GPUS
    return ",".join(str(int(g)) for g in gpus) or ALL_GPUS


@dataclass(frozen=True)
class Entry:
    """One run's hold on (or wait for) a machine, as the machine reported it.

    ``future``: dated in the future (its mtime or its name), which an honest entry never is;
    ``lease_s``: how long it lives without a refresh, as it said (bounded by ``MAX_LEASE_S``)."""

    arrived_ns: int
    run_id: str
    user: str
    owner: str
    age_s: float
    lease_s: float = DEFAULT_TTL_S
    pid: int = 0
    gpus: tuple[int, ...] | None = None
    future: bool = False

    def live(self, ttl_s: float) -> bool:
        """Refreshed within its lease (and the reader's ``ttl_s``), and not dated in the future."""
        return not self.future and self.age_s < min(self.lease_s, ttl_s)

    def shares_gpus(self, gpus: tuple[int, ...] | None) -> bool:
        """Whether this entry and a run on ``gpus`` (None: all) want a GPU in common."""
        return self.gpus is None or gpus is None or bool(set(self.gpus) & set(gpus))

    def why_skipped(self, ttl_s: float) -> str:
        """Why a present entry does not count (for the warning); "" when it does."""
        if self.future:
            return "dated in the future"
        if not self.live(ttl_s):
            return f"stale: not refreshed for {self.age_s:.0f} s (its lease: {min(self.lease_s, ttl_s):g} s)"
        return ""


def _gpus_of(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(type(g) is int and 0 <= g < 1024 for g in value[:1024]):
        return tuple(value[:1024])
    return None


def _lease_of(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return max(1.0, min(float(value), MAX_LEASE_S))
    return DEFAULT_TTL_S


MAX_LINE_CHARS = 8192
"""A line of the queue script's listing: an entry it read (2,000 bytes at most) as JSON, or a note."""


def parse_listing(text: str) -> list[Entry]:
    """What ``SCRIPT`` printed, strictly (a line that is not exactly an entry is skipped); oldest first."""
    entries = []
    for line in text.splitlines()[: MAX_ENTRIES * 3 + 10]:
        if not line.startswith("QUEUE "):
            continue
        try:
            data = decode(line[6:], MAX_LINE_CHARS, "a queue entry")
            stamp, run_id = str(data["name"]).split("-", 1)
            age = float(data["age"])
        except (ProtocolError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if not stamp.isdigit() or not _RUN_RE.fullmatch(run_id) or age != age:
            continue
        now_ns = data.get("now_ns")
        future = age < -FUTURE_SLACK_S or (
            type(now_ns) is int and int(stamp) > now_ns + int(FUTURE_SLACK_S * 1e9)
        )
        pid = data.get("pid")
        entries.append(
            Entry(
                int(stamp),
                run_id,
                str(data.get("user", ""))[:64],
                str(data.get("owner", ""))[:200],
                age,
                _lease_of(data.get("lease_s")),
                pid if type(pid) is int and 0 < pid < 1 << 32 else 0,
                _gpus_of(data.get("gpus")),
                future,
            )
        )
    return sorted(entries, key=lambda e: (e.arrived_ns, e.run_id))[:MAX_ENTRIES]


def skipped_notes(text: str) -> list[str]:
    """The script's warnings (folders and files it did not read), at most 20."""
    notes = []
    for line in text.splitlines()[: MAX_ENTRIES * 3 + 10]:
        if line.startswith("QUEUE-SKIP "):
            try:
                note = decode(line[11:], MAX_LINE_CHARS, "a queue note")
            except ProtocolError:
                continue
            if isinstance(note, str):
                notes.append(note[:300])
    return notes[:20]


def queue_error(text: str) -> str | None:
    for line in text.splitlines()[:20]:
        if line.startswith("QUEUE-ERROR "):
            return line[12:200]
    return None


def ahead_of(
    entries: list[Entry],
    run_id: str,
    ttl_s: float,
    gpus: tuple[int, ...] | None = None,
    gone: Callable[[Entry], bool] = lambda _e: False,
) -> list[Entry]:
    """The live entries before ``run_id``'s (all live ones when it has none) that want a GPU it
    wants: who it waits for. ``gone``: entries known to be dead (this laptop's own process that
    no longer exists) are not waited for."""
    ahead: list[Entry] = []
    for entry in entries:
        if entry.run_id == run_id:
            return ahead
        if entry.live(ttl_s) and entry.shares_gpus(gpus) and not gone(entry):
            ahead.append(entry)
    return ahead
