"""Reading what ``container.credentials`` names: an environment variable or a file holding
USER:SECRET; every problem one line naming the field, never the secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.run.registry_login import read_login

SECRET = "nvapi-Qx7-secret-value"


def test_from_an_environment_variable() -> None:
    login = read_login("NGC_KEY", "nvcr.io", environ={"NGC_KEY": f"$oauthtoken:{SECRET}\n"})
    assert (login.username, login.secret, login.registry) == ("$oauthtoken", SECRET, "nvcr.io")
    assert login.stdin() == f"$oauthtoken\n{SECRET}".encode()
    assert SECRET not in repr(login)
    assert login.redact(f"echo {SECRET} back") == "echo [secret] back"


def test_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "registry.txt"
    path.write_text(f"lab:{SECRET}\n")
    login = read_login(str(path), "10.60.0.1:5000", environ={})
    assert (login.username, login.secret) == ("lab", SECRET)
    assert login.source == f"file {path}"


def test_unset_variable_names_the_field_and_playbook() -> None:
    with pytest.raises(SpecError) as caught:
        read_login("NGC_KEY", "nvcr.io", "job.yaml", environ={})
    assert str(caught.value) == (
        "job.yaml: field 'container.credentials': the environment variable NGC_KEY is not set on this machine"
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read .*nope.txt: No such file"):
        read_login(str(tmp_path / "nope.txt"), "r", environ={})


@pytest.mark.parametrize("text", [SECRET, f":{SECRET}", "lab:", f"lab:{SECRET}\nmore:lines"])
def test_not_user_colon_secret_is_refused_without_echoing_it(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        read_login("REG", "r", environ={"REG": text})
    assert SECRET not in str(caught.value)
    assert "USER:SECRET" in str(caught.value)
