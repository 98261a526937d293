"""Spares: an inventory with more hosts than ``nodes``; the job takes the first healthy ones."""

from __future__ import annotations

from launch.rules.preflight import pick_hosts


def test_bad_hosts_are_skipped_with_their_reason_and_spares_fill_in() -> None:
    problems = {"b": "gpu1: uncorrectable ECC 2 (volatile)", "d": "ssh: connection refused"}
    chosen, excluded = pick_hosts(["a", "b", "c", "d", "e"], problems, 3)
    assert chosen == ["a", "c", "e"]
    assert excluded == problems


def test_a_bad_head_hands_the_head_to_the_next_healthy_host() -> None:
    chosen, excluded = pick_hosts(["a", "b", "c"], {"a": "rdzv-port: in use"}, 2)
    assert chosen == ["b", "c"] and list(excluded) == ["a"]


def test_hosts_past_the_ones_needed_are_not_probed_into_exclusions() -> None:
    chosen, excluded = pick_hosts(["a", "b", "c"], {"c": "rsync: not found"}, 2)
    assert chosen == ["a", "b"] and excluded == {}


def test_too_few_healthy_hosts_chooses_nothing() -> None:
    chosen, excluded = pick_hosts(["a", "b", "c"], {"a": "x", "b": "y"}, 2)
    assert chosen == [] and excluded == {"a": "x", "b": "y"}
    chosen, _ = pick_hosts(["a", "b", "c"], {"a": "x", "b": "y"}, 2, least=1)
    assert chosen == ["c"]
