"""``fab doctor --collective``: the fixed schedule of one launch (every node in two pairs, pairs
disjoint in a round), naming a slow node or a slow link from rank 0's result line (parsed as
untrusted input), and the node script itself under a real torchrun with gloo on this machine."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from launch.nodelib.fleetrun_collective import MARK, remeasure_plan
from launch.rules.collective import (
    MAX_LINE,
    SAVED_VERSION,
    confirm_rounds,
    locate,
    parse_result,
    ring_rounds,
    saved_result,
    schedule,
    suspected,
    verdict_lines,
)

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PYTHON = Path("/opt/fleetrun/image/venv/bin/python")


def line(
    nodes: Sequence[str],
    bw: Callable[[tuple[str, ...]], float],
    rounds: int | None = None,
    again: Callable[[tuple[str, ...]], float | None] | None = None,
    **extra: object,
) -> str:
    """Rank 0's result line as the node script writes it, a group's figure from ``bw``; the
    re-measure planned as rank 0 plans it (``suspected``/``confirm_rounds`` over the ring's
    figures), a re-measured pair's figure from ``again`` (``bw`` when not given)."""
    schedule_ = ring_rounds(len(nodes))[:rounds]
    done = [
        [{"ranks": list(g), "seconds": 0.1, "busbw_gbps": bw(tuple(nodes[r] for r in g))} for g in groups]
        for groups in schedule_
    ]
    pairs = {tuple(f["ranks"]): f["busbw_gbps"] for groups in done[1:] for f in groups}  # type: ignore[misc]
    ranks = list(range(len(nodes)))
    suspects = suspected(ranks, pairs)  # type: ignore[arg-type]
    remeasure = again or bw
    confirm = [
        [{"ranks": [a, b], "seconds": 0.1, "busbw_gbps": remeasure((nodes[a], nodes[b]))} for a, b in groups]
        for groups in remeasure_plan(ranks, pairs)  # type: ignore[arg-type]
    ]
    data = {
        "version": 3,
        "backend": "gloo",
        "world": len(nodes),
        "bytes": 8,
        "reps": 1,
        "ranks": [{"host": f"h{i}", "gflops": 10.0 + i} for i in range(len(nodes))],
        "rounds": done,
        "suspects": suspects,
        "confirm": confirm,
        **extra,
    }
    return "torch noise\n" + MARK + json.dumps(data) + "\nmore noise\n"


def slowed(slow: set[str] = frozenset(), links: set[frozenset[str]] = frozenset()):  # type: ignore[no-untyped-def,assignment]
    """A group is as fast as its slowest member or link."""

    def bw(group: tuple[str, ...]) -> float:
        if slow & set(group) or any(link <= set(group) for link in links):
            return 0.002
        return 0.2

    return bw


NODES16 = [f"n{i:02d}" for i in range(16)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 16, 17])
def test_schedule_every_node_in_two_pairs_disjoint_in_each_round(n: int) -> None:
    rounds = ring_rounds(n)
    assert rounds[0] == [tuple(range(n))], "round 0: the whole world"
    if n == 2:
        assert len(rounds) == 1, "two nodes: the world is the pair"
        return
    assert len(rounds) == (3 if n % 2 == 0 else 4)
    pairs = [g for groups in rounds[1:] for g in groups]
    assert all(len(g) == 2 for g in pairs) and len(pairs) == n, "N pairs, not N(N-1)/2"
    assert len({frozenset(g) for g in pairs}) == n, "no pair twice"
    for node in range(n):
        assert sum(node in g for g in pairs) == 2, f"node {node} in two pairs"
    for groups in rounds[1:]:
        members = [r for g in groups for r in g]
        assert len(members) == len(set(members)), f"groups of a round overlap: {groups}"
    assert schedule([f"x{i}" for i in range(n)])[1][0] == ("x0", "x1")


def test_sixteen_nodes_one_slow_node_named_from_one_launch() -> None:
    measured = parse_result(line(NODES16, slowed({"n11"})), NODES16)
    report = locate(NODES16, measured)
    assert report.slow == ["n11"] and report.slow_links == []
    assert report.rounds == 3 and len(report.measured) == 1 + 16 + 1, "the ring, then one re-measure"
    assert report.suspected == ["n11"] and report.confirm["n11"][0] == "n00", "a fresh, fast partner"
    assert report.per_node["n11"] == 0.002 and report.per_node["n10"] == 0.2
    assert report.median_gbps == 0.2
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert lines["n11"] == (
        "error",
        "0.002 GB/s in its pair test, under 0.5x the typical 0.200 GB/s, confirmed with n00 "
        "(0.002 GB/s): a slow node or link",
    )
    assert lines["fleet"] == (
        "ok",
        "all-reduce 0.002 GB/s over gloo, matmul 10.0-25.0 GFLOP/s per node; "
        "1 suspected in the ring of pairs, 1 confirmed by a re-measure",
    )
    assert [n for n, (lv, _m) in lines.items() if lv != "ok"] == ["n11"]


def test_a_slow_pair_between_two_fine_nodes_is_a_slow_link() -> None:
    measured = parse_result(line(NODES16, slowed(links={frozenset({"n04", "n05"})})), NODES16)
    report = locate(NODES16, measured)
    assert report.slow == [] and report.slow_links == [("n04", "n05")]
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert {n for n, (lv, _m) in lines.items() if lv == "error"} == {"n04", "n05"}
    assert "0.002 GB/s in its pair test with n05" in lines["n04"][1]
    assert lines["n05"][1].endswith("a slow link between n04 and n05")
    assert "under 0.25x the typical 0.200 GB/s" in lines["n04"][1]
    saved = saved_result(json.dumps({"time": 1.0, "nodes": NODES16, **report.to_json()}))
    assert saved.slow_links == (("n04", "n05"),) and len(saved.per_node_gbps) == 16


def test_a_node_whose_partners_are_slow_elsewhere_too_is_not_named() -> None:
    """Seen at load 18 on a healthy 16-node fleet (these figures): n01's and n02's best pairs
    0.176 against a median of 0.36 -- but n02 was as slow with n03 (0.116), n01 with n00, and
    n00 and n03 were not fast elsewhere either (0.28, 0.234): noise, nobody to name. A truly
    slow node beside it (n11, partners fine elsewhere) is still named, and so are two slow nodes
    side by side."""
    figures = {
        ("n15", "n00"): 0.28,
        ("n00", "n01"): 0.107,
        ("n01", "n02"): 0.176,
        ("n02", "n03"): 0.116,
        ("n03", "n04"): 0.234,
    }
    noisy = parse_result(line(NODES16, lambda g: figures.get(g, 0.36)), NODES16)
    assert locate(NODES16, noisy).slow == []
    both = parse_result(line(NODES16, lambda g: 0.002 if {"n11"} & set(g) else figures.get(g, 0.36)), NODES16)
    assert locate(NODES16, both).slow == ["n11"]
    pair = parse_result(line(NODES16, slowed({"n05", "n06"})), NODES16)
    assert locate(NODES16, pair).slow == ["n05", "n06"]


def test_a_noisy_pair_is_no_link() -> None:
    """One pair at 0.3x the median (what CPU contention did on a loaded 2-core fleet): a link
    rests on one figure, so it must be under 0.25x to be named."""
    noisy = parse_result(line(NODES16, lambda g: 0.06 if g == ("n07", "n08") else 0.2), NODES16)
    report = locate(NODES16, noisy)
    assert report.slow == [] and report.slow_links == []
    assert all(lv == "ok" for _n, lv, _m in verdict_lines(report))


@pytest.mark.parametrize("n", [3, 5])
def test_odd_fleets_slow_node_and_healthy(n: int) -> None:
    nodes = [f"m{i}" for i in range(n)]
    last = nodes[-1]  # in the extra round's pair with node 0
    report = locate(nodes, parse_result(line(nodes, slowed({last})), nodes))
    assert report.slow == [last] and report.rounds == 4
    healthy = locate(nodes, parse_result(line(nodes, slowed()), nodes))
    assert healthy.slow == [] and healthy.slow_links == []
    assert all(lv == "ok" for _n, lv, _m in verdict_lines(healthy))


def test_two_nodes_names_nobody() -> None:
    nodes = ["a", "b"]
    report = locate(nodes, parse_result(line(nodes, slowed({"b"})), nodes))
    assert report.per_node == {"a": 0.002, "b": 0.002} and report.slow == []


def test_healthy_sixteen_names_nobody_and_saves_a_readable_version_3() -> None:
    report = locate(NODES16, parse_result(line(NODES16, slowed()), NODES16))
    assert report.slow == [] and report.slow_links == [] and len(report.per_node) == 16
    assert report.suspected == [] and len(report.measured) == 17, "nothing suspected, nothing re-measured"
    saved = saved_result(json.dumps({"time": 1.0, "nodes": NODES16, **report.to_json()}))
    assert saved.version == SAVED_VERSION == 3 and saved.per_node_gbps["n03"] == 0.2
    old = saved_result(json.dumps({"time": 1.0, "nodes": ["a"], "fleet_gbps": 0.1, "groups": []}))
    assert old.version == 1 and old.slow_links == () and old.suspected == (), "a result from before reads"
    v2 = {"version": 2, "time": 1.0, "nodes": ["a", "b", "c"], "slow": ["c"], "slow_links": [["a", "b"]]}
    two = saved_result(json.dumps({**v2, "per_node_gbps": {"a": 0.2, "b": 0.2, "c": 0.01}, "rounds": 3}))
    assert two.version == 2 and two.slow == ("c",) and two.suspected == ()


def test_missing_results() -> None:
    cut = parse_result(line(NODES16, slowed(), rounds=2), NODES16)  # ended after round 1
    report = locate(NODES16, cut)
    assert report.fleet is not None and report.fleet.busbw_gbps == 0.2
    errors = [r.error for _g, r in report.measured if r.busbw_gbps is None]
    assert len(errors) == 8 and all("not measured" in e for e in errors)
    assert report.slow == [] and len(report.per_node) == 16
    nothing = parse_result("Traceback (most recent call last):\n  ...\n", NODES16)
    report = locate(NODES16, nothing.with_error("no result line from rank 0 (exit 1: boom)"))
    assert report.per_node == {} and report.slow == []
    ((node, lv, msg),) = verdict_lines(report)
    assert (node, lv) == ("fleet", "error") and msg.endswith("(exit 1: boom)")


def test_hostile_result_lines_are_bounded_and_typed() -> None:
    nodes = NODES16[:4]
    good = line(nodes, slowed())
    for bad, error in (
        ("", "no result line"),
        (MARK + "{", "not JSON"),
        (MARK + "[" * 200_000 + "]" * 200_000, "not JSON"),
        (MARK + "[1]", "not an object"),
        (MARK + "x" * (MAX_LINE + 1), "over"),
        (line(nodes, slowed(), world=5), "for 5 ranks"),
        (line(nodes, slowed(), world=True), "not 4"),
    ):
        measured = parse_result(bad, nodes)
        assert measured.fleet.busbw_gbps is None and error in measured.fleet.error, (bad[:80], measured)
    for value in ('"fast"', "-1", "true", "NaN", "1e300", "null"):
        text = good.replace('"busbw_gbps": 0.2', f'"busbw_gbps": {value}')
        measured = parse_result(text, nodes)
        assert measured.fleet.busbw_gbps is None
        assert all(r.busbw_gbps is None for groups in measured.rounds for _g, r in groups)
    # groups outside the schedule, odd ranks entries and foreign fields are ignored
    data = json.loads(good.splitlines()[1][len(MARK) :])
    data["rounds"][1].append({"ranks": [0, 2], "busbw_gbps": 0.0001})
    data["rounds"][1].append({"ranks": ["0", 1], "busbw_gbps": 0.0001})
    data["rounds"][2].append("junk")
    data["rounds"].append([{"ranks": [0, 3], "busbw_gbps": 0.0001}])
    data["ranks"] = [{"host": "\x1b[2J", "gflops": "many"}, 5, {"gflops": True}] + [{}] * 100
    report = locate(nodes, parse_result(MARK + json.dumps(data), nodes))
    assert report.slow == [] and report.slow_links == [] and set(report.per_node.values()) == {0.2}
    assert report.fleet is not None and dict(report.fleet.gflops) == {}
    assert [g for g, _r in report.measured] == [tuple(nodes)] + [g for r in schedule(nodes)[1:] for g in r]


@pytest.mark.skipif(not IMAGE_PYTHON.exists(), reason="the node image's python (with torch) is not here")
def test_node_script_runs_concurrent_pair_groups_under_torchrun(tmp_path: Path) -> None:
    """Five ranks on this machine (gloo), the real script: round 1 and 2 run two pair groups at
    once, round 3 one; every group of the schedule comes back with a figure."""
    script = ROOT / "launch" / "nodelib" / "fleetrun_collective.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_", "LOCAL_"))}
    env.update(FLEETRUN_COLLECTIVE_MB="0.25", FLEETRUN_COLLECTIVE_REPS="2", OMP_NUM_THREADS="1")
    argv = [str(IMAGE_PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "5"]
    proc = subprocess.run(
        [*argv, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    nodes = [f"r{i}" for i in range(5)]
    measured = parse_result(proc.stdout, nodes)
    assert measured.fleet.busbw_gbps is not None and measured.fleet.backend == "gloo", measured
    assert len(measured.fleet.gflops) == 5
    got = [
        [g for g, r in groups if r.busbw_gbps is not None and r.busbw_gbps > 0] for groups in measured.rounds
    ]
    assert got == [[("r0", "r1"), ("r2", "r3")], [("r1", "r2"), ("r3", "r4")], [("r4", "r0")]], measured


# -- the confirmation: suspects re-measured in the same launch --------------------------------------
# The ring's figures of a healthy 16-node fleet at load over 14 (the false names before the
# re-measure): n06 at 0.17 in both its pairs against a median of 0.36, its partners fine elsewhere.
CONTENTION = {("n05", "n06"): 0.17, ("n06", "n07"): 0.17}


def contended(group: tuple[str, ...]) -> float:
    return CONTENTION.get(group, 0.36)


def test_a_contention_blip_suspected_but_not_confirmed_is_not_named() -> None:
    """The ring suspects n06 (0.47x); its re-measure with a node not suspected, the suspects'
    pairs alone, comes back at the fleet's figure: cleared, nobody named, the counts told."""
    report = locate(NODES16, parse_result(line(NODES16, contended), NODES16))
    assert report.suspected == ["n06"] and report.slow == [] and report.slow_links == []
    partner, again = report.confirm["n06"]
    assert partner not in ("n05", "n07") and again.busbw_gbps == 0.36
    assert report.per_node["n06"] == 0.36, "its best pair, the re-measure's included"
    assert report.ring_per_node["n06"] == 0.17
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert all(lv == "ok" for lv, _m in lines.values())
    assert (
        lines["n06"][1]
        == f"0.360 GB/s in its pair test: 0.170 GB/s in the ring, cleared by its re-measure with {partner}"
    )
    assert lines["fleet"][1].endswith("1 suspected in the ring of pairs, 0 confirmed by a re-measure")
    saved = saved_result(json.dumps({"time": 1.0, "nodes": NODES16, **report.to_json()}))
    assert saved.suspected == ("n06",) and saved.slow == ()


def test_a_real_slow_link_confirmed_by_its_remeasure_is_named() -> None:
    """n11 behind a slow link: slow in the ring, slow again with a fresh partner -> named; the
    contention blip beside it (n06) in the same launch is cleared."""

    def ring(group: tuple[str, ...]) -> float:
        return 0.004 if "n11" in group else contended(group)

    report = locate(NODES16, parse_result(line(NODES16, ring), NODES16))
    assert report.suspected == ["n06", "n11"] and report.slow == ["n11"]
    assert len({report.confirm["n06"][0], report.confirm["n11"][0]}) == 2, "disjoint pairs, one round"
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert [n for n, (lv, _m) in lines.items() if lv != "ok"] == ["n11"]
    assert lines["n11"][1].endswith("(0.004 GB/s): a slow node or link")
    assert lines["fleet"][1].endswith("2 suspected in the ring of pairs, 1 confirmed by a re-measure")
    # a re-measure barely faster is still a confirmation: under 0.5x the ring's median
    again = locate(NODES16, parse_result(line(NODES16, ring, again=lambda g: 0.17), NODES16))
    assert again.slow == ["n06", "n11"]


def test_a_suspect_without_a_remeasure_is_a_warning_not_a_name() -> None:
    """The launch ended before the re-measure (or its figure is bad): not named, but warned."""
    report = locate(NODES16, parse_result(line(NODES16, slowed({"n11"}), confirm=[]), NODES16))
    assert report.suspected == ["n11"] and report.slow == []
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert (
        lines["n11"][0] == "warn"
        and "not confirmed: its re-measure with n00 has no figure" in lines["n11"][1]
    )
    assert "not measured" in lines["n11"][1]
    bad = locate(NODES16, parse_result(line(NODES16, slowed({"n11"}), again=lambda g: None), NODES16))
    assert bad.slow == [] and "no bandwidth" in bad.confirm["n11"][1].error


def test_the_remeasure_plan_pairs_every_suspect_with_a_node_not_suspected() -> None:
    nodes = list(range(6))
    ring = {(0, 1): 0.01, (1, 2): 0.01, (2, 3): 0.3, (3, 4): 0.2, (4, 5): 0.25, (5, 0): 0.01}
    assert suspected(nodes, ring) == [0, 1]
    plan = confirm_rounds(nodes, ring, [0, 1])
    assert plan == [[(0, 2), (1, 3)]], "the fastest free node, not a ring partner, disjoint"
    many = confirm_rounds(nodes, ring, [0, 1, 2, 5])  # more suspects than the others: rounds
    assert [len(r) for r in many] == [2, 2] and all(p in (3, 4) for r in many for _s, p in r)
    assert confirm_rounds(nodes, ring, nodes) == [], "nobody left to pair with"
    assert confirm_rounds(nodes, ring, []) == []


def test_a_hostile_confirm_part_is_ignored_outside_the_plan() -> None:
    """The line claims re-measures the ring's figures do not call for, or for the wrong pair:
    only the plan recomputed from the figures counts (a healthy fleet stays healthy, a slow
    node's claimed fast re-measure with a partner off the plan does not clear it)."""
    healthy = json.loads(line(NODES16, slowed()).splitlines()[1][len(MARK) :])
    healthy["confirm"] = [[{"ranks": [3, 4], "busbw_gbps": 0.0001}], "junk", [{"ranks": [0, True]}]]
    report = locate(NODES16, parse_result(MARK + json.dumps(healthy), NODES16))
    assert report.suspected == [] and report.slow == [] and len(report.measured) == 17
    slow = json.loads(line(NODES16, slowed({"n11"})).splitlines()[1][len(MARK) :])
    slow["confirm"] = [[{"ranks": [11, 5], "busbw_gbps": 9.0}, {"ranks": [11, 0, 2], "busbw_gbps": 9.0}]]
    report = locate(NODES16, parse_result(MARK + json.dumps(slow), NODES16))
    assert report.slow == [] and report.confirm["n11"][1].busbw_gbps is None, "off the plan: no figure"
    slow["confirm"] = [[{"ranks": [11, 0], "busbw_gbps": value}] for value in ('"x"',)] + [[]] * 10_000
    report = locate(NODES16, parse_result(MARK + json.dumps(slow), NODES16))
    assert report.slow == [] and len(report.measured) == 18


SLOWED_RANK = """
import os, sys, time
sys.path.insert(0, os.environ["SCRIPT_DIR"])
import torch.distributed as dist
import fleetrun_collective as script

if os.environ.get("RANK") == "3":  # this rank's link stood in for: every large all-reduce waits
    plain = dist.all_reduce

    def slow(tensor, *args, **kwargs):
        if tensor.numel() > 4096:
            time.sleep(0.3)
        return plain(tensor, *args, **kwargs)

    dist.all_reduce = slow
sys.exit(script.main())
"""


@pytest.mark.skipif(not IMAGE_PYTHON.exists(), reason="the node image's python (with torch) is not here")
def test_node_script_remeasures_a_slow_rank_in_the_same_launch(tmp_path: Path) -> None:
    """Five ranks (gloo), rank 3's all-reduces slowed: rank 0 suspects it from the ring, broadcasts
    the plan, every rank runs it in the same launch, and the laptop's reading confirms it."""
    wrapper = tmp_path / "slowed.py"
    wrapper.write_text(SLOWED_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_", "LOCAL_"))}
    env.update(
        FLEETRUN_COLLECTIVE_MB="0.25",
        FLEETRUN_COLLECTIVE_REPS="2",
        OMP_NUM_THREADS="1",
        SCRIPT_DIR=str(ROOT / "launch" / "nodelib"),
    )
    argv = [str(IMAGE_PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "5"]
    proc = subprocess.run(
        [*argv, str(wrapper)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    nodes = [f"r{i}" for i in range(5)]
    last = json.loads([x for x in proc.stdout.splitlines() if x.startswith(MARK)][-1][len(MARK) :])
    assert last["version"] == 3 and 3 in last["suspects"], last
    pair = next(p for r in last["confirm"] for p in r if p["ranks"][0] == 3)
    assert pair["ranks"][1] not in (2, 4) and pair["reps"] >= 2, pair
    report = locate(nodes, parse_result(proc.stdout, nodes))
    assert report.suspected == [f"r{r}" for r in last["suspects"]], "the laptop's plan is rank 0's"
    assert "r3" in report.slow and report.confirm["r3"][0] == f"r{pair['ranks'][1]}", report


def test_a_contended_round_suspects_links_that_their_remeasure_clears() -> None:
    """Seen in the bench at load 15 (these figures): round 1 as a whole ran at 0.1-0.2 GB/s,
    round 2 at 0.55, so three healthy round-1 pairs fell under 0.25x the median: suspected links,
    re-measured as the same pair again, cleared; the slow node 11 beside them still named. A link
    whose re-measure is as slow is named."""
    round1 = {("n02", "n03"): 0.115, ("n06", "n07"): 0.0922, ("n14", "n15"): 0.0945}

    def ring(group: tuple[str, ...]) -> float:
        return 0.0024 if "n11" in group else round1.get(group, 0.15 if int(group[0][1:]) % 2 == 0 else 0.55)

    def remeasure(group: tuple[str, ...]) -> float:
        return 0.0024 if "n11" in group else 0.3

    report = locate(NODES16, parse_result(line(NODES16, ring, again=remeasure), NODES16))
    assert report.suspected_links == [("n02", "n03"), ("n06", "n07"), ("n14", "n15")]
    assert report.slow == ["n11"] and report.slow_links == []
    lines = {node: (lv, msg) for node, lv, msg in verdict_lines(report)}
    assert [n for n, (lv, _m) in lines.items() if lv != "ok"] == ["n11"]
    assert lines["fleet"][1].endswith("confirmed by a re-measure; 3 link(s) suspected, 0 confirmed")
    ring6 = {(0, 1): 0.5, (1, 2): 0.05, (2, 3): 0.5, (3, 4): 0.05, (4, 5): 0.5, (5, 0): 0.5}
    assert remeasure_plan(list(range(6)), ring6) == [[(1, 2), (3, 4)]], "the same pairs, disjoint: one round"

    def still(group: tuple[str, ...]) -> float:
        return 0.0024 if "n11" in group else (0.1 if group in round1 else 0.5)

    confirmed = locate(NODES16, parse_result(line(NODES16, ring, again=still), NODES16))
    assert confirmed.slow == ["n11"] and confirmed.slow_links == [
        ("n02", "n03"),
        ("n06", "n07"),
        ("n14", "n15"),
    ]
    saved = saved_result(json.dumps({"time": 1.0, "nodes": NODES16, **report.to_json()}))
    assert saved.slow_links == () and saved.version == 3


class _Planted:
    """A code-carrying pickle: unpickling it writes ``marker`` (what a hostile node would send)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_rank_sending_a_code_carrying_pickle_runs_nothing(tmp_path: Path) -> None:
    """What the ranks exchange is parsed as JSON only: a pickle another node framed (the bytes
    torch's ``*_object`` collectives would have unpickled) is refused and its code never runs."""
    import pickle

    from launch.nodelib import fleetrun_collective as script

    marker = tmp_path / "marker"
    planted = pickle.dumps(_Planted(marker))
    pickle.loads(pickle.dumps(_Planted(tmp_path / "proof")))  # the pickle does carry code
    assert (tmp_path / "proof").read_text() == "ran"
    frame = len(planted).to_bytes(4, "big") + planted + bytes(64)
    with pytest.raises(script.ExchangeError):
        script.decode_json(script.unframe(frame, script.MAX_PLAN_BYTES))
    assert not marker.exists(), "a node's bytes ran code"
    # a frame claiming more than its bound is refused before any bytes are read as anything
    with pytest.raises(script.ExchangeError, match="over the bound"):
        script.unframe((10**6).to_bytes(4, "big") + bytes(16), script.MAX_INFO_BYTES)
    # a hostile plan or rank's facts are typed before use
    with pytest.raises(script.ExchangeError):
        script.parse_plan([[[0, 9]]], 5)
    with pytest.raises(script.ExchangeError):
        script.parse_plan([[[1, 1]]], 5)
    assert script.parse_plan(json.loads(json.dumps([[(3, 0)], [(1, 2)]])), 5) == [[(3, 0)], [(1, 2)]]
    assert script.rank_info({"host": ["x"], "gflops": True}) == {"host": None, "gflops": None}
    assert script.timing([float("nan"), 0.0]) is None and script.timing([0.5, 3.0]) == (0.5, 3)


PICKLING = {
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "broadcast_object",
    "allgather_object",
}


def test_no_node_script_calls_a_pickling_collective() -> None:
    """torch's ``all_gather_object``, ``broadcast_object_list``, ``gather_object``,
    ``scatter_object_list``, ``send_object_list``/``recv_object_list`` and Horovod's
    ``broadcast_object``/``allgather_object`` all unpickle what other ranks sent: no file of the
    node library (the collective, the checkpoint helper's resume) may call one."""
    import ast

    found = {}
    for path in sorted((ROOT / "launch" / "nodelib").glob("*.py")):
        tree = ast.parse(path.read_text())
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        bad = {c for c in called if c in PICKLING or "pickle" in c}
        if bad:
            found[path.name] = bad
    assert len(list((ROOT / "launch" / "nodelib").glob("*.py"))) > 10
    assert not found, found
