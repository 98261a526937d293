"""Writing a known_hosts file of pinned keys: fresh each time, never appended to, 0600 from the start.

Apart from ``launch.job.inventory`` (whose ``Inventory.write_known_hosts`` uses it) so ``fab
exec``'s fast path, which reads fleetrun's own fleet state without the inventory models, writes
its file the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def write_known_hosts_lines(path: Path, lines: Iterable[str]) -> Path:
    """Write exactly ``lines`` (each once, in order) to ``path``: a key that is no longer pinned
    is no longer trusted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    unique = dict.fromkeys(lines)
    # a temporary name of its own (0600 from the start): two runs of one inventory started at
    # once write the same file, and a shared ``.tmp`` was renamed away under the other one
    # (``tempfile`` is not imported for it: a tenth of ``fab exec``'s light path's imports)
    tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write("".join(line + "\n" for line in unique))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
