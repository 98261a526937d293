"""Readying a later attempt after a loss, once its machines are chosen (``attempts.adopt``): the
new machines prepared and the newest checkpoint copied onto the nodes that lack it, side by side.

Neither needs the other: the copy lists and moves checkpoints with the node's own python and
rsync (``launch.run.checkpoints``), never the synced code or the job's environment. In turn they
took 1.0-1.4 s and 1.0-1.6 s of every replaced node's recovery (issue 33's silent-node rows)
before the next attempt could start. The one order kept: a lab host that answered again may
still run the lost attempt, which is stopped there before anything lists or copies its
checkpoints (or syncs code over it).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import replace

from launch.errors import HostError
from launch.run import attempts, stages
from launch.run.state import RunContext, RunState

__all__ = ["prepare_new_nodes", "ready_next_attempt"]

LOST_ATTEMPT_GRACE_S = 5.0
"""The lost attempt's grace on a host that answered again (its peers are gone: nothing to save)."""


def stop_lost_attempt(ctx: RunContext, state: RunState, fresh: Collection[str]) -> None:
    """Stop the lost attempt on ``fresh`` (a fresh machine has nothing to stop); raises on failure."""
    new = [h for h in state.hosts if h.name in fresh]
    errors = attempts.stop_survivors(
        ctx.port, new, state.plan.run_id, LOST_ATTEMPT_GRACE_S, state.attempt - 1
    ).errors
    if errors:
        raise HostError(
            next(iter(errors)), f"could not stop the lost attempt there: {'; '.join(errors.values())}"
        )


def prepare_new_nodes(ctx: RunContext, state: RunState, fresh: Collection[str]) -> RunState:
    """Pull the container image to, sync and set up only the new nodes of a later attempt (the
    others have all three; their GPUs were checked before they were taken)."""
    new = [h for h in state.hosts if h.name in fresh]
    attempts.say(ctx, f"  attempt {state.attempt}: syncing and setting up {', '.join(sorted(fresh))} only")
    state = stages.pull_image(ctx, state, new)
    state = stages.sync(ctx, state, ctx.port.subset(fresh))
    return stages.setup(ctx, state, new)


def ready_next_attempt(ctx: RunContext, state: RunState, fresh: frozenset[str]) -> RunState:
    """The lost attempt stopped on the new machines, then their preparation beside the
    checkpoint copy (a thread); ``sync_setup`` and ``checkpoint_copy`` each timed on its own."""
    if not fresh:
        return attempts.spread_checkpoint(ctx, state.timed("sync_setup", 0.0))
    started = ctx.clock.monotonic()
    stop_lost_attempt(ctx, state, fresh)
    copied: list[RunState] = []
    before = state
    copy = threading.Thread(
        target=lambda: copied.append(attempts.spread_checkpoint(ctx, before)), name="fleetrun-checkpoint-copy"
    )
    copy.start()
    try:
        state = prepare_new_nodes(ctx, state, fresh).timed("sync_setup", ctx.clock.monotonic() - started)
    finally:
        copy.join()
    if not copied:  # the copy crashed in its thread: once more here, where a crash is reported
        return attempts.spread_checkpoint(ctx, state)
    spread = copied[0]
    return replace(state, resume_from=spread.resume_from, resume_record=spread.resume_record).timed(
        "checkpoint_copy", spread.recovery_timings.get("checkpoint_copy", 0.0)
    )
