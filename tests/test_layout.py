"""The layout tells the architecture, and these checks keep it telling the truth.

* The pure packages (``job``, ``planning``, ``rules``) and the views never import, directly or
  through other fleetrun modules, anything that talks to a network or starts a process:
  paramiko, Fabric/invoke, Pulumi, subprocess. A static walk of the import graph (imports
  inside functions count too), so it also catches lazy imports that a runtime check misses.
* A module of ``launch`` or ``infra`` over about 800 lines is a smell to explain (``LONG_MODULES``),
  not a rule to split by: modules are split by meaning (issue 25 dropped the 500-line limit, which
  had produced star re-exports and halves importing each other's private functions).
* No fleet-kind or cloud switch outside the fleet-kind modules: the kind and cloud names appear
  as string literals only in ``launch/fleets/`` (and ``infra/``, which is per-cloud by design).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LAUNCH = REPO / "launch"
PURE_PACKAGES = ("launch.job", "launch.planning", "launch.rules", "launch.reports")
FORBIDDEN = ("paramiko", "fabric", "invoke", "pulumi", "pulumi_aws", "pulumi_gcp", "subprocess")
MAX_LINES = 800
LONG_MODULES: dict[str, str] = {}
"""Modules allowed past ``MAX_LINES``, each with the reason it is one module."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in LAUNCH.rglob("*.py") if "nodelib" not in p.parts}


def imports_of(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports (absolute names), including imports inside functions."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def closure(start: str, graph: dict[str, set[str]], known: dict[str, Path]) -> dict[str, list[str]]:
    """Modules reachable from ``start``, each with one import chain that reaches it."""
    chains: dict[str, list[str]] = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in graph.get(current, ()):
            candidates = [target] if target in known else []
            if not candidates:
                top = target.split(".")[0]
                if top in FORBIDDEN and target not in chains:
                    chains[target] = [*chains[current], target]
                continue
            for module in candidates:
                if module not in chains:
                    chains[module] = [*chains[current], module]
                    todo.append(module)
    return chains


def test_pure_packages_import_no_io_library() -> None:
    known = modules()
    graph = {name: imports_of(path, name) for name, path in known.items()}
    problems = []
    for name in sorted(known):
        if not name.startswith(PURE_PACKAGES):
            continue
        for reached, chain in closure(name, graph, known).items():
            if reached.split(".")[0] in FORBIDDEN:
                problems.append(" -> ".join(chain))
    assert not problems, "pure modules reach I/O libraries:\n" + "\n".join(sorted(set(problems)))


def test_no_module_over_800_lines_unexplained() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for root in (LAUNCH, REPO / "infra")
        for p in root.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(REPO)) not in LONG_MODULES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_no_kind_or_cloud_switch_outside_the_fleet_kinds() -> None:
    names = {"local-fleet", "pulumi-stack", "lab", "aws", "gcp", "gcloud"}
    offenders = {}
    for path in LAUNCH.rglob("*.py"):
        rel = path.relative_to(LAUNCH)
        if rel.parts[0] == "fleets":
            continue
        hits = names & string_literals(path)
        if hits:
            offenders[str(rel)] = sorted(hits)
    assert not offenders, f"kind/cloud names used outside launch/fleets/: {offenders}"
