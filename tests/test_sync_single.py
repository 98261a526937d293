"""Direct sync is one rsync per node (workdir and node library together), on the 3-node local fleet.

One rsync rooted at ``~/.fleetrun`` must still mean what two did: the workdir's filters (anchored
``.git/info/exclude`` patterns anchored at the workdir, ``.gitignore``), ``--delete`` inside the
job's workdir only (another job's workdir stays), links inside the workdir kept as links, and the
library delivered whatever the user's patterns say.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launch.fleets.local import LocalFleet
from launch.paths import known_hosts_file
from launch.transport import sync as sync_module
from launch.transport.sync import SyncResult, nodelib_source, single_transfer_filters, sync_all
from tests.conftest import needs_root


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 64)
    (root / "pkg" / "data").mkdir()
    (root / "pkg" / "data" / "small.txt").write_text("kept: /data is anchored at the workdir\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "run.log").write_text("ignored\n")
    (root / "latest").symlink_to("pkg")
    info = root / ".git" / "info"
    info.mkdir(parents=True)
    # anchored (must stay anchored at the workdir), and a pattern that would match the library's files
    (info / "exclude").write_text("/data\nVERSION\n")
    return root


def test_filters_anchor_user_patterns_at_the_workdir_and_protect_the_library(tmp_path: Path) -> None:
    rules = single_transfer_filters(_tree(tmp_path / "w"), "j1")
    assert rules[:3] == ["--include=/lib/***", "--include=/work/", "--include=/work/j1/"]
    assert "--exclude=/work/j1/data" in rules and "--exclude=/data" not in rules
    assert "--exclude=VERSION" in rules, "unanchored patterns are passed through"


@pytest.fixture
def jobs_removed_after(fleet: LocalFleet) -> Iterator[tuple[str, ...]]:
    """The job folders the test makes on the session fleet's nodes, removed after it: the fleet
    is shared by the session's other tests."""
    jobs = ("t-single", "other-job")
    yield jobs
    for host in fleet.inventory().hosts:
        for job in jobs:
            shutil.rmtree(Path("/home") / host.user / ".fleetrun" / "work" / job, ignore_errors=True)


@needs_root()
def test_one_rsync_per_node_delivers_workdir_and_library(
    fleet: LocalFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs_removed_after: tuple[str, ...]
) -> None:
    inventory = fleet.inventory()
    kh = inventory.write_known_hosts(known_hosts_file(inventory.fingerprint()))
    homes = [Path("/home") / h.user for h in inventory.hosts]
    for home, host in zip(homes, inventory.hosts, strict=True):
        other = home / ".fleetrun" / "work" / "other-job"
        stale = home / ".fleetrun" / "work" / "t-single" / "stale.py"
        for path in (other / "keep.txt", stale):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
        subprocess.run(["chown", "-R", f"{host.user}:{host.user}", str(home / ".fleetrun")], check=True)
    calls: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(argv: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(argv, list) and argv and argv[0] == "rsync":
            calls.append(argv)
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(sync_module.subprocess, "run", counting_run)
    results = sync_all(inventory.hosts, _tree(tmp_path / "code"), "t-single", kh)
    assert all(isinstance(r, SyncResult) for r in results.values()), results
    assert len(calls) == len(inventory.hosts), "one rsync per node, not one per directory"
    for home in homes:
        work = home / ".fleetrun" / "work" / "t-single"
        assert (work / "pkg" / "model.py").read_text() == "X = 1\n"
        assert (work / "pkg" / "data" / "small.txt").exists(), "an anchored pattern must not match deeper"
        assert not (work / "data").exists(), "/data in .git/info/exclude is the workdir's /data"
        assert not (work / "run.log").exists(), ".gitignore holds"
        assert not (work / ".git").exists()
        assert (work / "latest").is_symlink() and str((work / "latest").readlink()) == "pkg"
        assert not (work / "stale.py").exists(), "--delete inside the job's workdir"
        assert (home / ".fleetrun" / "work" / "other-job" / "keep.txt").exists(), "other jobs stay"
        assert (home / ".fleetrun" / "lib" / "VERSION").read_text().strip() == nodelib_source()[1]
        assert (home / ".fleetrun" / "lib" / "fleetrun_node.py").is_file()
    # an unchanged re-sync without the library sends nothing and still one rsync per node
    calls.clear()
    again = sync_all(
        inventory.hosts, tmp_path / "code", "t-single", kh, lib_current={h.name for h in inventory.hosts}
    )
    assert len(calls) == len(inventory.hosts)
    assert all(isinstance(r, SyncResult) and r.files_sent == 0 for r in again.values()), again
    assert not any(a.endswith("/./lib/") for argv in calls for a in argv), "a current library is not sent"


def test_a_nodes_library_is_current_by_its_content_not_its_version_file(tmp_path: Path) -> None:
    """Issue 24, item 8: the probe hashes the node's library as the laptop hashes the one it
    ships; a changed file with the laptop's VERSION beside it is not current (the sync replaces it)."""
    from launch.nodelib.fleetrun_probe import library_digest
    from launch.transport.sync import lib_is_current

    staging, version = nodelib_source()
    node_lib = tmp_path / "lib"
    shutil.copytree(staging, node_lib)
    assert library_digest(str(node_lib)) == version and lib_is_current(library_digest(str(node_lib)))
    (node_lib / "__pycache__").mkdir()  # Python's cache on the node is not part of it
    assert lib_is_current(library_digest(str(node_lib)))
    guard = node_lib / "fleetrun_guard.py"
    guard.write_text(guard.read_text() + "\nimport os  # tampered\n")
    assert (node_lib / "VERSION").read_text().strip() == version, "the node's own claim is unchanged"
    assert not lib_is_current(library_digest(str(node_lib)))
    guard.unlink()
    guard.symlink_to(staging / "fleetrun_guard.py")  # same bytes, through a link: not a plain library
    assert library_digest(str(node_lib)) == "" and not lib_is_current("")
    assert library_digest(str(tmp_path / "missing")) == ""


def test_a_library_sync_leaves_no_bytecode_of_the_library_it_replaced(tmp_path: Path) -> None:
    """The node's ``lib/__pycache__`` is outside the library's digest; it must not outlive a
    change of the library, or the node could import an earlier library's bytecode (a ``.pyc`` is
    trusted by its source's mtime and size). The library's include rule comes before the
    ``__pycache__`` exclusion, so nothing protects it there from ``--delete``; the workdir's own
    cache stays (the user's). Plain local rsync with the sync's exact filters and options."""
    workdir = _tree(tmp_path / "code")
    stage = tmp_path / "stage"
    (stage / "work").mkdir(parents=True)
    (stage / "work" / "j1").symlink_to(workdir, target_is_directory=True)
    (stage / "lib").symlink_to(nodelib_source()[0], target_is_directory=True)
    node = tmp_path / "node" / ".fleetrun"
    for cache in (node / "lib" / "__pycache__", node / "work" / "j1" / "__pycache__"):
        cache.mkdir(parents=True)
        (cache / "fleetrun_node.cpython-311.pyc").write_bytes(b"an earlier library's bytecode")
    argv = ["rsync", "-az", "--relative", "--delete", "--mkpath", *single_transfer_filters(workdir, "j1")]
    subprocess.run([*argv, f"{stage}/./work/j1/", f"{stage}/./lib/", f"{node}/"], check=True)
    assert (node / "lib" / "fleetrun_node.py").is_file()
    assert not (node / "lib" / "__pycache__").exists(), (
        "the library's cache goes with the library it came from"
    )
    assert (node / "work" / "j1" / "__pycache__").is_dir(), "the workdir's excluded files stay"
