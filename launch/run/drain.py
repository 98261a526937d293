"""Drain a preempted node before it is replaced: the notice is time to save, not a death.

A preemption notice (EC2: 120 s, GCE: 30 s) makes the node's watchdog flag every rank, which
checkpoints at its next step and uploads; the watchdog then waits for that checkpoint in the
bucket and records it in ``preempt.json`` (``launch.nodelib.fleetrun_guard.on_notice``). The
ranks exit, so the laptop's attempt ends within seconds of the notice, long before the upload is
done. Replacing the node then (its processes killed, its disk wiped) lost the very checkpoint the
notice asked for. So between stopping the survivors and replacing the noticed nodes, the laptop
reads each noticed node's record once a second and keeps the node, processes and watchdog
included, until the decision (``launch.rules.recovery.drain_verdict``) says it may go.

Everything here takes explicit arguments (the fleet, the hosts, the run id, a ``say`` callback),
so the runner's restructuring does not move it. ``peer_durable(node, step)`` is the hook for a
copy of the node's post-notice checkpoint elsewhere (a peer copy): until something provides one,
only the bucket makes a checkpoint durable and a node without a bucket is kept until its
watchdog is done or the notice runs out.

The record on the node is untrusted: read with a byte bound, parsed by the node protocol, and a
node that lies about its deadline is still let go after ``MAX_DRAIN_S`` of this machine's clock.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from launch.job.inventory import Host
from launch.nodelib.fleetrun_protocol import PreemptionNotice, ProtocolError
from launch.planning import remote_layout as layout
from launch.reports.safe_text import clean
from launch.rules.recovery import Drained, DrainVerdict, NoticeState, drain_verdict
from launch.transport.port import FleetPort, NodeLink

MAX_RECORD_BYTES = 16384
MAX_DRAIN_S = 600.0
"""The longest this machine waits for any node, whatever the node's record says."""
READ_TIMEOUT_S = 10.0
EVERY_S = 1.0
STEP_PATH = re.compile(r"step-(\d{1,18})/?\Z")

Read = Callable[[Host], "tuple[bool, NoticeState | None]"]
"""One read of a node: (it answered, its notice state or None when it has no readable record)."""
PeerDurable = Callable[[str, int], bool]


def never(_node: str, _step: int) -> bool:
    """No peer copies: only the bucket makes a post-notice checkpoint durable."""
    return False


def copied_through_laptop(spread: Callable[[], str | None]) -> PeerDurable:
    """A peer copy made by the laptop: ``spread`` copies the newest complete checkpoint of any node
    to every node of the run and returns its path (``.../step-<N>``) or None. Asked once, when the
    noticed node is done and holds a step no bucket confirmed (no bucket, or its upload failed):
    then a survivor holds that step too and the node may go. Without it a checkpoint that only
    the noticed node holds (rank 0's node, no bucket) would be wiped with it."""
    copied: list[int | None] = []

    def durable(_node: str, step: int) -> bool:
        if not copied:
            found = STEP_PATH.search(spread() or "")
            copied.append(int(found.group(1)) if found else None)
        return copied[0] is not None and copied[0] >= step

    return durable


def read_command(run_id: str) -> str:
    """The node's clock, then its notice record (bounded); nothing else."""
    path = f"$HOME/{layout.rundir(run_id)}/preempt.json"
    return f'date +%s.%N; head -c {MAX_RECORD_BYTES} "{path}" 2>/dev/null; true'


def parse_read(stdout: str) -> NoticeState | None:
    """``read_command``'s output as a ``NoticeState``; None when either part does not parse."""
    clock, _, record = stdout[: MAX_RECORD_BYTES + 64].partition("\n")
    try:
        node_now = float(clock.strip())
        notice = PreemptionNotice.from_json(record.strip())
    except (ValueError, ProtocolError):
        return None
    if not 0.0 < node_now < 1e11:
        return None
    return NoticeState(
        noticed_at=notice.noticed_at,
        deadline_at=notice.deadline_at,
        node_now=node_now,
        durable_step=notice.durable_step,
        saved_step=notice.saved_step,
        settled=notice.settled_at is not None,
        durable_made_after=notice.durable_made_after,
    )


def ssh_reader(fleet: FleetPort, run_id: str) -> Read:
    """Reads through the fleet's connections; any error (refused, timed out) is "no answer"."""
    command = read_command(run_id)

    def read(host: Host) -> tuple[bool, NoticeState | None]:
        def one(conn: NodeLink) -> str:
            result = conn.run(command, timeout=READ_TIMEOUT_S)
            if not result.ok:
                raise RuntimeError(f"exit {result.exit_code}")
            return str(result.stdout)

        answer = fleet.map(one, hosts=[host], deadline=READ_TIMEOUT_S + 5).get(host.name)
        if not isinstance(answer, str):
            return False, None
        return True, parse_read(answer)

    return read


def drain_noticed(
    hosts: Sequence[Host],
    read: Read,
    say: Callable[[str], None],
    peer_durable: PeerDurable = never,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    every_s: float = EVERY_S,
) -> tuple[Drained, ...]:
    """Keep each noticed node until its drain verdict says it may go; the record of each drain.

    Nodes are read one after another each round (a handful at most: the nodes one notice wave
    takes); a node whose verdict is in is not read again.
    """
    if not hosts:
        return ()
    started = clock()
    pending = {h.name: h for h in hosts}
    last: dict[str, NoticeState] = {}
    done: dict[str, Drained] = {}
    say(f"  draining {', '.join(pending)}: kept until the checkpoint made after the notice is durable")
    while pending:
        for name, host in list(pending.items()):
            reachable, state = read(host)
            if state is not None:
                last[name] = state
            # asked only when the bucket has not answered: a copy through the laptop is not free
            peer = (
                state is not None
                and not drain_verdict(state, reachable).done
                and state.saved_step is not None
                and peer_durable(name, state.saved_step)
            )
            verdict = drain_verdict(state, reachable, peer_durable=peer)
            if not verdict.done and clock() - started >= MAX_DRAIN_S:
                verdict = DrainVerdict("deadline", state.saved_step if state else None)
            if verdict.done:
                done[name] = _record(name, verdict, last.get(name), state)
                say(f"  {clean(name)}: {_sentence(done[name])}")
                del pending[name]
        if pending:
            sleep(every_s)
    return tuple(done[h.name] for h in hosts)


def _record(name: str, verdict: DrainVerdict, seen: NoticeState | None, now: NoticeState | None) -> Drained:
    """``seen``: the node's last readable record; ``now``: this read's (None: the node is gone,
    the notice's use is then counted to its last answer)."""
    assert verdict.why is not None
    notice_s = None
    used_s = None
    if seen is not None:
        if seen.deadline_at is not None:
            notice_s = max(0.0, seen.deadline_at - seen.noticed_at)
        used_s = max(0.0, (now or seen).node_now - seen.noticed_at)
    return Drained(node=name, ended=verdict.why, notice_s=notice_s, used_s=used_s, step=verdict.step)


def _sentence(d: Drained) -> str:
    used = "" if d.used_s is None else f" {d.used_s:.1f} s"
    of = "" if d.notice_s is None else f" of its {d.notice_s:.0f} s notice"
    if d.ended == "durable":
        return f"checkpoint step {d.step} is durable;{used}{of} used, replacing it now"
    if d.ended == "nothing_held":
        return f"holds no checkpoint made after the notice and its watchdog is done;{used}{of} used"
    if d.ended == "deadline":
        return f"the notice ran out{' (' + used.strip() + of + ')' if used else ''}; replacing it now"
    if d.ended == "gone":
        return "no longer answers (the cloud took it, or it powered off): replacing it"
    return "has no readable notice record: nothing to wait for"
