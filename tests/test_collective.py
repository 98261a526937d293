"""``fab doctor --collective``'s bisection (pure, with a measured stand-in) and its result parser."""

from __future__ import annotations

from collections.abc import Sequence

from launch.rules.collective import GroupResult, locate, parse_result, verdict_lines


def fake(slow: set[str], fast: float = 2.0, slowed: float = 0.05):  # type: ignore[no-untyped-def]
    """A group is as fast as its slowest member's link: any group holding a slow node is slow."""
    calls: list[tuple[str, ...]] = []

    def measure(groups: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], GroupResult]:
        calls.extend(groups)
        return {g: GroupResult(slowed if slow & set(g) else fast, backend="gloo") for g in groups}

    return measure, calls


def test_sixteen_nodes_one_slow_link_bisected_not_all_pairs() -> None:
    nodes = [f"n{i:02d}" for i in range(16)]
    measure, calls = fake({"n11"})
    report = locate(nodes, measure)
    assert report.slow == ["n11"]
    assert report.fleet is not None and report.fleet.busbw_gbps == 0.05
    assert len(report.measured) == 1 + 2 * 3 + 2, report.measured  # fleet, 3 halving rounds, 2 pairs
    assert len(report.measured) < 16 * 15 // 2
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert lines["n11"][0] == "error" and "a slow node or link" in lines["n11"][1]
    assert lines["fleet"] == ("ok", "all-reduce 0.050 GB/s over gloo")


def test_three_nodes_use_a_ring_of_pairs() -> None:
    measure, calls = fake({"c"})
    report = locate(["a", "b", "c"], measure)
    assert report.slow == ["c"] and report.per_node == {"a": 2.0, "b": 2.0, "c": 0.05}
    assert sorted(calls[1:]) == [("a", "b"), ("a", "c"), ("b", "c")]


def test_a_healthy_fleet_names_nobody() -> None:
    measure, calls = fake(set())
    report = locate([f"n{i}" for i in range(8)], measure)
    assert report.slow == [] and len(calls) == 3  # the fleet, then one round of halves: alike
    assert all(lv == "ok" for _, lv, _ in verdict_lines(report))


def test_result_line_is_parsed_as_untrusted() -> None:
    good = 'noise\nFLEETRUN_COLLECTIVE {"busbw_gbps": 1.5, "backend": "gloo", "ranks": [{"host": "h0", "gflops": 9.5}]}\n'
    result = parse_result(good, {"h0": "node0"})
    assert (result.busbw_gbps, result.backend, dict(result.gflops)) == (1.5, "gloo", {"node0": 9.5})
    for bad in (
        "",
        "FLEETRUN_COLLECTIVE {",
        'FLEETRUN_COLLECTIVE {"busbw_gbps": "fast"}',
        'FLEETRUN_COLLECTIVE {"busbw_gbps": -1}',
    ):
        assert parse_result(bad).busbw_gbps is None
