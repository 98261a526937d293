"""Re-sync over the open connections (``launch.transport.sync_quick``, ``nodelib/fleetrun_tree.py``).

Pure parts first: the plan sends exactly the changed files, keeps what rsync would keep (files this
machine ignores), and hands to rsync whatever it cannot prove (a file only on the node, a type
change); the node side refuses paths that leave the workdir. Then on the session's 3-node fleet:
after a first sync by rsync, a one-file change and an unchanged re-sync go over the open
connections and leave each node exactly as rsync would (``rsync --dry-run --itemize-changes``
finds nothing to do), while a node with a stray file is synced by rsync, which deletes it.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.job.inventory import Host, Inventory
from launch.nodelib import fleetrun_tree
from launch.paths import known_hosts_file
from launch.transport.ssh import Fleet
from launch.transport.sync import ALWAYS_EXCLUDED, SyncResult, rsync_argv, rsync_filters
from launch.transport.sync_quick import VIA, LocalTree, NotQuick, parse_listing, plan_patch
from launch.transport.sync_relay import sync_fleet
from tests.conftest import needs_root


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    for i in range(10):
        (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "run.log").write_text("ignored here\n")
    return root


def _node_view(local: LocalTree) -> dict[str, list[object]]:
    return {rel: json.loads(line) for rel, line in local.entries.items()}


def test_excluded_names_match_the_syncs_own() -> None:
    names = {p for p in ALWAYS_EXCLUDED if not p.startswith("*")}
    assert names == set(fleetrun_tree.EXCLUDED_NAMES)
    assert {p[1:] for p in ALWAYS_EXCLUDED if p.startswith("*")} == set(fleetrun_tree.EXCLUDED_SUFFIXES)


def test_local_listing_is_rsyncs_reading_of_the_filters(tmp_path: Path) -> None:
    local = LocalTree.read(_tree(tmp_path / "code"))
    assert set(local.entries) == {".gitignore", "pkg", *(f"pkg/m{i}.py" for i in range(10))}


def test_plan_sends_only_the_changed_file_and_keeps_what_rsync_keeps(tmp_path: Path) -> None:
    code = _tree(tmp_path / "code")
    node = _node_view(LocalTree.read(code))
    node["run.log"] = ["f", "run.log", 0o644, 5, 1]  # ignored here: rsync leaves it on the node
    (code / "pkg" / "m3.py").write_text("VALUE = 'changed'\n")
    (code / "pkg" / "new").mkdir()
    (code / "pkg" / "new" / "n.py").write_text("N = 1\n")
    patch = plan_patch(LocalTree.read(code), node)
    assert [f[0] for f in patch.files] == ["pkg/m3.py", "pkg/new/n.py"]
    assert [d[0] for d in patch.dirs] == ["pkg/new"]
    assert patch.ignore == ["run.log"]
    assert plan_patch(LocalTree.read(code), _node_view(LocalTree.read(code))).files == []


@pytest.mark.parametrize(
    "extra",
    [
        ["f", "out.txt", 0o644, 3, 1],  # only on the node: rsync --delete decides
        ["d", "pkg/m1.py", 0o755, 0, 0],  # a directory where this machine has a file
    ],
)
def test_plan_leaves_to_rsync_what_it_cannot_prove(tmp_path: Path, extra: list[object]) -> None:
    code = _tree(tmp_path / "code")
    node = _node_view(LocalTree.read(code))
    node[str(extra[1])] = extra
    with pytest.raises(NotQuick):
        plan_patch(LocalTree.read(code), node)


@pytest.mark.parametrize("behind", ["present", "absent", "present/deeper"])
def test_a_node_learns_nothing_of_the_files_behind_a_workdir_link(tmp_path: Path, behind: str) -> None:
    """Issue 24, item 12: a node lists ``cfg/<name>`` where ``cfg`` is a link out of the workdir
    here; whether this machine has that file must not change the answer."""
    outside = tmp_path / "laptop-secrets"
    (outside / "present").mkdir(parents=True)
    (outside / "present" / "deeper").write_text("secret\n")
    code = _tree(tmp_path / "code")
    (code / "cfg").symlink_to(outside)
    (code / ".gitignore").write_text("*.log\ncfg\n")  # the link itself is not sent
    local = LocalTree.read(code)
    node = _node_view(local)
    node[f"cfg/{behind}"] = ["f", f"cfg/{behind}", 0o644, 1, 1]
    with pytest.raises(NotQuick, match="under a link"):
        plan_patch(local, node)
    node = _node_view(local)
    node["cfg"] = ["l", "cfg", 0o777, 0, 0]  # the link's own name is the workdir's: kept, as rsync keeps it
    assert plan_patch(local, node).ignore == ["cfg"]


@pytest.mark.parametrize(
    "rel", ["../escape.py", "/etc/passwd", "a/../../x", "__pycache__/x.pyc", "link/x.py"]
)
def test_node_apply_refuses_paths_outside_the_workdir(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "wd"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    header = json.dumps({"dirs": [], "files": [[rel, 0o644, 2, 1]], "ignore": []})
    with pytest.raises(ValueError, match="refused path"):
        fleetrun_tree.apply(str(root), io.BytesIO(header.encode() + b"\nhi"))
    assert not (tmp_path / "x.py").exists() and not (tmp_path / "escape.py").exists()


@pytest.mark.parametrize("rel", ["../../etc/passwd", "/etc/passwd", "a/../../x", "a//b", "./a"])
def test_a_node_listing_naming_a_path_outside_the_workdir_is_not_used(rel: str) -> None:
    """The node's answer is untrusted: its paths are looked up under this machine's workdir."""
    line = json.dumps(["f", rel, 420, 1, 0])
    with pytest.raises(NotQuick, match="outside the workdir"):
        parse_listing(f"listing\n{line}\n")
    assert parse_listing(f"listing\n{json.dumps(['f', 'a/b.py', 420, 1, 0])}\n")["a/b.py"][0] == "f"


def test_node_apply_writes_content_mode_and_mtime(tmp_path: Path) -> None:
    root = tmp_path / "wd"
    header = {"dirs": [["sub", 0o750]], "files": [["sub/a.py", 0o640, 3, 1_700_000_000]], "ignore": []}
    answer = fleetrun_tree.apply(str(root), io.BytesIO(json.dumps(header).encode() + b"\nabc"))
    assert (root / "sub" / "a.py").read_bytes() == b"abc"
    assert (root / "sub" / "a.py").stat().st_mode & 0o777 == 0o640
    assert int((root / "sub" / "a.py").stat().st_mtime) == 1_700_000_000
    assert answer == fleetrun_tree.digest(fleetrun_tree.listing(str(root)))


# -- on the session's 3-node fleet ----------------------------------------------------------------
def _home(host: Host) -> Path:
    return Path("/home") / host.user


def _known_hosts(inventory: Inventory) -> Path:
    return inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))


def _rsync_would_change(host: Host, workdir: Path, job: str, kh: Path) -> list[str]:
    """What a plain rsync of the workdir would still do on ``host`` (empty: the copies are equal)."""
    argv = rsync_argv(workdir, host, f".fleetrun/work/{job}", kh, rsync_filters(workdir))
    argv[1:2] = ["-a", "--dry-run", "--itemize-changes"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [
        line for line in out.splitlines() if line[:2] in (">f", "cd", "*d") or line.startswith("*deleting")
    ]


@needs_root()
def test_small_changes_go_over_open_connections_and_match_rsync(fleet: LocalFleet, tmp_path: Path) -> None:
    inventory = fleet.inventory()
    hosts = inventory.hosts
    code = _tree(tmp_path / "code")
    kh = _known_hosts(inventory)
    job = "t-quick"
    names = [h.name for h in hosts]
    with Fleet(hosts, kh) as conns:
        first = sync_fleet(conns, code, job, kh, relay_above=100)
        assert all(isinstance(r, SyncResult) and r.via == "laptop" for r in first.values()), first
        (code / "pkg" / "m3.py").write_text("VALUE = 'changed'\n")
        stray = _home(hosts[1]) / ".fleetrun" / "work" / job / "stray.txt"
        stray.write_text("made on the node\n")
        kept = _home(hosts[2]) / ".fleetrun" / "work" / job / "run.log"
        kept.write_text("ignored on this machine, kept by rsync too\n")
        second = sync_fleet(conns, code, job, kh, relay_above=100, lib_current=names)
        again = sync_fleet(conns, code, job, kh, relay_above=100, lib_current=names)
    via = {n: r.via for n, r in second.items() if isinstance(r, SyncResult)}
    assert via == {hosts[0].name: VIA, hosts[1].name: "laptop", hosts[2].name: VIA}, second
    assert [second[h.name].files_sent for h in (hosts[0], hosts[2])] == [1, 1]  # type: ignore[union-attr]
    assert not stray.exists(), "the node with a stray file went through rsync --delete"
    assert kept.exists(), "a file ignored here stays, as rsync leaves it"
    assert all(isinstance(r, SyncResult) and r.via == VIA and r.files_sent == 0 for r in again.values())
    for host in hosts:
        copy = _home(host) / ".fleetrun" / "work" / job / "pkg" / "m3.py"
        assert copy.read_text() == "VALUE = 'changed'\n"
        assert _rsync_would_change(host, code, job, kh) == []
