"""Which file a playbook argument names: a path that exists always wins over a built-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.job.builtin import builtin_names, builtin_root, resolve_playbook
from launch.job.spec import load_job_spec

REPO = Path(__file__).resolve().parents[1]


def test_the_checkout_is_the_built_in_root_and_lists_every_playbook() -> None:
    assert builtin_root() == REPO
    assert builtin_names() == sorted(p.stem for p in (REPO / "playbooks").glob("*.yaml"))
    assert "digits-ddp" in builtin_names()


@pytest.mark.parametrize("given", ["digits-ddp", "digits-ddp.yaml", "playbooks/digits-ddp.yaml"])
def test_a_built_in_name_resolves_from_any_folder(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_playbook(given) == REPO / "playbooks" / "digits-ddp.yaml"
    assert load_job_spec(given).workdir == REPO / "examples" / "digits"


def test_an_existing_file_of_the_same_name_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "playbooks").mkdir()
    mine = tmp_path / "playbooks" / "digits-ddp.yaml"
    mine.write_text("name: mine\n")
    assert resolve_playbook("playbooks/digits-ddp.yaml") == Path("playbooks/digits-ddp.yaml")
    (tmp_path / "digits-ddp").write_text("name: mine\n")
    assert resolve_playbook("digits-ddp") == Path("digits-ddp")


@pytest.mark.parametrize(
    "given", ["nope", "playbooks/nope.yaml", "other/digits-ddp.yaml", "/abs/digits-ddp.yaml"]
)
def test_anything_else_is_left_as_given(given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_playbook(given) == Path(given)
