"""Writing a file the user named, readable by them only, without trusting the folder it lies in.

``fab ssh-config --output`` and ``fab up --outputs`` write files a user points anywhere (often
``~/.ssh``, sometimes a shared folder). A fixed temporary name beside the target (``x.tmp``) is a
name another user of that folder can create first, as a symlink to a file of the writer's that
the write would then clobber, or as a file they keep open and read. Here the temporary file gets
an unpredictable name from ``mkstemp`` (``O_CREAT|O_EXCL``, mode 0600, so it never follows a
symlink and never opens a file someone else made), in the target's own folder (so the final
``rename`` is atomic and never crosses a file system), and is removed on every failure: nothing
is left behind. A target that names a folder, or a folder that does not exist, is one clear line.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from launch.errors import FleetrunError


def _shown(path: Path) -> str:
    """The path for a one-line message: control characters escaped, bounded."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path)[:400])


def write_private_file(path: Path, data: bytes, what: str) -> Path:
    """Write ``data`` to ``path`` (mode 0600) atomically; ``what`` names the option in errors.

    Raises ``FleetrunError`` (exit 2, one line) when the folder is missing or not a folder, or
    ``path`` is a folder; the rename replaces a symlink at ``path`` itself, never its target.
    """
    folder = path.parent
    shown = _shown(path)
    if not folder.is_dir():
        where = "does not exist" if not folder.exists() else "is not a folder"
        raise FleetrunError(f"{what} {shown}: its folder {where}")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise FleetrunError(f"{what} {shown}: is a folder; name a file in it")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise FleetrunError(f"{what} {shown}: cannot write in its folder: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise FleetrunError(f"{what} {shown}: cannot write it: {exc.strerror or exc}") from None
        raise
    return path
