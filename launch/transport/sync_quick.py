"""Re-sync a small change over the connections the run already holds: no new SSH, no rsync per node.

An unchanged or one-file re-sync by rsync costs every node an SSH handshake and an rsync on both
ends (at 64 nodes on one machine, seconds of CPU); the relay adds its own per worker. ``fab
train`` has an open, host-key-pinned connection to every node by then. So, for nodes whose node
library is current (``fleetrun_tree.py`` is part of it):

1. this machine lists what rsync would send (``rsync --list-only`` with the same filters, so
   ``.gitignore`` is rsync's own reading) and makes one ``fleetrun_tree.entry`` line per path;
2. each node answers ``same`` when its workdir's listing has the same digest, or its listing;
3. where the difference is only files and directories to write (no link, no type change, no path
   that rsync would delete: an extra on the node that is not ignored here) and all nodes' writes
   together stay under ``MAX_TOTAL_BYTES`` (they cross the uplink once per node), the node gets
   just those files on stdin, writes each under a temporary name and renames it over, and answers
   its new listing's digest, which must equal this machine's.

Every node this cannot prove equal to what rsync would leave is returned as not done, and the
caller syncs it with rsync (directly or through the head), so this can only make a sync faster.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from launch.job.inventory import Host
from launch.nodelib import fleetrun_tree as tree
from launch.planning import remote_layout as layout
from launch.transport.ssh import Fleet, NodeConnection
from launch.transport.sync import SyncResult, rsync_filters

TREE_SCRIPT = f"{layout.LIB}/fleetrun_tree.py"
MAX_TOTAL_BYTES = 8 << 20  # 8 MB over all nodes: ~0.3 s at 200 Mbit/s; more goes by rsync (relay)
MAX_CHANGED_FILES = 1000
COMMAND_TIMEOUT = 60.0
VIA = "open connection"


class NotQuick(Exception):
    """This node (or the whole tree) needs rsync: the reason, for the log."""


@dataclass(frozen=True)
class LocalTree:
    """This machine's side: each path rsync would send, its listing line and its digest."""

    root: Path
    entries: dict[str, str]
    digest: str

    @classmethod
    def read(cls, workdir: Path) -> LocalTree:
        names = rsync_names(workdir)
        root = str(workdir)
        entries = {rel: tree.entry(root, rel) for rel in names}
        return cls(workdir, entries, tree.digest(list(entries.values())))


def rsync_names(workdir: Path) -> list[str]:
    """The relative paths rsync sends from ``workdir`` with the sync's filters (its own reading)."""
    argv = ["rsync", "-a", "--list-only", *rsync_filters(workdir), f"{workdir}/"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise NotQuick(f"rsync --list-only failed ({proc.returncode}): {proc.stderr.strip()[-200:]}")
    names = []
    for line in proc.stdout.splitlines():
        fields = line.split(None, 4)
        if len(fields) != 5:
            raise NotQuick(f"unexpected rsync listing line {line[:80]!r}")
        name = fields[4]
        if fields[0].startswith("l"):
            name = name.rsplit(" -> ", 1)[0]
        if "\\#" in name:
            raise NotQuick("a name rsync escapes (a control character or invalid UTF-8)")
        if name != ".":
            names.append(name)
    return names


def parse_listing(text: str) -> dict[str, list[object]]:
    """A node's listing (untrusted): ``{path: [kind, path, mode, size, mtime]}``; NotQuick if malformed."""
    lines = text.splitlines()
    if not lines or lines[0] != "listing":
        raise NotQuick(f"unexpected answer {text[:80]!r}")
    found: dict[str, list[object]] = {}
    for line in lines[1:]:
        try:
            item = json.loads(line)
        except ValueError:
            raise NotQuick(f"unparseable listing line {line[:80]!r}") from None
        if not (isinstance(item, list) and len(item) == 5 and isinstance(item[1], str)):
            raise NotQuick(f"malformed listing line {line[:80]!r}")
        parts = item[1].split("/")
        if item[1].startswith("/") or any(p in ("", ".", "..") for p in parts) or len(item[1]) > 4096:
            # a node's path is looked up under the local workdir (plan_patch): never outside it
            raise NotQuick(f"listing path outside the workdir {item[1][:80]!r}")
        found[item[1]] = item
    return found


@dataclass(frozen=True)
class Patch:
    dirs: list[tuple[str, int]]
    files: list[tuple[str, int, int, int]]
    ignore: list[str]

    @property
    def size(self) -> int:
        return sum(f[2] for f in self.files)


def plan_patch(local: LocalTree, node: dict[str, list[object]]) -> Patch:
    """What to write so that the node's listing equals ``local``'s; NotQuick where rsync is needed."""
    dirs: list[tuple[str, int]] = []
    files: list[tuple[str, int, int, int]] = []
    for rel, line in local.entries.items():
        want = json.loads(line)
        have = node.get(rel)
        if have == want:
            continue
        if want[0] == "d" and (have is None or have[0] == "d"):
            dirs.append((rel, int(want[2])))
        elif want[0] == "f" and (have is None or have[0] == "f"):
            files.append((rel, int(want[2]), int(want[3]), int(want[4])))
        else:
            raise NotQuick(f"{rel}: {have[0] if have else 'missing'} on the node, {want[0]} here")
    ignore = []
    for rel in node:
        if rel in local.entries:
            continue
        if not _in_own_tree(local.root, rel):
            raise NotQuick(f"{rel} is on the node only, or under a link here (rsync decides)")
        ignore.append(rel)  # excluded here, so rsync leaves it on the node too
    if len(files) > MAX_CHANGED_FILES:
        raise NotQuick(f"{len(files)} changed files")
    return Patch(sorted(dirs), files, sorted(ignore))


def _in_own_tree(root: Path, rel: str) -> bool:
    """Whether the workdir itself holds ``rel`` (a file, directory or link), following no link.

    ``rel`` comes from a node. Looked up through a link in the workdir (``cfg -> ~/.ssh``), the
    answer would tell the node whether a file of this machine exists outside the workdir (the
    quick path or rsync is the node's to observe). So every component before the last must be a
    real directory of the workdir, and the last is checked with ``lstat``; anything else is
    False (rsync decides), whatever lies behind the link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        parts = rel.split("/")
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return False
            os.close(fd)
            fd = child
        try:
            os.lstat(parts[-1], dir_fd=fd)
        except OSError:
            return False
        return True
    finally:
        os.close(fd)


def patch_payload(local: LocalTree, patch: Patch) -> bytes:
    header = {"dirs": patch.dirs, "files": patch.files, "ignore": patch.ignore}
    parts = [json.dumps(header).encode() + b"\n"]
    for rel, _mode, size, _mtime in patch.files:
        data = (local.root / rel).read_bytes()
        if len(data) != size:
            raise NotQuick(f"{rel} changed while syncing")
        parts.append(data)
    return b"".join(parts)


def _ask(conn: NodeConnection, command: str, data: bytes = b"") -> str:
    result = conn.run_with_input(command, data, timeout=COMMAND_TIMEOUT)
    if not result.ok:
        raise NotQuick(f"exit {result.exit_code}: {result.stderr.strip()[-200:]}")
    if "bytes of output not kept" in result.stdout:
        raise NotQuick("listing too long for one answer")
    return result.stdout


def quick_sync(
    fleet: Fleet,
    hosts: list[Host],
    workdir: Path,
    job: str,
    lib_current: Collection[str],
    on_done: Callable[[str, SyncResult | BaseException], None] | None = None,
) -> dict[str, SyncResult]:
    """Nodes brought up to date over ``fleet``'s open connections; the others are left to rsync."""
    candidates = [h for h in hosts if h.name in lib_current]
    if not candidates:
        return {}
    try:
        local = LocalTree.read(workdir)
    except (NotQuick, OSError):
        return {}
    dest = '"$HOME"/' + shlex.quote(layout.workdir(job))
    script = f'python3 "$HOME/{TREE_SCRIPT}"'

    def listing(conn: NodeConnection) -> str:
        return _ask(conn, f"{script} list {dest} {local.digest}")

    answers = fleet.map(listing, hosts=candidates, deadline=COMMAND_TIMEOUT + 10)
    done: dict[str, SyncResult] = {}
    patches: dict[str, Patch] = {}
    for host in candidates:
        answer = answers.get(host.name)
        if isinstance(answer, str) and answer.strip() == "same":
            done[host.name] = SyncResult(host.name, 0, 0, via=VIA)
        elif isinstance(answer, str) and answer.startswith("listing\n"):
            try:
                patches[host.name] = plan_patch(local, parse_listing(answer))
            except NotQuick:
                continue
    if sum(p.size for p in patches.values()) > MAX_TOTAL_BYTES:
        patches = {}  # a big change crosses the uplink once per node here: rsync (the relay) instead
    payloads: dict[str, bytes] = {}  # nodes with the same change share one payload

    def send(conn: NodeConnection) -> SyncResult:
        patch = patches[conn.host.name]
        if not patch.files and not patch.dirs:
            return SyncResult(conn.host.name, 0, 0, via=VIA)
        key = json.dumps([patch.dirs, patch.files, patch.ignore])
        payload = payloads.get(key)
        if payload is None:
            payload = payloads[key] = patch_payload(local, patch)
        answer = _ask(conn, f"{script} apply {dest}", payload).strip()
        if answer != f"applied {local.digest}":  # the node's digest leaves out ``ignore``, as here
            raise NotQuick(f"node's listing after the patch differs ({answer[:80]!r})")
        return SyncResult(conn.host.name, len(patch.files), patch.size, via=VIA)

    if patches:
        sent = fleet.map(
            send, hosts=[h for h in candidates if h.name in patches], deadline=COMMAND_TIMEOUT + 10
        )
        done.update({n: r for n, r in sent.items() if isinstance(r, SyncResult)})
    if on_done is not None:
        for name, result in done.items():
            on_done(name, result)
    return done
