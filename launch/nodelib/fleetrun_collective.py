"""``fab doctor --collective``'s test, run by ONE torchrun launch over all the chosen nodes (one
process per node): every measurement in that launch, because starting torch on many nodes costs
far more than the measurements (45-70 s for 16 nodes on a loaded machine, against seconds).

A short matmul (this rank's GFLOP/s), then fixed all-reduce rounds (``ring_rounds``; in each
group a small warm-up, then ``FLEETRUN_COLLECTIVE_REPS`` repetitions at most, no more after the first
than fit in ``BUDGET_S``, each timed alone: the group's figure is its fastest repetition, as
other work on a node only ever slows one down): the whole world (the fleet's figure), then the ring of neighbour pairs (i, i+1 mod N) in two rounds of
disjoint pairs (a third with the one pair (N-1, 0) when N is odd). Every pair of a round runs at
the same time on its own process group, so 3 or 4 rounds whatever N, N pairs and not N(N-1)/2;
every node is in exactly two pairs, so a slow node (both its pairs slow) and a slow link (one
pair slow, both nodes fine in their other pair) are told apart on the laptop.

Bus bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n), over gloo on CPU or NCCL
on GPU, the backends the job itself will use. Process groups: every rank calls ``new_group`` for
every group, in the same order, member or not (the plain, globally synchronised form: no
``use_local_synchronization``). NCCL's rule for several communicators on one device is that
operations on them must not be issued in different orders on different ranks; here a rank uses
one communicator at a time (at most one group per round) and every round ends with a world
barrier, so no two communicators of a rank are ever in flight together. Pair communicators are
created lazily by NCCL on their first all-reduce (the warm-up, before the round's barrier).

Rank 0 prints ``FLEETRUN_COLLECTIVE {json}`` after each round with every round so far (a launch
that dies in round 2 still leaves round 0 and 1); the laptop reads the last one as untrusted
input (``launch.rules.collective``). Sizes come from the environment (``FLEETRUN_COLLECTIVE_MB``,
``FLEETRUN_COLLECTIVE_REPS``) so a test can keep it short.

Then, in the same launch, the confirmation: rank 0 takes the ring's pair figures, names the
suspects (``suspected``: the nodes whose pairs were slow because of them; ``suspected_links``)
and broadcasts a plan (``remeasure_plan``: each suspect paired with a node not suspected, each
suspected link the same pair again); the suspects' pairs are
re-measured, ``CONFIRM_REPS`` repetitions at least two, the best kept, and the line gets a
``confirm`` part. Why: on a loaded shared machine CPU contention alone gave a healthy node 0.49x
in the ring (N/2 pairs at once); the re-measure runs only the suspects' pairs, so contention
fades and a slow link stays slow. A second torchrun launch would cost a torch start per node
(~2.5 CPU-s each), far more than these few seconds. Rank 0 decides on the rounded figures it
prints, so the laptop recomputes the same plan from the line and trusts only that.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

MARK = "FLEETRUN_COLLECTIVE "
VERSION = 3
"""The result line's format: 3 adds ``suspects`` and ``confirm`` (2: the single launch with rounds,
1: one launch per group)."""
BUDGET_S = 1.0
"""A group does no more repetitions after its first than fit in this (none when the first took
longer): a slow link's one repetition is already a long, exact measurement (a 20 Mbit/s link took
3.5 s a pair all-reduce of 8 MiB; 4 repetitions and a full-size warm-up in each of 3 rounds were
about 70 s of a 16-node doctor's 122 s)."""
CONFIRM_REPS = 3
"""A suspect's re-measure: this many repetitions (``FLEETRUN_COLLECTIVE_CONFIRM_REPS``), the best
kept, as bandwidth tests do; never fewer than two (one figure is what a blip spoils)."""
CONFIRM_BUDGET_S = 2.0
"""Repetitions after the second stop once they would pass this (a slow link's are seconds each)."""
SLOW_RATIO = 0.5
"""A node under this times the median node's figure and its partners' figures elsewhere is suspected."""
LINK_RATIO = 0.25
"""A pair under this times the median node's figure, neither node suspected, is a suspected link
(one figure, so a stricter bound)."""

Node = TypeVar("Node", bound=Hashable)


def ring_rounds(world: int) -> list[list[tuple[int, ...]]]:
    """The fixed schedule, ranks per group per round: round 0 the whole world; then the neighbour
    pairs (i, i+1 mod N), even i in one round and odd i in the next (disjoint in each round); with
    N odd the pair (N-1, 0) would meet node 0 twice in the first, so it gets a round of its own.
    Two nodes: the world is the one pair. Shared with the laptop (``launch.rules.collective``)."""
    if world < 2:
        return []
    rounds: list[list[tuple[int, ...]]] = [[tuple(range(world))]]
    if world == 2:
        return rounds
    even: list[tuple[int, ...]] = []
    odd: list[tuple[int, ...]] = []
    last: list[tuple[int, ...]] = []
    for i in range(world):
        pair = (i, (i + 1) % world)
        if world % 2 and i == world - 1:
            last.append(pair)
        else:
            (odd if i % 2 else even).append(pair)
    return rounds + [r for r in (even, odd, last) if r]


def best_of_pairs(nodes: Sequence[Node], pairs: Mapping[tuple[Node, ...], float]) -> dict[Node, float]:
    """Each node's figure: its best pair (nodes in no measured pair left out), in ``nodes`` order."""
    found: dict[Node, float] = {}
    for node in nodes:
        own = [v for g, v in pairs.items() if node in g]
        if own:
            found[node] = max(own)
    return found


def suspected(
    nodes: Sequence[Node], pairs: Mapping[tuple[Node, ...], float], ratio: float = SLOW_RATIO
) -> list[Node]:
    """The nodes whose pairs were slow because of them, in ``nodes`` order: the best pair under
    ``ratio`` times the median node's, and under ``ratio`` times its partners' figures in their
    other pairs (a partner slow there too left out: its other pair says nothing of this node).
    Shared by rank 0 (ranks, to plan the re-measure) and the laptop (``launch.rules.collective``)."""
    per_node = best_of_pairs(nodes, pairs)
    if len(per_node) < 3:
        return []
    median = statistics.median(per_node.values())

    def partners_elsewhere(node: Node) -> float | None:
        found = []
        for group in pairs:
            if node in group:
                for partner in group:
                    other = [v for g, v in pairs.items() if partner in g and node not in g]
                    if partner != node and other and max(other) >= ratio * median:
                        found.append(max(other))
        return min(found) if found else None

    return [
        n
        for n, v in per_node.items()
        if v < ratio * median and ((ref := partners_elsewhere(n)) is None or v < ratio * ref)
    ]


def confirm_rounds(
    nodes: Sequence[Node], pairs: Mapping[tuple[Node, ...], float], suspects: Sequence[Node]
) -> list[list[tuple[Node, Node]]]:
    """The re-measure's plan: each suspect (in order) with a node not suspected, the fastest free
    one by its best pair, not a ring partner of the suspect where one is free (a fresh partner:
    a slow link to a neighbour is not taken for a slow node); pairs disjoint in a round, rounds
    until every suspect has its pair (one round while suspects are fewer than the others).
    None when no node is left unsuspected."""
    per_node = best_of_pairs(nodes, pairs)
    healthy = sorted((n for n in per_node if n not in suspects), key=lambda n: -per_node[n])
    left = [s for s in suspects if s in per_node]
    rounds: list[list[tuple[Node, Node]]] = []
    while left and healthy:
        free = list(healthy)
        this: list[tuple[Node, Node]] = []
        while left and free:
            node = left.pop(0)
            ring = {m for g in pairs if node in g for m in g}
            partner = next((h for h in free if h not in ring), free[0])
            free.remove(partner)
            this.append((node, partner))
        rounds.append(this)
    return rounds


def suspected_links(
    nodes: Sequence[Node],
    pairs: Mapping[tuple[Node, ...], float],
    suspects: Sequence[Node],
    ratio: float = LINK_RATIO,
) -> list[tuple[Node, Node]]:
    """The ring's pairs under ``ratio`` times the median node's figure whose nodes are not
    suspected (a suspect's slow pairs are its own): re-measured as they are, the same pair again
    (a whole contended round once put three healthy pairs at 0.17-0.22x)."""
    per_node = best_of_pairs(nodes, pairs)
    if len(per_node) < 3:
        return []
    median = statistics.median(per_node.values())
    return [
        (g[0], g[1])
        for g, v in pairs.items()
        if len(g) == 2 and v < ratio * median and not set(g) & set(suspects)
    ]


def remeasure_plan(
    nodes: Sequence[Node], pairs: Mapping[tuple[Node, ...], float]
) -> list[list[tuple[Node, Node]]]:
    """Every re-measure of one launch: the suspects' rounds (``confirm_rounds``), then the
    suspected links, packed into rounds of disjoint pairs (in order, each in the first round it
    fits)."""
    suspects = suspected(nodes, pairs)
    rounds = confirm_rounds(nodes, pairs, suspects)
    links: list[list[tuple[Node, Node]]] = []
    for link in suspected_links(nodes, pairs, suspects):
        home = next((r for r in links if not {m for p in r for m in p} & set(link)), None)
        if home is None:
            links.append([link])
        else:
            home.append(link)
    return rounds + links


# -- what the ranks exchange: numbers in tensors, or JSON bytes in a uint8 tensor -------------------
# Never torch's ``*_object`` collectives: they pickle, and unpickling what another node sent runs
# whatever code it carries. A node is untrusted (``docs/explanation/security-model.md``).

MAX_HOST = 255
MAX_INFO_BYTES = 1024
"""A rank's own facts (host name, GFLOP/s) as JSON, at most this many bytes."""
MAX_PLAN_BYTES = 64 * 1024
"""Rank 0's re-measure plan as JSON, at most this many bytes (a few pairs per suspect)."""


class ExchangeError(ValueError):
    """Bytes another rank sent that are not what the exchange carries."""


def encode_json(value: object, limit: int) -> bytes:
    data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > limit:
        raise ExchangeError(f"{len(data)} bytes to send, over the bound of {limit}")
    return data


def decode_json(data: bytes) -> object:
    """``data`` (another rank's, untrusted) as JSON, or an ``ExchangeError``: only ever parsed as
    JSON text, so pickle bytes (or anything else) are refused, never run."""
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ExchangeError(f"not JSON ({type(exc).__name__})") from None


def _framed(data: bytes, limit: int, device):  # type: ignore[no-untyped-def]
    """``data`` in a fixed-size uint8 tensor: 4 bytes of length, then the bytes, zero padded."""
    import torch

    if len(data) > limit:
        raise ExchangeError(f"{len(data)} bytes to send, over the bound of {limit}")
    frame = len(data).to_bytes(4, "big") + data + bytes(limit - len(data))
    return torch.tensor(list(frame), dtype=torch.uint8, device=device)


def unframe(frame: bytes, limit: int) -> bytes:
    """The bytes in a frame another rank sent, its length checked against the bound."""
    if len(frame) < 4:
        raise ExchangeError("a frame shorter than its length")
    size = int.from_bytes(frame[:4], "big")
    if size > limit or size > len(frame) - 4:
        raise ExchangeError(f"a frame claiming {size} bytes, over the bound of {limit}")
    return bytes(frame[4 : 4 + size])


def gather_bytes(dist, data: bytes, limit: int, world: int, device) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Every rank's ``data`` (at most ``limit`` bytes each), in rank order."""
    import torch

    own = _framed(data, limit, device)
    every = [torch.zeros_like(own) for _ in range(world)]
    dist.all_gather(every, own)
    return [unframe(bytes(t.cpu().tolist()), limit) for t in every]


def broadcast_bytes(dist, data: bytes, limit: int, device, src: int = 0) -> bytes:  # type: ignore[no-untyped-def]
    """Rank ``src``'s ``data`` (at most ``limit`` bytes) on every rank."""
    frame = _framed(data, limit, device)
    dist.broadcast(frame, src=src)
    return unframe(bytes(frame.cpu().tolist()), limit)


def rank_info(value: object) -> dict[str, object]:
    """A rank's facts as the result line carries them, typed; anything else: nulls (the laptop
    checks them again)."""
    if not isinstance(value, dict):
        return {"host": None, "gflops": None}
    host, gflops = value.get("host"), value.get("gflops")
    return {
        "host": host[:MAX_HOST] if isinstance(host, str) else None,
        "gflops": float(gflops)
        if isinstance(gflops, (int, float)) and not isinstance(gflops, bool)
        else None,
    }


def timing(values: Sequence[float]) -> tuple[float, int] | None:
    """A rank's (best seconds, repetitions) from its gathered tensor, None when it timed nothing."""
    best, reps = values
    if best != best or best < 0 or reps < 1:  # NaN: the rank was in no group this round
        return None
    return float(best), int(reps)


def parse_plan(value: object, world: int) -> list[list[tuple[int, int]]]:
    """Rank 0's re-measure plan, checked: rounds of pairs of distinct ranks in ``range(world)``."""
    if not isinstance(value, list):
        raise ExchangeError("the plan is not a list of rounds")
    plan: list[list[tuple[int, int]]] = []
    for pair_round in value:
        if not isinstance(pair_round, list):
            raise ExchangeError("a plan round is not a list of pairs")
        pairs: list[tuple[int, int]] = []
        for pair in pair_round:
            ok = isinstance(pair, list) and len(pair) == 2
            ok = ok and all(type(r) is int and 0 <= r < world for r in pair) and pair[0] != pair[1]
            if not ok:
                raise ExchangeError("a plan pair is not two distinct ranks")
            pairs.append((pair[0], pair[1]))
        plan.append(pairs)
    return plan


def _sync(device) -> None:  # type: ignore[no-untyped-def]
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device, n: int, reps: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    (a @ b).sum().item()
    _sync(device)
    started = time.perf_counter()
    for _ in range(reps):
        c = a @ b
    _sync(device)
    elapsed = time.perf_counter() - started
    del c
    return 2.0 * n**3 * reps / elapsed / 1e9


def main() -> int:
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    size_mb = float(os.environ.get("FLEETRUN_COLLECTIVE_MB", "64" if gpu else "8"))
    reps = max(1, int(float(os.environ.get("FLEETRUN_COLLECTIVE_REPS", "10" if gpu else "4"))))
    confirm_reps = max(2, int(float(os.environ.get("FLEETRUN_COLLECTIVE_CONFIRM_REPS", str(CONFIRM_REPS)))))

    def barrier() -> None:
        dist.barrier(device_ids=[local]) if gpu else dist.barrier()

    rounds = ring_rounds(world)
    # every rank creates every group, in the same order, member or not
    groups = [
        [(ranks, None if len(ranks) == world else dist.new_group(list(ranks))) for ranks in r] for r in rounds
    ]
    gflops = matmul_gflops(device, 4096 if gpu else 256, 20 if gpu else 5)
    tensor = torch.zeros(max(1, int(size_mb * 2**20 / 4)), device=device)
    small = torch.zeros(1024, device=device)
    nbytes = tensor.numel() * 4
    mine_info = {"host": socket.gethostname()[:MAX_HOST], "gflops": round(gflops, 3)}
    ranks_info = [
        rank_info(decode_json(b))
        for b in gather_bytes(dist, encode_json(mine_info, MAX_INFO_BYTES), MAX_INFO_BYTES, world, device)
    ]

    def run_round(round_groups, most: int, least: int, budget: float) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
        """One round's groups at once, each timed alone: ``least`` repetitions at least, ``most``
        at most, no more after ``least`` than fit in ``budget`` (the group's slowest first
        repetition decides, the same on every member); figures on rank 0 only."""
        mine = next(((ranks, pg) for ranks, pg in round_groups if rank in ranks), None)
        if mine is not None:
            dist.all_reduce(small, group=mine[1])  # warm-up: connections / communicator set up
            _sync(device)
        barrier()  # every group of the round starts together
        timed: tuple[float, int] | None = None
        if mine is not None:
            started = time.perf_counter()
            dist.all_reduce(tensor, group=mine[1])
            _sync(device)
            first = time.perf_counter() - started
            agreed = torch.tensor([first], dtype=torch.float64, device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=mine[1])
            fit = int(budget / max(float(agreed.item()), 1e-9))
            more = max(least - 1, min(most - 1, fit))
            best = first
            for _ in range(more):  # the fastest is the link's, the rest is noise
                started = time.perf_counter()
                dist.all_reduce(tensor, group=mine[1])
                _sync(device)
                best = min(best, time.perf_counter() - started)
            timed = (best, 1 + more)
        # each rank's (best seconds, repetitions) as numbers in a tensor; NaN: not in a group
        own = torch.tensor(
            timed if timed is not None else (float("nan"), 0.0), dtype=torch.float64, device=device
        )
        gathered = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(world)]
        dist.all_gather(gathered, own)
        seconds = [timing(t.tolist()) for t in gathered]
        figures: list[dict[str, object]] = []
        if rank == 0:
            for ranks, _pg in round_groups:
                taken = [t for r in ranks if (t := seconds[r]) is not None]
                slowest = max(t[0] for t in taken) if len(taken) == len(ranks) else None
                n = len(ranks)
                busbw = nbytes / slowest / 1e9 * 2 * (n - 1) / n if slowest and slowest > 0 else None
                figures.append(
                    {
                        "ranks": list(ranks),
                        "reps": taken[0][1] if taken else 0,
                        "seconds": None if slowest is None else round(slowest, 4),
                        "busbw_gbps": None if busbw is None else round(busbw, 4),
                    }
                )
        return figures

    result: dict[str, object] = {
        "version": VERSION,
        "backend": backend,
        "world": world,
        "bytes": nbytes,
        "reps": reps,
        "ranks": ranks_info,
    }

    def report() -> None:
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()

    done: list[list[dict[str, object]]] = []
    for round_groups in groups:
        figures = run_round(round_groups, reps, 1, BUDGET_S)
        if rank == 0:
            done.append(figures)
            result["rounds"] = done
            report()
    # the confirmation: rank 0 plans it from the figures it printed, every rank runs the plan
    planned: list[list[tuple[int, int]]] = []
    if rank == 0:
        pairs: dict[tuple[int, ...], float] = {}
        for figures in done[1:]:
            for f in figures:
                if isinstance(f["busbw_gbps"], float) and isinstance(f["ranks"], list):
                    pairs[tuple(f["ranks"])] = f["busbw_gbps"]
        suspects = suspected(list(range(world)), pairs)
        planned = remeasure_plan(list(range(world)), pairs)
        result["suspects"] = suspects
    sent = broadcast_bytes(
        dist, encode_json(planned, MAX_PLAN_BYTES) if rank == 0 else b"", MAX_PLAN_BYTES, device
    )
    plan = parse_plan(decode_json(sent), world)
    confirm: list[list[dict[str, object]]] = []
    for pair_round in plan:
        round_groups = [(tuple(p), dist.new_group(list(p))) for p in pair_round]
        figures = run_round(round_groups, confirm_reps, 2, CONFIRM_BUDGET_S)
        if rank == 0:
            confirm.append(figures)
            result["confirm"] = confirm
            report()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
