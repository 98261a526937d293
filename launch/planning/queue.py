"""Waiting for shared machines without becoming a scheduler: the queue files on each machine.

Labs that share a few machines without Slurm retry by hand when ``fab train`` finds the GPUs
busy. ``fab train --wait`` instead puts an entry in a queue folder on every machine the run needs
(``/tmp/fleetrun-queue-<hostname>``, sticky and world-writable like ``/tmp``, so the runs of every
user of the machine meet there) and starts when its entry is the oldest live one on each of them:
arrival order, nothing else (no priorities, no fair share: labs that need those run Slurm).

An entry is a file named by its arrival time (nanoseconds) and run id, created atomically
(``O_EXCL``) over the pinned connection. It lives while its laptop refreshes it (its mtime): the
waiting laptop does so each poll, the running one every few seconds for the whole run, and it
removes it when the run ends or on Ctrl-C. The entry of a laptop that went away (killed, lid
closed, network lost) is not refreshed and counts as gone after ``ttl_s``: it never blocks the
next run for longer than that. Pure: the node-side script (standard library only, sent on
stdin so it needs nothing synced) and the parsing of what it prints.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

DEFAULT_TTL_S = 60.0
MAX_ENTRIES = 1000
_RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

SCRIPT = r"""
import json, os, socket, sys, time
action, run_id, owner, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
base = "/tmp/fleetrun-queue-" + "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:64]
try:
    os.mkdir(base, 0o1777)
    os.chmod(base, 0o1777)
except FileExistsError:
    pass
st = os.lstat(base)
if not os.path.isdir(base) or os.path.islink(base) or not st.st_mode & 0o1000:
    print("QUEUE-ERROR " + base + " is not a sticky folder"); sys.exit(0)
names = sorted(n for n in os.listdir(base) if not n.startswith("."))[:1000]
mine = [n for n in names if n.split("-", 1)[-1] == run_id]
if action == "enqueue" and not mine:
    name = "%020d-%s" % (time.time_ns(), run_id)
    fd = os.open(os.path.join(base, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.write(fd, json.dumps({"owner": owner[:200]}).encode()); os.close(fd)
    names = sorted(names + [name]); mine = [name]
for n in mine:
    path = os.path.join(base, n)
    try:
        if action == "leave":
            os.unlink(path)
        elif action in ("enqueue", "touch"):
            os.utime(path, None)
    except OSError:
        pass
if action == "leave":
    sys.exit(0)
now = time.time()
for n in names:  # this user's own entries that expired (a laptop of theirs that went away)
    path = os.path.join(base, n)
    try:
        st = os.lstat(path)
        if st.st_uid == os.getuid() and n not in mine and now - st.st_mtime > ttl:
            os.unlink(path)
    except OSError:
        pass
for n in names:
    try:
        st = os.lstat(os.path.join(base, n))
        with open(os.path.join(base, n), "rb") as fh:
            data = json.loads(fh.read(1000) or b"{}")
    except (OSError, ValueError):
        continue
    try:
        import pwd; user = pwd.getpwuid(st.st_uid).pw_name
    except (KeyError, ImportError):
        user = str(st.st_uid)
    owner_of = data.get("owner", "") if isinstance(data, dict) else ""
    print("QUEUE " + json.dumps({"name": n, "user": user, "owner": str(owner_of)[:200], "age": now - st.st_mtime}))
"""


def script_command(python: str, action: str, run_id: str, owner: str, ttl_s: float) -> str:
    """The shell command that runs ``SCRIPT`` (given on stdin) for one action."""
    import shlex

    if action not in ("enqueue", "touch", "leave", "list"):
        raise ValueError(f"unknown queue action {action!r}")
    return f"{shlex.quote(python)} - {action} {shlex.quote(run_id)} {shlex.quote(owner)} {ttl_s:g}"


@dataclass(frozen=True)
class Entry:
    """One run in a machine's queue, as the machine reported it."""

    arrived_ns: int
    run_id: str
    user: str
    owner: str
    age_s: float

    def live(self, ttl_s: float) -> bool:
        return self.age_s < ttl_s


def parse_listing(text: str) -> list[Entry]:
    """What ``SCRIPT`` printed, strictly (a line that is not exactly an entry is skipped); oldest first."""
    entries = []
    for line in text.splitlines()[: MAX_ENTRIES + 10]:
        if not line.startswith("QUEUE "):
            continue
        try:
            data = json.loads(line[6:])
            stamp, run_id = str(data["name"]).split("-", 1)
            age = float(data["age"])
        except (ValueError, KeyError, TypeError):
            continue
        if not stamp.isdigit() or not _RUN_RE.fullmatch(run_id) or age != age:
            continue
        entries.append(
            Entry(int(stamp), run_id, str(data.get("user", ""))[:64], str(data.get("owner", ""))[:200], age)
        )
    return sorted(entries, key=lambda e: (e.arrived_ns, e.run_id))


def queue_error(text: str) -> str | None:
    for line in text.splitlines()[:20]:
        if line.startswith("QUEUE-ERROR "):
            return line[12:200]
    return None


def ahead_of(entries: list[Entry], run_id: str, ttl_s: float) -> list[Entry]:
    """The live entries before ``run_id``'s (all live ones when it has none): who it waits for."""
    ahead: list[Entry] = []
    for entry in entries:
        if entry.run_id == run_id:
            return ahead
        if entry.live(ttl_s):
            ahead.append(entry)
    return ahead
