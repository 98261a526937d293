"""mypy over infra/ with the Pulumi SDK's types: what mocks cannot catch, a type checker can.

Mocks run the program but ignore wrong scalar types and misspelled keys of dict-style inputs;
the providers' typed ``*Args`` classes and mypy catch those (../shared/design/pulumi-notes.md).
Cold, this takes ~2 minutes and ~4 GB (pulumi-aws and pulumi-gcp are large); with the cache in
.mypy_cache it takes seconds. Deselect with ``-m "not typecheck"``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.typecheck
def test_infra_type_checks() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "infra",
            "launch/fleets/cloud_stack.py",
            "fleetrun_contract",
            "--cache-dir",
            str(REPO / ".mypy_cache"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
