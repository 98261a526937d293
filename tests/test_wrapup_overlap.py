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
