"""The fleet's word on which nodes it took (``launch.run.site_lost``), asked beside the polls:
never waited for, every answer filtered to the nodes asked about and escaped, a failing question
said once and never raised into the watcher."""

from __future__ import annotations

import threading
from concurrent.futures import wait

from launch.errors import FleetrunError
from launch.run.site_lost import SiteLost


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settle(site: SiteLost, names: list[str]) -> str:
    """Refresh until the question in flight has been taken in (the ask runs on its own thread)."""
    pending = site._pending  # noqa: SLF001 - the test waits for the thread, never for a time
    if pending is not None:
        wait([pending])
    return site.refresh(names)


def test_the_answer_is_taken_in_at_the_next_refresh_filtered_and_escaped() -> None:
    clock = Clock()
    asked: list[list[str]] = []

    def ask(names: list[str]) -> dict[str, str]:
        asked.append(names)
        return {"gpu2": "down\x1b[31m", "gpu9": "drained"}  # gpu9: never asked about

    site = SiteLost(ask, every_s=5.0, monotonic=clock)
    assert site.refresh(["gpu1", "gpu2"]) == "" and site.lost == {}, "asked, not waited for"
    settle(site, ["gpu1", "gpu2"])
    assert set(site.lost) == {"gpu2"} and "\x1b" not in site.lost["gpu2"]
    assert asked == [["gpu1", "gpu2"]], "not asked again before every_s"
    assert settle(site, ["gpu1", "gpu2"]) == "" and len(asked) == 1, "not asked again before every_s"
    clock.now = 5.0
    site.refresh(["gpu1"])
    settle(site, ["gpu1"])
    assert len(asked) == 2 and site.lost == {}, "gpu2 no longer asked about: no longer named"
    site.close()


def test_a_hung_question_never_blocks_a_refresh() -> None:
    release = threading.Event()
    site = SiteLost(lambda names: {} if release.wait(30) else {}, every_s=0.0)
    site.refresh(["gpu1"])
    assert site.refresh(["gpu1"]) == "" and site.lost == {}, "the poll goes on while the login host hangs"
    release.set()
    site.close()


def test_a_failing_question_is_said_once_and_clears_nothing_it_did_not_know() -> None:
    clock = Clock()
    calls = 0

    def ask(names: list[str]) -> dict[str, str]:
        nonlocal calls
        calls += 1
        raise FleetrunError("ssh: login host unreachable")

    site = SiteLost(ask, every_s=1.0, monotonic=clock)
    site.refresh(["gpu1"])
    first = settle(site, ["gpu1"])
    assert first.startswith("  could not ask the fleet") and "login host unreachable" in first
    clock.now = 2.0
    site.refresh(["gpu1"])
    assert settle(site, ["gpu1"]) == "", "the same failure is said once"
    assert calls == 2 and site.lost == {}
    site.close()
