"""A preemption notice drains, it does not kill (issue 19, item 3), without a fleet: the pure
decision (``drain_verdict``), the drain loop with a scripted node and a fake clock, what a node's
record may and may not make the laptop believe, the notice's own deadline, and the record."""

from __future__ import annotations

import json

import pytest

from launch.job.inventory import Host
from launch.nodelib import fleetrun_preempt
from launch.nodelib.fleetrun_protocol import PreemptionNotice
from launch.rules.recovery import AttemptEnd, Drained, DrainVerdict, NoticeState, drain_verdict
from launch.run.checkpoints import Spread, drained_from_bucket
from launch.run.drain import MAX_DRAIN_S, copied_through_laptop, drain_noticed, parse_read, read_command
from tests.conftest import sample_inventory

NOTICED = 1_000_000.0


def state(at: float, **fields: object) -> NoticeState:
    values: dict[str, object] = {
        "noticed_at": NOTICED,
        "deadline_at": NOTICED + 120,
        "node_now": NOTICED + at,
    }
    values.update(fields)
    return NoticeState(**values)  # type: ignore[arg-type]


def test_a_noticed_node_is_kept_while_its_checkpoint_is_not_durable() -> None:
    verdict = drain_verdict(state(3.0, saved_step=20), reachable=True)
    assert not verdict.done and verdict.why is None


def test_the_bucket_confirming_the_post_notice_step_ends_the_drain() -> None:
    verdict = drain_verdict(state(9.0, saved_step=20, durable_step=20, settled=True), reachable=True)
    assert verdict.done and verdict.why == "durable" and verdict.step == 20


def test_an_older_step_the_watchdog_fell_back_to_is_not_the_post_notice_checkpoint() -> None:
    # the post-notice upload never finished: at its deadline the watchdog names an older step
    older = state(115.0, saved_step=20, durable_step=15, durable_made_after=False, settled=True)
    assert not drain_verdict(older, reachable=True).done
    assert drain_verdict(older, reachable=True, peer_durable=True).why == "durable"
    # a node holding nothing (rank 0 elsewhere) is let go, without claiming the older step
    worker = state(115.0, durable_step=5, durable_made_after=False, settled=True)
    assert drain_verdict(worker, reachable=True) == DrainVerdict("nothing_held")
    # the saved step itself confirmed is the post-notice checkpoint, whatever the flag says
    same = state(9.0, saved_step=20, durable_step=20, durable_made_after=False, settled=True)
    assert drain_verdict(same, reachable=True).why == "durable"


def test_a_peer_copy_of_the_saved_step_ends_the_drain_and_only_with_a_saved_step() -> None:
    assert drain_verdict(state(4.0, saved_step=20), reachable=True, peer_durable=True).why == "durable"
    assert not drain_verdict(state(4.0), reachable=True, peer_durable=True).done


def test_a_node_that_holds_nothing_is_let_go_once_its_watchdog_is_done() -> None:
    assert not drain_verdict(state(2.0), reachable=True).done  # the watchdog still waits
    assert drain_verdict(state(2.0, settled=True), reachable=True).why == "nothing_held"
    # settled, but it holds the post-notice checkpoint and nothing else does: kept
    assert not drain_verdict(state(2.0, settled=True, saved_step=20), reachable=True).done


def test_the_notice_running_out_ends_the_drain_near_its_deadline() -> None:
    assert not drain_verdict(state(117.9, saved_step=20), reachable=True).done
    verdict = drain_verdict(state(118.0, saved_step=20), reachable=True)
    assert verdict.why == "deadline" and verdict.step == 20
    # GCE gives no time: the notice plus the cloud's window
    short = state(28.5, deadline_at=None)
    assert drain_verdict(short, reachable=True, window_s=30.0).why == "deadline"
    assert not drain_verdict(short, reachable=True, window_s=120.0).done


def test_a_silent_node_or_one_without_a_record_is_not_waited_for() -> None:
    assert drain_verdict(state(1.0), reachable=False).why == "gone"
    assert drain_verdict(None, reachable=True).why == "no_notice"


def record(**fields: object) -> str:
    notice = PreemptionNotice(noticed_at=NOTICED, source="ec2-imdsv2", deadline_at=NOTICED + 120)
    data = {**notice.to_dict(), **fields}
    return json.dumps(data)


def test_parse_read_takes_the_node_clock_and_its_record() -> None:
    parsed = parse_read(f"{NOTICED + 7.5}\n" + record(saved_step=20, settled_at=NOTICED + 7))
    assert parsed == state(7.5, saved_step=20, settled=True, durable_made_after=False)
    made_after = parse_read(f"{NOTICED}\n" + record(durable_step=20, durable_made_after=True))
    assert made_after is not None and made_after.durable_made_after
    assert parse_read(f"{NOTICED}\n" + record(durable_made_after="yes")) is None
    assert parse_read(f"{NOTICED}\n") is None  # no record: nothing to wait for
    assert parse_read("not a clock\n" + record()) is None
    assert parse_read(f"{NOTICED}\n" + record(saved_step="20; rm -rf /")) is None
    assert parse_read(f"{NOTICED}\n" + record(deadline_at=float("1e300"))) is None
    assert "preempt.json" in read_command("r1") and "head -c" in read_command("r1")


class FakeNode:
    """A noticed node as the drain sees it: one scripted answer per read, then the last again."""

    def __init__(self, answers: list[tuple[bool, NoticeState | None]]) -> None:
        self.answers = answers
        self.reads = 0

    def __call__(self, _host: Host) -> tuple[bool, NoticeState | None]:
        answer = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        return answer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def hosts(n: int = 1) -> list[Host]:
    return list(sample_inventory(n).hosts)


def test_the_drain_waits_for_the_bucket_then_records_how_much_of_the_notice_it_used() -> None:
    node = FakeNode(
        [
            (True, state(2.0)),
            (True, state(3.0, saved_step=20)),
            (True, state(4.0, saved_step=20)),
            (True, state(6.5, saved_step=20, durable_step=20, settled=True)),
        ]
    )
    clock, said = FakeClock(), list[str]()
    (drained,) = drain_noticed(hosts(), node, said.append, clock=clock, sleep=clock.sleep)
    assert node.reads == 4, "kept until the record said durable"
    assert drained.ended == "durable" and drained.step == 20
    assert drained.notice_s == 120.0 and drained.used_s == 6.5
    assert any("step 20 is durable" in line and "6.5 s of its 120 s notice" in line for line in said), said


def test_the_peer_copy_hook_is_asked_about_the_saved_step() -> None:
    asked: list[tuple[str, int]] = []

    def peer(node: str, step: int) -> bool:
        asked.append((node, step))
        return len(asked) >= 2

    node = FakeNode([(True, state(3.0, saved_step=20, settled=True))])
    clock = FakeClock()
    (drained,) = drain_noticed(
        hosts(), node, lambda _m: None, peer_durable=peer, clock=clock, sleep=clock.sleep
    )
    assert drained.ended == "durable" and drained.step == 20
    name = hosts()[0].name
    assert asked == [(name, 20), (name, 20)]


def test_a_node_lying_about_its_deadline_is_let_go_after_the_cap() -> None:
    forever = state(1.0, deadline_at=NOTICED + 10**9, saved_step=20)
    node = FakeNode([(True, forever)])
    clock = FakeClock()
    (drained,) = drain_noticed(hosts(), node, lambda _m: None, clock=clock, sleep=clock.sleep)
    assert drained.ended == "deadline" and MAX_DRAIN_S <= clock.now <= MAX_DRAIN_S + 2


def test_each_node_ends_on_its_own_and_a_gone_node_is_not_read_again() -> None:
    two = hosts(2)
    first = FakeNode([(False, None)])
    second = FakeNode([(True, state(1.0)), (True, state(2.0, settled=True))])
    by_name = {two[0].name: first, two[1].name: second}
    clock = FakeClock()
    out = drain_noticed(two, lambda h: by_name[h.name](h), lambda _m: None, clock=clock, sleep=clock.sleep)
    assert [d.ended for d in out] == ["gone", "nothing_held"]
    assert first.reads == 1 and second.reads == 2


def test_the_attempt_record_carries_the_drain() -> None:
    end = AttemptEnd(
        attempt=1,
        nodes=("a", "b"),
        started_at=0.0,
        ended_at=1.0,
        outcome="preempted",
        rule="rank_failed",
        reason="r",
        drained=(Drained(node="b", ended="durable", notice_s=120.0, used_s=6.54, step=20),),
    )
    assert end.to_json()["drained"] == [
        {"node": "b", "ended": "durable", "notice_s": 120.0, "used_s": 6.54, "step": 20}
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"action": "terminate", "time": "2026-11-25T17:02:00Z"}', 1795626120.0),
        ('{"action": "terminate"}', None),
        ('{"action": "terminate", "time": "soon"}', None),
        ("[]", None),
        ("\xff", None),
    ],
)
def test_the_ec2_notice_tells_its_time(body: str, expected: float | None) -> None:
    assert fleetrun_preempt.notice_deadline(body) == expected


def test_the_deadline_is_the_notice_time_within_the_window_else_the_window() -> None:
    notice = fleetrun_preempt.Notice("x", deadline=NOTICED + 90)
    assert fleetrun_preempt.deadline_of(notice, NOTICED, 120.0) == NOTICED + 90
    past = fleetrun_preempt.Notice("x", deadline=NOTICED - 5)  # a skewed clock or a stale answer
    assert fleetrun_preempt.deadline_of(past, NOTICED, 120.0) == NOTICED + 120
    far = fleetrun_preempt.Notice("x", deadline=NOTICED + 3600)
    assert fleetrun_preempt.deadline_of(far, NOTICED, 120.0) == NOTICED + 120
    assert fleetrun_preempt.deadline_of(fleetrun_preempt.Notice("x"), NOTICED, 30.0) == NOTICED + 30


def test_the_laptops_copy_makes_the_saved_step_durable_once_it_holds_it() -> None:
    calls: list[int] = []

    def spread() -> str | None:
        calls.append(1)
        return "~/.fleetrun/runs/r1/checkpoints/step-23"

    durable = copied_through_laptop(spread)
    assert durable("n1", 23) and durable("n1", 20)
    assert not durable("n1", 24), "an older copy does not make a newer step durable"
    assert len(calls) == 1, "copied once"
    assert not copied_through_laptop(lambda: None)("n1", 1)
    assert not copied_through_laptop(lambda: "/tmp/step-7; rm -rf ~")("n1", 1)


def test_without_a_bucket_the_head_is_drained_by_the_laptops_copy() -> None:
    node = FakeNode([(True, state(2.0)), (True, state(4.0, saved_step=23, settled=True))])
    clock = FakeClock()
    durable = copied_through_laptop(lambda: "runs/r1/checkpoints/step-23")
    (drained,) = drain_noticed(
        hosts(), node, lambda _m: None, peer_durable=durable, clock=clock, sleep=clock.sleep
    )
    assert drained.ended == "durable" and drained.step == 23 and node.reads == 2


def test_no_copy_through_the_laptop_once_the_bucket_confirmed_the_step() -> None:
    asked: list[int] = []

    def peer(_node: str, step: int) -> bool:
        asked.append(step)
        return False

    node = FakeNode([(True, state(5.0, saved_step=20, durable_step=20, settled=True))])
    clock = FakeClock()
    (drained,) = drain_noticed(
        hosts(),
        node,
        lambda _m: None,
        peer_durable=peer,
        clock=clock,
        sleep=clock.sleep,
    )
    assert drained.ended == "durable" and asked == []


# -- the resume after a drain: the bucket's step outranks an older one on the nodes' disks -------


def test_a_drained_step_in_the_bucket_is_resumed_from_over_an_older_one_on_a_disk() -> None:
    """A second notice, on the head: the worker still holds the step copied to it for attempt 2,
    the step the drain saw reach the bucket is newer; resuming from the disk recomputed 7 steps."""
    on_disk = Spread("/home/n1/.fleetrun/runs/r/checkpoints/step-10", "every node holds step 10", "step 10")
    drained = (Drained(node="n0", ended="durable", notice_s=120.0, used_s=19.0, step=17),)
    chosen = drained_from_bucket(on_disk, drained, "s3://b/runs/r")
    assert chosen.resume_from == "s3://b/runs/r/checkpoints/step-17", chosen
    assert "step 17 from the bucket" in chosen.record and "n0" in chosen.record
    nothing = Spread(None, "no node holds a checkpoint", "the bucket's newest step, if any")
    assert drained_from_bucket(nothing, drained, "s3://b/runs/r").resume_from == chosen.resume_from


@pytest.mark.parametrize(
    ("disk_step", "drained", "url"),
    [
        (17, (Drained("n0", "durable", 120.0, 19.0, 17),), "s3://b/runs/r"),  # the disk has it too
        (20, (Drained("n0", "durable", 120.0, 19.0, 17),), "s3://b/runs/r"),  # a newer one on disk
        (10, (Drained("n0", "deadline", 120.0, 118.0, 17),), "s3://b/runs/r"),  # not confirmed
        (10, (Drained("n0", "durable", 120.0, 19.0, 17),), None),  # no bucket
        (10, (), "s3://b/runs/r"),  # no drain
    ],
)
def test_the_disks_choice_stands_otherwise(
    disk_step: int, drained: tuple[Drained, ...], url: str | None
) -> None:
    on_disk = Spread(f"/x/checkpoints/step-{disk_step}", "said", "record")
    assert drained_from_bucket(on_disk, drained, url) == on_disk
