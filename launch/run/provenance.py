"""Where a run came from: the exact playbook text (its SHA-256) and the code's git commit.

Kept out of the records module, which the views read, because finding the commit starts
``git``: the pure views must not reach a subprocess.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file: records exactly which playbook text ran."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_commit_of(path: str | Path) -> str | None:
    """The commit checked out at ``path``, with ``-dirty`` if tracked files changed; None if no repo.

    Untracked files are ignored, as ``git describe --dirty`` does, so build outputs and
    virtual environments do not make every run look dirty.
    """

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30, check=False
        )

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.strip()
    return f"{commit}-dirty" if status.returncode == 0 and status.stdout.strip() else commit
