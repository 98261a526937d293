"""Re-checks after a stop decision (issue 19, item 8), without a fleet: overlapping checks, the
watcher's silence counted for the nodes the ``unreachable`` rule named, and never a lost node on
less evidence than the rule asks for (two failed checks, ``confirm_s`` apart with that silence)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from launch.job.inventory import Host
from launch.rules.recovery import NodeEvidence, confirmed_lost, silent_before
from launch.rules.stoprules import StopDecision
from launch.run.recheck import EarlyChecks, recheck
from tests.conftest import sample_inventory

EVERY = 0.02  # a round every 20 ms: the semantics, not the timing, are under test


def hosts(n: int) -> list[Host]:
    return list(sample_inventory(n).hosts)


def test_the_watchers_silence_counts_only_for_the_nodes_the_unreachable_rule_named() -> None:
    decision = StopDecision("failed", "unreachable", "node-1 unreachable for 10 s", nodes=("node-1",))
    assert silent_before(decision, 10.0) == {"node-1": 10.0}
    assert silent_before(decision, None) == {}
    failed = StopDecision("failed", "rank_failed", "rank 2 exited 1", nodes=("node-1",))
    assert silent_before(failed, 10.0) == {}


def test_credit_still_needs_two_failed_checks_and_no_answer() -> None:
    one = NodeEvidence("n", checks=(False,), span_s=0.0, silent_before_s=10.0)
    assert not confirmed_lost(one, 5.0)
    two = NodeEvidence("n", checks=(False, False), span_s=0.02, silent_before_s=10.0)
    assert confirmed_lost(two, 5.0)
    assert not confirmed_lost(NodeEvidence("n", checks=(False, False), span_s=0.02), 5.0)
    answered = NodeEvidence("n", checks=(False, True), span_s=1.0, silent_before_s=10.0)
    assert not confirmed_lost(answered, 5.0)


def test_a_silent_node_named_by_the_rule_is_confirmed_with_two_checks() -> None:
    two = hosts(2)
    silent = two[1].name
    evidence = recheck(
        two,
        confirm_s=5.0,
        check=lambda h: h.name != silent,
        silent_before={silent: 10.0},
        every_s=EVERY,
    )
    assert evidence[silent].checks == (False, False) and confirmed_lost(evidence[silent], 5.0)
    assert evidence[two[0].name].checks == (True,) and not confirmed_lost(evidence[two[0].name], 5.0)


def test_without_credit_the_checks_go_on_for_confirm_s() -> None:
    (host,) = hosts(1)
    evidence = recheck([host], confirm_s=5 * EVERY, check=lambda _h: False, every_s=EVERY)
    e = evidence[host.name]
    assert len(e.checks) >= 2 and not any(e.checks) and e.span_s >= 5 * EVERY
    assert confirmed_lost(e, 5 * EVERY)


def test_checks_overlap_a_check_that_hangs_does_not_hold_back_the_next() -> None:
    (host,) = hosts(1)
    release = threading.Event()
    calls: list[float] = []

    def slow(_h: Host) -> bool:
        calls.append(time.monotonic())
        if len(calls) == 1:
            release.wait(5)  # the first check hangs (a connect timeout)
        return False

    evidence = recheck([host], confirm_s=2 * EVERY, check=slow, every_s=EVERY)
    release.set()
    assert len(calls) >= 3, "later rounds started while the first check still hung"
    assert not any(evidence[host.name].checks) and len(evidence[host.name].checks) >= 2


def test_a_node_that_answers_once_is_not_lost_and_a_raising_check_is_a_failure() -> None:
    (host,) = hosts(1)
    answers = iter([False, True])
    evidence = recheck([host], confirm_s=1.0, check=lambda _h: next(answers), every_s=EVERY)
    assert True in evidence[host.name].checks and not confirmed_lost(evidence[host.name], 1.0)

    def broken(_h: Host) -> bool:
        raise OSError("no route to host")

    evidence = recheck([host], confirm_s=0.0, check=broken, every_s=EVERY)
    assert evidence[host.name].checks[:2] == (False, False)


def test_preempted_marks_are_kept() -> None:
    (host,) = hosts(1)
    evidence = recheck([host], 0.0, check=lambda _h: True, preempted=frozenset({host.name}), every_s=EVERY)
    assert evidence[host.name].preempted


# -- checks started inside the unreachable window (issue 33) ------------------------------------------
class Wall:
    """The watcher's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Contacts:
    """The watcher's nodes as the early checks read them: name -> (state, last answer)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, float | None]] = {}

    def __call__(self) -> list[tuple[str, str, float | None]]:
        return [(name, state, last) for name, (state, last) in list(self.nodes.items())]


def wait_for(predicate: Callable[[], bool]) -> None:
    """Until ``predicate`` holds (the checks run in threads); bounded only against a hang."""
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, "the early checks never got there"
        time.sleep(0.01)


def test_a_silent_nodes_checks_start_before_the_limit_and_the_recheck_at_the_limit_needs_no_more() -> None:
    two = hosts(2)
    gone = two[1].name
    wall, contacts = Wall(), Contacts()
    calls: list[str] = []
    hang = threading.Event()

    def check(host: Host) -> bool:
        calls.append(host.name)
        return host.name != gone

    early = EarlyChecks(two, limit_s=10.0, check=check, lead_s=4.0, every_s=EVERY, wall=wall)
    contacts.nodes = {two[0].name: ("running", wall.now), gone: ("running", wall.now)}
    early.start(contacts)
    try:
        time.sleep(10 * EVERY)
        assert calls == [], "no check before limit - lead"
        wall.now += 6.5  # gone has not answered for 6.5 s (due at 6 s, the limit at 10 s);
        contacts.nodes[two[0].name] = ("running", wall.now)  # the other answered just now
        wait_for(lambda: len(early.failed([gone]).get(gone, [])) >= 2)
        assert set(calls) == {gone}, "only the silent node is checked early"

        def at_the_limit(host: Host) -> bool:  # a silent machine: each new check hangs to its timeout
            if host.name == gone:
                hang.wait(30)
                return False
            return True

        evidence = recheck(
            two,
            confirm_s=5.0,
            check=at_the_limit,
            silent_before={gone: 10.0},
            every_s=EVERY,
            failed_early=early.failed([gone]),
        )
    finally:
        hang.set()
        early.stop()
    assert confirmed_lost(evidence[gone], 5.0), "two early failures and the silence confirm it at once"
    assert evidence[two[0].name].checks == (True,)


def test_an_answer_after_a_failed_early_check_voids_it_and_answers_never_count() -> None:
    (host,) = hosts(1)
    wall, contacts = Wall(), Contacts()
    answers = iter([False, False] + [True] * 100_000)
    early = EarlyChecks(
        [host], limit_s=2.0, check=lambda _h: next(answers), lead_s=1.0, every_s=EVERY, wall=wall
    )
    contacts.nodes = {host.name: ("running", wall.now)}
    early.start(contacts)
    try:
        wall.now += 1.5
        wait_for(lambda: len(early.failed([host.name]).get(host.name, [])) >= 2)
        contacts.nodes[host.name] = ("running", wall.now)  # the watcher heard from it again
        wait_for(lambda: early.failed([host.name]) == {})
        wall.now += 1.5  # silent again: the checks answer now, and nothing counts against it
        time.sleep(20 * EVERY)
        assert early.failed([host.name]) == {}
        contacts.nodes[host.name] = ("exited", wall.now - 100)  # an exited node is never checked
    finally:
        early.stop()
    evidence = recheck([host], confirm_s=0.0, check=lambda _h: True, every_s=EVERY, failed_early={})
    assert evidence[host.name].checks == (True,)
