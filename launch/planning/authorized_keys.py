"""Adding and removing fleetrun's own lines in a node user's ``~/.ssh/authorized_keys``, safely.

The operator's lines are never touched: fleetrun's line goes on a line of its own (a newline
first when the file lacks a trailing one) and is removed by exact whole-line match, and the
file is otherwise kept byte for byte. Removing a line takes the newline that separates it with
it, so a file that ended without a newline ends without one again.

The edit runs on the node as a short standard-library Python program (nodes have ``python3``:
preflight checks it): under an exclusive lock on ``~/.ssh`` (two runs editing at once lose
nothing), written to a temporary file and renamed over the original (a crash leaves the old or
the new file, never half of one), with the original's mode. A file the user cannot write is
reported, not replaced. Everything here is pure: it returns shell commands.

Lines carry ``expiry-time`` (``expiry_time``), so a key whose revocation never ran (the laptop
lost power) stops working by itself.
"""

from __future__ import annotations

import shlex
import time

# The node-side editor. argv: ACTION LINE [RECORD]. Exit 0: done; 3: cannot write the file.
#   add LINE             append LINE unless present
#   add LINE RECORD      also remove the lines listed in RECORD (an earlier run's), then note LINE there
#   remove LINE          remove every line equal to LINE
#   remove-recorded - RECORD   remove the lines listed in RECORD that carry a fleetrun tag, and RECORD
EDITOR = r"""
import fcntl, os, sys
TAGS = (b"fleetrun-cluster:", b"fleetrun-relay-")
action, line, record = sys.argv[1], sys.argv[2].encode(), (sys.argv[3] if len(sys.argv) > 3 else "")
home = os.path.expanduser("~")
ssh = os.path.join(home, ".ssh")
os.makedirs(ssh, mode=0o700, exist_ok=True)
lock = os.open(ssh, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(lock, fcntl.LOCK_EX)
path = os.path.realpath(os.path.join(ssh, "authorized_keys"))
try:
    with open(path, "rb") as fh:
        data = fh.read()
    mode = os.stat(path).st_mode & 0o7777
except FileNotFoundError:
    data, mode = b"", 0o600
def recorded():
    if not record:
        return []
    try:
        fd = os.open(os.path.join(home, record), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        return [r for r in fh.read(65536).split(b"\n") if r.split(b" ")[-1].startswith(TAGS)]
pieces = data.split(b"\n")
drop = set(recorded()) if action in ("add", "remove-recorded") else set()
if action == "remove":
    drop.add(line)
drop.discard(line if action == "add" else b"\0")
kept = [p for p in pieces if p not in drop]
new = b"\n".join(kept)
if action == "add" and line not in kept:
    new = new + line + b"\n" if not new or new.endswith(b"\n") else new + b"\n" + line
    print("FLEETRUN_KEY=installed")
if new != data:
    if os.path.exists(path) and not os.access(path, os.W_OK):
        sys.exit("fleetrun: cannot write " + path)
    tmp = path + ".fleetrun-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(new)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
if record and action == "add":
    os.makedirs(os.path.dirname(os.path.join(home, record)), mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(home, record), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(line + b"\n")
elif record and action == "remove-recorded":
    try:
        os.unlink(os.path.join(home, record))
    except FileNotFoundError:
        pass
"""
# Dates without the "Z" (UTC) suffix, which older OpenSSH releases refuse (the whole line is then
# ignored); sshd reads them in its own time zone, so the slack covers every zone offset: a key
# never expires before its time, and at worst some hours after it.
ZONE_SLACK_S = 14 * 3600


def check_line(line: str) -> str:
    if "\n" in line or "\r" in line or "\0" in line:
        raise ValueError("an authorized_keys line must be a single line")
    return line


def expiry_time(valid_for_s: float, now: float | None = None) -> str:
    """``YYYYMMDDHHMM`` for ``expiry-time="..."``: at least ``valid_for_s`` from now in any zone."""
    moment = (time.time() if now is None else now) + valid_for_s + ZONE_SLACK_S
    return time.strftime("%Y%m%d%H%M", time.gmtime(moment))


def _editor(*args: str) -> str:
    return "python3 -c " + shlex.quote(EDITOR) + " " + " ".join(shlex.quote(a) for a in args)


def add_command(line: str, record: str = "") -> str:
    """Shell: add ``line``; with ``record`` (home-relative), first remove the line an earlier run noted there.

    Prints ``FLEETRUN_KEY=installed`` when it changed the file.
    """
    return _editor("add", check_line(line), *([record] if record else []))


def add_command_for_variable(variable: str, record: str = "") -> str:
    """``add_command`` for a line held in the shell variable ``variable`` (a script that shows it once)."""
    if not variable.isidentifier():
        raise ValueError(f"not a shell variable name: {variable!r}")
    return (
        "python3 -c "
        + shlex.quote(EDITOR)
        + f' add "${variable}"'
        + (f" {shlex.quote(record)}" if record else "")
    )


def remove_command(line: str) -> str:
    """Shell: remove every line exactly equal to ``line``; nothing else changes."""
    return _editor("remove", check_line(line))


def remove_recorded_command(record: str) -> str:
    """Shell: remove the fleetrun line noted in ``record`` (by ``add_command``), and the note.

    For the end of a run, which no longer has the line itself. Only lines ending in a
    fleetrun cluster or relay tag are taken from the note, so a note edited to name another key removes nothing else.
    """
    return _editor("remove-recorded", "-", record)
