"""Each test file's own local fleet has a prefix letter and a subnet offset no other file uses.

``make test`` runs files on two pytest-xdist workers at once: two files sharing a prefix or a
subnet would build over each other's nodes (the fleet refuses, and both fail).
"""

from __future__ import annotations

import re
from collections import defaultdict

from tests.conftest import REPO, SUBNETS_PER_WORKER


def _uses(pattern: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for value in re.findall(pattern, path.read_text()):
            found[value].add(path.name)
    return found


def test_prefix_letters_are_unique_per_file() -> None:
    shared = {k: v for k, v in _uses(r'fleet_prefix\("([a-z0-9]+)"\)').items() if len(v) > 1}
    assert not shared, f"fleet prefix letters used by more than one test file: {shared}"


def test_subnet_offsets_are_unique_per_file_and_below_the_worker_stride() -> None:
    uses = _uses(r"fleet_subnet\((\d+)\)")
    assert uses, "no fleet_subnet use found: the pattern is stale"
    shared = {k: v for k, v in uses.items() if len(v) > 1}
    assert not shared, f"fleet subnet offsets used by more than one test file: {shared}"
    assert all(0 < int(k) < SUBNETS_PER_WORKER for k in uses), sorted(uses)
