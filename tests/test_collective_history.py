"""``fab doctor --collective`` compared over time: the fleet's figure against the median of the last
comparable results, each node's against its own; the saved files parsed as untrusted; the
``--collective-history`` listing over planted result files, a broken one among them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from launch.rules.collective import (
    CollectiveReport,
    GroupResult,
    SavedResult,
    compare_history,
    saved_result,
)
from launch.run.collective import keep_and_compare, read_history
from tests.conftest import fab

T0 = 1_764_000_000.0
NODES = ("frknode1", "frknode2", "frknode3")


def result(
    t: float, fleet: float | None, per_node: dict[str, float] | None = None, **fields: object
) -> SavedResult:
    data = {"time": t, "backend": "gloo", "nodes": list(NODES), "fleet_gbps": fleet, **fields}
    data["per_node_gbps"] = per_node or {}
    return saved_result(json.dumps(data))


def plant(folder: Path, name: str, data: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# -- pure -------------------------------------------------------------------------------------------
def test_a_slow_node_against_its_own_median_is_flagged() -> None:
    history = [result(T0 + i, 0.2, {"frknode2": 0.2 + i * 0.01, "frknode1": 0.21}) for i in range(7)]
    now = result(T0 + 100, 0.19, {"frknode2": 0.12, "frknode1": 0.2})
    found = {f.node: f for f in compare_history(now, history)}
    slow = found["frknode2"]
    assert slow.level == "warn" and slow.runs == 5  # the last 5: 0.22 .. 0.26, median 0.24
    assert slow.median_gbps == pytest.approx(0.24)
    assert slow.message == "0.12 GB/s, 0.50x its median of the last 5 doctor runs (0.24 GB/s), under 0.7x"
    assert found["frknode1"].level == "ok" and found["fleet"].level == "ok" and found["fleet"].fleet


def test_the_fleet_figure_is_compared_only_with_comparable_fleets() -> None:
    gloo = [result(T0 + i, 1.0) for i in range(3)]
    nccl = [result(T0 + 10 + i, 0.01, backend="nccl") for i in range(3)]
    other_hosts = [result(T0 + 20 + i, 0.01, nodes=["x1", "x2", "frknode1"]) for i in range(3)]
    later = [result(T0 + 200, 0.01)]  # not before the current one
    now = result(T0 + 100, 0.5)
    (fleet,) = compare_history(now, gloo + nccl + other_hosts + later)
    assert (fleet.level, fleet.median_gbps, fleet.runs) == ("warn", 1.0, 3)
    overlapping = result(T0 + 30, 0.5, nodes=["frknode1", "frknode2", "frknode9"])
    (again,) = compare_history(overlapping, gloo)
    assert again.runs == 3, "most hosts in common: the same fleet"
    assert compare_history(now, gloo[:1]) == [], "one earlier figure is no history yet"
    assert compare_history(result(T0 + 100, None), gloo) == [], "no figure now: nothing to compare"


def test_saved_results_are_parsed_strictly_naming_the_field() -> None:
    good = result(T0, 1.5, {"frknode1": 0.5}, extra_field_of_a_newer_fleetrun=1)
    assert good.fleet_gbps == 1.5 and good.per_node_gbps == {"frknode1": 0.5}
    for bad, field in (
        ({"time": T0, "nodes": ["a"], "fleet_gbps": "1.5"}, "fleet_gbps"),
        ({"time": T0, "nodes": ["a"], "fleet_gbps": True}, "fleet_gbps"),
        ({"time": T0, "nodes": ["a"], "per_node_gbps": {"a": -1}}, "per_node_gbps"),
        ({"nodes": ["a"]}, "time"),
        ({"time": T0, "nodes": ["a" * 300]}, "nodes"),
    ):
        with pytest.raises(ValueError, match=f"field '{field}"):
            saved_result(json.dumps(bad))
    with pytest.raises(ValueError):
        saved_result("[1, 2]")


# -- files ------------------------------------------------------------------------------------------
def test_broken_foreign_and_oversized_files_are_skipped_with_a_note(tmp_path: Path) -> None:
    folder = tmp_path / "collective"
    plant(
        folder,
        "20251124-100000.json",
        {"time": T0, "backend": "gloo", "nodes": list(NODES), "fleet_gbps": 0.2},
    )
    plant(folder, "20251124-110000.json", "{not json")
    plant(folder, "20251124-120000.json", {"time": T0 + 1, "nodes": list(NODES), "fleet_gbps": "fast"})
    plant(folder, "20251124-130000.json", "x" * (1024**2 + 10))
    (folder / "20251124-140000.json").symlink_to(tmp_path / "elsewhere.json")
    plant(folder, "notes.txt", "not a result")
    history = read_history(folder)
    assert [r.fleet_gbps for _p, r in history.results] == [0.2]
    assert len(history.notes) == 4 and all(n.startswith("skipping 20251124-1") for n in history.notes)
    assert "field 'fleet_gbps'" in history.notes[1] and "over 1048576 bytes" in history.notes[2]
    assert all("\n" not in n for n in history.notes)
    assert read_history(tmp_path / "none").results == []
    limited = read_history(folder, limit=1)
    assert limited.older_left_out == 4 and limited.results == [] and len(limited.notes) == 1


def test_keep_and_compare_saves_then_compares_with_the_runs_before(tmp_path: Path) -> None:
    folder = tmp_path / "collective"
    for i in range(5):
        plant(
            folder,
            f"20251124-10000{i}.json",
            {
                "time": T0 + i,
                "backend": "gloo",
                "nodes": list(NODES),
                "fleet_gbps": 0.2,
                "per_node_gbps": {"frknode2": 0.2},
            },
        )
    plant(folder, "20251124-200000.json", "{broken")
    report = CollectiveReport(
        fleet=GroupResult(0.19, backend="gloo"), per_node={"frknode2": 0.09, "frknode1": 0.2}
    )
    path, found, notes = keep_and_compare(folder, report, list(NODES), 3.5, T0 + 100)
    assert path.parent == folder and json.loads(path.read_text())["per_node_gbps"]["frknode2"] == 0.09
    levels = {f.node: f.level for f in found}
    assert levels == {"fleet": "ok", "frknode2": "warn"}, "frknode1 has no history yet"
    assert notes == ["skipping 20251124-200000.json: not JSON (key must be a string at line 1 column 2)"]
    second, _found, _notes = keep_and_compare(folder, report, list(NODES), 3.5, T0 + 100)
    assert second != path and second.name.endswith("-2.json"), "the same second: not overwritten"


def test_collective_history_listing_over_planted_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch.cli import app

    runs = tmp_path / "runs"
    monkeypatch.setattr("launch.paths.runs_dir", lambda: runs)
    folder = runs / "collective"
    for i, (fleet, node2) in enumerate([(0.2, 0.2), (0.21, 0.21), (0.2, 0.19), (0.2, 0.2), (0.19, 0.09)]):
        plant(
            folder,
            f"20251124-10000{i}.json",
            {
                "time": T0 + 3600 * i,
                "backend": "gloo",
                "nodes": list(NODES),
                "fleet_gbps": fleet,
                "per_node_gbps": {"frknode2": node2, "frknode1": 0.2},
                "slow": ["frknode2"] if i == 4 else [],
            },
        )
    plant(folder, "20251124-999999.json", '{"time": "\\u001b[2Jsoon"}')
    buffer = io.StringIO()
    app.collective_history(Console(file=buffer, width=200, force_terminal=False))
    out = buffer.getvalue()
    assert "skipping 20251124-999999.json: field 'time'" in out and "\x1b" not in out
    assert "collective history: fleet" in out and "collective history: per node" in out
    node2 = next(line for line in out.splitlines() if line.startswith("│ frknode2"))
    assert "0.09" in node2 and "0.45x of 0.2" in node2, node2
    assert out.count("0.95x of 0.2") == 1, "the fleet's last figure against the 4 before it"


def test_fab_doctor_collective_history_contacts_no_node(tmp_path: Path) -> None:
    """The task as typed, with an inventory that does not exist: none is read, nothing contacted."""
    runs = tmp_path / "runs"
    saved = {"time": T0, "backend": "gloo", "nodes": ["a", "b"], "fleet_gbps": 0.25}
    plant(runs / "collective", "20251124-100000.json", saved)
    proc = fab(
        "doctor", "--collective-history", "--inventory", "no-such-inventory.yaml", home=tmp_path, runs=runs
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "collective history: fleet" in proc.stdout and "0.25" in proc.stdout


def test_doctor_collective_flags_a_node_under_its_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fab doctor --collective``'s own path, the measurement stood in for: the node slower than
    its history gets a WARN verdict worded as the doctor prints it; the fleet's figure is fine."""
    from launch.cli import app
    from launch.reports.doctor_view import verdict_line
    from launch.rules.preflight import Findings
    from launch.run import collective as test
    from tests.fakefleet import fake_hosts

    runs = tmp_path / "runs"
    monkeypatch.setattr("launch.paths.runs_dir", lambda: runs)
    hosts = fake_hosts(3)
    names = [h.name for h in hosts]
    for i in range(5):
        saved = {
            "time": T0 + i,
            "backend": "gloo",
            "nodes": names,
            "fleet_gbps": 0.2,
            "per_node_gbps": {"n2": 0.2},
        }
        plant(runs / "collective", f"20251124-10000{i}.json", saved)
    report = CollectiveReport(
        fleet=GroupResult(0.19, backend="gloo"), per_node={"n0": 0.2, "n1": 0.2, "n2": 0.09}, median_gbps=0.2
    )
    monkeypatch.setattr(test, "check", lambda *_a, **_k: (report, 2.0))
    findings = Findings()
    buffer = io.StringIO()
    app.collective_check(Console(file=buffer, width=200), None, hosts, findings, None, 29500)
    warned = [verdict_line(v).plain for v in findings.verdicts if v.level == "warn"]
    assert warned == [
        "n2           collective WARN   0.09 GB/s, 0.45x its median of the last 5 doctor runs (0.2 GB/s), under 0.7x"
    ]
    assert (
        "collective history: fleet: 0.19 GB/s, 0.95x its median of the last 5 doctor runs"
        in buffer.getvalue()
    )
    assert len(list((runs / "collective").glob("*.json"))) == 6


def test_the_doctors_last_line_counts_the_fleets_own_warnings_and_errors() -> None:
    """A Slurm partition's drained node is a warning above the table: the one-line outcome used to
    say "0 warning(s): the nodes are ready" under it."""
    from launch.reports.doctor_view import print_findings
    from launch.rules.preflight import Findings

    findings = Findings()
    findings.add("n1", "ssh", "ok", "reachable")
    console = Console(record=True, width=200)
    print_findings(console, findings, ["n1"], site=["ok", "warning", "ok"])
    assert "no errors, 1 warning(s): the nodes are ready" in console.export_text()
    console = Console(record=True, width=200)
    print_findings(console, findings, ["n1"], site=["error"])
    assert "1 error(s), 0 warning(s): a job on these nodes would fail or hang" in console.export_text()
