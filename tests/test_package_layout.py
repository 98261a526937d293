"""infra and launch meet only in fleetrun_contract: neither imports the other, the contract imports neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imported_top_levels(package: str) -> dict[str, set[str]]:
    """Top-level package names each module of ``package`` imports (lazy imports included)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("infra", {"launch"}),
        ("launch", {"infra"}),
        ("fleetrun_contract", {"launch", "infra", "pulumi", "fabric", "paramiko", "subprocess"}),
    ],
)
def test_no_import_crosses_the_contract(package: str, forbidden: set[str]) -> None:
    crossing = {module: names & forbidden for module, names in imported_top_levels(package).items()}
    assert {module: names for module, names in crossing.items() if names} == {}


def test_the_pulumi_entry_point_edits_no_sys_path() -> None:
    assert "sys" not in imported_top_levels("infra")["infra/__main__.py"]
