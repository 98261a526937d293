"""``fab show`` says how the run's fleet ended (torn down, kept warm, skipped), from the run
folder's ``summary.json``, the same words the run's end printed; a summary a hook mangled is
never a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launch.reports.views import render_text, show_run
from launch.run.run_folder import read_teardown
from tests.fakefleet import run_on_fake_fleet


def test_a_finished_run_shows_its_fleets_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, teardown="always")
    teardown = read_teardown(run.folder)
    assert teardown is not None
    state, message = teardown
    assert (state, message) == (run.summary.teardown.state.value, run.summary.teardown.message)
    shown = render_text(show_run(run.records.get(run.summary.run_id), teardown=teardown), width=300)
    (line,) = [ln for ln in shown.splitlines() if ln.startswith("fleet ")]
    assert line.split(None, 1)[1].startswith(f"{state}: {message}"[:60]), shown


@pytest.mark.parametrize(
    "content",
    [
        "[" * 100_000,  # a nesting bomb
        json.dumps({"teardown": {"state": 1, "message": []}}),
        json.dumps({"teardown": "done"}),
        json.dumps([1, 2]),
        "not json",
    ],
)
def test_a_mangled_summary_shows_no_fleet_line(tmp_path: Path, content: str) -> None:
    (tmp_path / "summary.json").write_text(content)
    assert read_teardown(tmp_path) is None


def test_a_summary_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"teardown": {"state": "done", "message": "x"}}))
    folder = tmp_path / "run"
    folder.mkdir()
    os.symlink(elsewhere, folder / "summary.json")
    assert read_teardown(folder) is None


def test_markup_in_the_message_is_shown_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch)
    record = run.records.get(run.summary.run_id)
    shown = render_text(show_run(record, teardown=("skipped", "kept [/data/x] [bold]warm[/bold]")), width=300)
    assert "skipped: kept [/data/x] [bold]warm[/bold]" in shown
