"""What a failed run's exit no longer waits for in turn (fake fleet, fake clock, no timed asserts).

``kill -9`` of a rank to ``fab train``'s exit: after the decision, the wrap-up stopped the run,
pulled, revoked the run's cluster key and then drew the loss plot, whose imports and first figure
took about a second idle and several loaded. The plot's imports now start at the job's first
step, and the revoke goes while the artifacts are pulled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import launch.run.watch as watch
import launch.run.wrapup as wrapup
from tests.fakefleet import FakeClock, FakeFleet, JobScript, NodeScript, run_on_fake_fleet


def test_the_plot_is_warmed_up_at_the_first_step_before_the_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_evaluate = watch.evaluate

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        decision = real_evaluate(*args, **kwargs)
        if decision is not None and "decided" not in events:
            events.append("decided")
        return decision

    monkeypatch.setattr(watch, "warm_up", lambda: events.append("warm-up"))
    monkeypatch.setattr(watch, "evaluate", evaluate)
    job = JobScript(steps=20, nodes={"n1": NodeScript(exit_at_step=4, exit_code=137)})
    done = run_on_fake_fleet(tmp_path, monkeypatch, job, clock=FakeClock())
    assert done.summary.outcome == "failed" and done.summary.rule == "rank_failed", done.summary.reason
    assert events[:2] == ["warm-up", "decided"], events
    assert (done.folder / "loss.png").exists()


def test_the_cluster_key_is_revoked_while_the_artifacts_are_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    revoked = threading.Event()
    seen: list[bool] = []
    real_pull = FakeFleet._pull

    def revoke(fleet: Any) -> dict[str, str]:
        revoked.set()
        return {}

    def pull(self: FakeFleet, *args: Any, **kwargs: Any) -> dict[str, str]:
        seen.append(revoked.wait(60))  # a deadline: before, the revoke came only after the pull
        return real_pull(self, *args, **kwargs)

    monkeypatch.setattr(wrapup, "revoke_cluster_keys", revoke)
    monkeypatch.setattr(FakeFleet, "_pull", pull)
    job = JobScript(steps=20, nodes={"n1": NodeScript(exit_at_step=4)})
    done = run_on_fake_fleet(tmp_path, monkeypatch, job, clock=FakeClock())
    assert done.summary.outcome == "failed"
    assert seen == [True], "the pull waited for the revoke, or the revoke for the pull"
    assert not done.summary.pull_errors


def test_a_replaced_nodes_sync_and_the_checkpoint_copy_go_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node lost in attempt 1 comes back (a lab host): the lost attempt is stopped there first,
    then its sync runs while the newest checkpoint is copied to it (before: one after the other)."""
    import launch.run.next_attempt as next_attempt
    from launch.run import recheck

    monkeypatch.setattr(recheck, "sshd_answers", lambda host, *_: host.name != "n1")
    copying = threading.Event()
    events: list[str] = []
    real_spread, real_sync, real_stop = (
        FakeFleet._spread,
        next_attempt.stages.sync,
        next_attempt.stop_lost_attempt,
    )

    def spread(self: FakeFleet, *args: Any, **kwargs: Any) -> Any:
        events.append("copy")
        copying.set()
        return real_spread(self, *args, **kwargs)

    def sync(*args: Any, **kwargs: Any) -> Any:
        if "stop lost attempt" in events:  # the first attempt's sync has nothing beside it
            events.append("sync sees the copy" if copying.wait(60) else "sync alone")
        return real_sync(*args, **kwargs)

    def stop_lost(*args: Any, **kwargs: Any) -> None:
        events.append("stop lost attempt")
        real_stop(*args, **kwargs)

    monkeypatch.setattr(FakeFleet, "_spread", spread)
    monkeypatch.setattr(next_attempt.stages, "sync", sync)
    monkeypatch.setattr(next_attempt, "stop_lost_attempt", stop_lost)
    job = JobScript(
        steps=12,
        checkpoint_every=2,
        nodes={"n1": NodeScript(unreachable_from_step=5, in_attempt=1, comes_back=True)},
    )
    run = run_on_fake_fleet(
        tmp_path,
        monkeypatch,
        job,
        clock=FakeClock(),
        recovery={"max_restarts": 2, "grace_s": 1, "confirm_s": 1},
        stop={"unreachable_timeout_s": 30},
    )
    assert run.summary.outcome == "succeeded", run.summary.reason
    assert events == ["stop lost attempt", "copy", "sync sees the copy"], events
    assert run.fleet.nodes["n1"].files["resume_from"].endswith("/step-10")


def test_the_survivors_of_a_failed_rank_get_the_short_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed rank is known the moment it dies, while its peers still wait on it in a
    collective where no save can be agreed: their stop gets ``PEER_GONE_GRACE_S``, not the 10 s
    of a normal stop (one real trial waited 7.3 s of it)."""
    job = JobScript(steps=20, nodes={"n1": NodeScript(exit_at_step=4, exit_code=137)})
    done = run_on_fake_fleet(tmp_path, monkeypatch, job, clock=FakeClock())
    assert done.summary.rule == "rank_failed", done.summary.reason
    stops = [c for c in done.fleet.nodes["n0"].commands if " stop " in c]
    assert stops and all(c.rstrip().endswith(f" {wrapup.PEER_GONE_GRACE_S}") for c in stops), stops
