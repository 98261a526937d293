#!/usr/bin/env python3
"""A workdir's listing and small patches to it: the node side of a re-sync over open connections.

A re-sync by rsync costs every node a new SSH connection and an rsync on both ends, even for one
changed file. When the laptop already holds an open connection to each node and the change is
small, it asks each node for a listing of its workdir (``list``: one line per entry, type, mode,
size and whole-second mtime, as rsync's quick check compares them), sends only what differs
(``apply``), and the node answers the listing's digest afterwards, which must equal the laptop's.
Anything the laptop cannot prove equal to what rsync would leave goes through rsync instead.
The same ``entry`` function makes both sides' listings (the laptop imports this module).
Standard library only, Python 3.8 at run time.

  fleetrun_tree.py list DEST DIGEST   -> "same", "missing", or "listing" and one entry per line
  fleetrun_tree.py apply DEST         -> stdin: one JSON header line, then the files' bytes;
                                         answers "applied <digest>" (digest of the listing,
                                         leaving out the header's ``ignore`` paths)
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys

# What every sync leaves out (``launch.transport.sync.ALWAYS_EXCLUDED``): never listed, never touched.
EXCLUDED_NAMES = (".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache")
EXCLUDED_SUFFIXES = (".pyc",)
MAX_HEADER_BYTES = 4 << 20
MAX_FILES = 10_000


def excluded(name: str) -> bool:
    return name in EXCLUDED_NAMES or name.endswith(EXCLUDED_SUFFIXES)


def entry(root: str, rel: str) -> str:
    """One listing line for ``rel`` under ``root``: JSON ``[kind, path, mode, size, mtime]``.

    Directories carry no size or mtime (rsync's and this patch's temporary files change them);
    links carry their target as size.
    """
    st = os.lstat(os.path.join(root, rel))
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        item: list[object] = ["d", rel, mode, 0, 0]
    elif stat.S_ISREG(st.st_mode):
        item = ["f", rel, mode, st.st_size, int(st.st_mtime)]
    elif stat.S_ISLNK(st.st_mode):
        item = ["l", rel, 0, os.readlink(os.path.join(root, rel)), 0]
    else:
        item = ["o", rel, mode, 0, 0]
    return json.dumps(item, separators=(",", ":"))


def walk(root: str) -> list[str]:
    """Every path under ``root`` (relative, sorted), excluded names pruned, links not followed."""
    found: list[str] = []

    def visit(rel: str) -> None:
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            items = sorted(it, key=lambda e: e.name)
        for item in items:
            if excluded(item.name):
                continue
            path = f"{rel}/{item.name}" if rel else item.name
            found.append(path)
            if item.is_dir(follow_symlinks=False):
                visit(path)

    visit("")
    return sorted(found)


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def listing(root: str, ignore: frozenset[str] = frozenset()) -> list[str]:
    return [entry(root, rel) for rel in walk(root) if rel not in ignore]


def safe_rel(root: str, rel: str) -> str:
    """``rel`` if it names a place inside ``root`` reached without a symlink; ValueError otherwise."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") or excluded(p) for p in parts):
        raise ValueError(f"refused path {rel!r}")
    here = root
    for part in parts[:-1]:
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise ValueError(f"refused path {rel!r}: {part} is a symlink")
    return os.path.join(root, rel)


def apply(root: str, stream: object) -> str:
    """Write the header's dirs and files (each file to a fresh temporary name, then renamed over)."""
    read = stream.read  # type: ignore[attr-defined]
    header_line = stream.readline(MAX_HEADER_BYTES + 1)  # type: ignore[attr-defined]
    header = json.loads(header_line)
    dirs, files, ignore = header["dirs"], header["files"], header.get("ignore", [])
    if len(files) > MAX_FILES or len(dirs) > MAX_FILES:
        raise ValueError("too many entries")
    os.makedirs(root, exist_ok=True)
    for rel, mode in dirs:
        path = safe_rel(root, rel)
        if not os.path.isdir(path) or os.path.islink(path):
            os.mkdir(path, 0o700)
        os.chmod(path, int(mode) & 0o7777)
    for rel, mode, size, mtime in files:
        path = safe_rel(root, rel)
        data = read(int(size))
        if len(data) != int(size):
            raise ValueError(f"{rel}: short input")
        tmp = f"{path}.fleetrun-patch-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, int(mode) & 0o7777)
        finally:
            os.close(fd)
        os.utime(tmp, (int(mtime), int(mtime)))
        os.replace(tmp, path)
    return digest(listing(root, frozenset(ignore)))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "list":
        root, want = argv[1], argv[2]
        if not os.path.isdir(root):
            print("missing")
            return 0
        lines = listing(root)
        if digest(lines) == want:
            print("same")
        else:
            sys.stdout.write("listing\n" + "".join(line + "\n" for line in lines))
        return 0
    if len(argv) == 2 and argv[0] == "apply":
        try:
            print("applied " + apply(argv[1], sys.stdin.buffer))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"fleetrun_tree.py apply: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
