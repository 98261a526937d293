"""Where ``fab`` lays out what it sends with rsync: under ``FLEETRUN_HOME``, never in the system's
temporary folder.

A ``fab`` process ended by a signal runs no ``atexit`` handler and no ``finally``, so a staging
folder in ``$TMPDIR`` outlived every interrupted run (11 ``fleetrun-nodelib-*`` folders after one
``make demo`` and one ``make test``). Here:

* the node library is staged once per content digest (``FLEETRUN_HOME/nodelib/<digest>``), built
  in a private folder and renamed into place (``rename`` is atomic, so two ``fab`` processes at
  once both end with the one complete copy), then reused by every later process: nothing to clean;
* the per-sync folders of symlinks (``scratch_dir``) live in ``FLEETRUN_HOME/staging``, named with
  their process id; each new one first removes those of processes no longer alive, so what a
  killed process left is gone by the next sync.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from launch.nodelib.fleetrun_probe import library_digest
from launch.paths import fleetrun_home

NODELIB_DIR = "nodelib"
STAGING_DIR = "staging"
VERSION_FILE = "VERSION"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(name: str) -> int | None:
    """The process id in a scratch folder's name (``<prefix><pid>-<random>``), or None."""
    head = name.rsplit("-", 1)[0]
    digits = head[len(head.rstrip("0123456789")) :]
    return int(digits) if digits else None


def sweep_dead(root: Path) -> None:
    """Remove the folders under ``root`` whose owning process is gone (a signal ended it)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        pid = _owner(entry.name)
        if (
            pid is not None
            and pid != os.getpid()
            and not _alive(pid)
            and entry.is_dir()
            and not entry.is_symlink()
        ):
            shutil.rmtree(entry, ignore_errors=True)


def scratch_dir(prefix: str) -> Path:
    """A new private folder ``FLEETRUN_HOME/staging/<prefix><pid>-<random>``; the caller removes it
    when done, and a later call removes it if this process dies first."""
    root = fleetrun_home() / STAGING_DIR
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    sweep_dead(root)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))


def stage_library(files: Iterable[Path]) -> tuple[Path, str]:
    """``files`` staged as a node library with a ``VERSION`` file: ``FLEETRUN_HOME/nodelib/<digest>``
    (the digest is ``fleetrun_probe.library_digest`` of the files, what a node's probe reports),
    and that digest. Built in a scratch folder and renamed into place; an existing complete copy
    (its ``VERSION`` written last, inside the scratch folder) is reused as it is."""
    root = fleetrun_home() / NODELIB_DIR
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    build = scratch_dir("nodelib-")
    try:
        for path in files:
            shutil.copy2(path, build / path.name)
        digest = library_digest(str(build))
        if not digest:
            raise OSError(f"cannot stage the node library in {build}")
        (build / VERSION_FILE).write_text(digest + "\n")
        target = root / digest
        if target.is_dir() and library_digest(str(target)) != digest:
            # changed since it was staged (by hand, a bad disk): moved aside and removed, then replaced
            aside = scratch_dir("nodelib-old-")
            with contextlib.suppress(OSError):
                os.rename(target, aside / digest)
            shutil.rmtree(aside, ignore_errors=True)
        if not (target / VERSION_FILE).is_file():
            try:
                os.rename(build, target)
            except OSError:
                if not (target / VERSION_FILE).is_file():  # not another process's complete copy
                    raise
        return target, digest
    finally:
        shutil.rmtree(build, ignore_errors=True)
