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


NODELIB_MODULES = sorted(p.stem for p in (REPO / "launch" / "nodelib").glob("fleetrun_*.py"))


@pytest.mark.parametrize("module", NODELIB_MODULES)
def test_a_node_library_module_imported_by_its_package_name_loads_each_file_once(module: str) -> None:
    """``import launch.nodelib.fleetrun_checkpoint`` raised ImportError (it loaded the bare
    ``fleetrun_checkpoint_torch``, which loaded a second, bare ``fleetrun_checkpoint``), and the
    guard loaded a second ``fleetrun_protocol`` whose ``ProtocolError`` an ``except`` missed.
    In a fresh interpreter: the package import works, loads no bare copy, leaves sys.path alone."""
    import subprocess
    import sys

    code = f"""
import sys
before = list(sys.path)
import launch.nodelib.{module} as m
import launch.nodelib.fleetrun_protocol as protocol
bare = sorted(name for name in sys.modules if name.startswith("fleetrun_"))
assert not bare, f"bare copies of the node library loaded: {{bare}}"
assert sys.path == before, "importing the package edited sys.path"
for value in vars(m).values():
    if getattr(value, "__name__", "") == "fleetrun_protocol" or value is protocol:
        assert value is protocol
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_guard_and_the_laptop_share_one_protocol_error() -> None:
    import subprocess
    import sys

    code = """
import sys
import launch.nodelib.fleetrun_protocol as a, launch.nodelib.fleetrun_guard as g
assert g.protocol.ProtocolError is a.ProtocolError
assert "fleetrun_protocol" not in sys.modules
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
