"""Reading what ``container.credentials`` names (an environment variable holding USER:TOKEN, or
a docker/podman auth file) into the one-registry auth file the nodes get; every problem is one
line naming the field, never the secret."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.job.container import RegistryCredentials
from launch.run.registry_login import read_login

SECRET = "nvapi-Qx7-secret-value"


def auths(login_bytes: bytes) -> dict[str, str]:
    return {k: base64.b64decode(v["auth"]).decode() for k, v in json.loads(login_bytes)["auths"].items()}


def test_from_an_environment_variable() -> None:
    login = read_login(
        RegistryCredentials(env="LAB_KEY"), "10.60.0.1:5000", environ={"LAB_KEY": f"lab:{SECRET}\n"}
    )
    assert (login.username, login.secret) == ("lab", SECRET)
    assert auths(login.auth_file()) == {"10.60.0.1:5000": f"lab:{SECRET}"}
    assert SECRET not in repr(login)
    token = base64.b64encode(f"lab:{SECRET}".encode()).decode()
    assert login.redact(f"echo {SECRET} and {token}") == "echo [secret] and [secret]"


def test_ngc_takes_the_api_key_alone() -> None:
    login = read_login(RegistryCredentials(env="NGC_API_KEY"), "nvcr.io", environ={"NGC_API_KEY": SECRET})
    assert auths(login.auth_file()) == {"nvcr.io": f"$oauthtoken:{SECRET}"}


def test_a_token_alone_elsewhere_is_refused_without_echoing_it() -> None:
    with pytest.raises(SpecError) as caught:
        read_login(RegistryCredentials(env="KEY"), "ghcr.io", "job.yaml", environ={"KEY": SECRET})
    assert SECRET not in str(caught.value)
    assert str(caught.value).startswith(
        "job.yaml: field 'container.credentials': the environment variable KEY"
    )


def test_unset_variable_names_the_field_and_playbook() -> None:
    with pytest.raises(SpecError) as caught:
        read_login(RegistryCredentials(env="NGC_KEY"), "nvcr.io", "job.yaml", environ={})
    assert str(caught.value) == (
        "job.yaml: field 'container.credentials': the environment variable NGC_KEY is not set on this machine"
    )


def test_from_an_auth_file_only_this_registrys_login_is_sent(tmp_path: Path) -> None:
    other = base64.b64encode(b"me:other-registry-secret").decode()
    mine = base64.b64encode(f"lab:{SECRET}".encode()).decode()
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": {"ghcr.io": {"auth": other}, "10.60.0.1:5000": {"auth": mine}}}))
    login = read_login(RegistryCredentials(file=str(path)), "10.60.0.1:5000", environ={})
    sent = login.auth_file()
    assert auths(sent) == {"10.60.0.1:5000": f"lab:{SECRET}"}
    assert b"other-registry-secret" not in base64.b64decode(
        json.loads(sent)["auths"]["10.60.0.1:5000"]["auth"]
    )
    assert other.encode() not in sent


def test_docker_hub_under_dockers_own_key(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    token = base64.b64encode(f"me:{SECRET}".encode()).decode()
    path.write_text(json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": token}}}))
    login = read_login(RegistryCredentials(file=str(path)), "docker.io", environ={})
    assert set(auths(login.auth_file())) == {"docker.io", "https://index.docker.io/v1/"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not an auth file"),
        (json.dumps({"credsStore": "desktop", "auths": {"r.example": {}}}), "holds no login for r.example"),
        (json.dumps({"auths": {"r.example": {"auth": "%%%"}}}), "is not base64 of USER:TOKEN"),
    ],
)
def test_bad_auth_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "auth.json"
    path.write_text(content)
    with pytest.raises(SpecError, match=message):
        read_login(RegistryCredentials(file=str(path)), "r.example", environ={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read .*nope.json: No such file"):
        read_login(RegistryCredentials(file=str(tmp_path / "nope.json")), "r", environ={})


def test_fab_train_reads_the_login_before_touching_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from launch.job.spec import load_job_spec
    from launch.run.opening import check_registry_login

    (tmp_path / "work").mkdir()
    playbook = tmp_path / "job.yaml"
    container = {"image": "ghcr.io/lab/digits:1", "credentials": "$LAB_LOGIN_UNSET"}
    playbook.write_text(
        yaml.safe_dump({"name": "j", "workdir": "work", "entrypoint": "python t.py", "container": container})
    )
    monkeypatch.delenv("LAB_LOGIN_UNSET", raising=False)
    with pytest.raises(
        SpecError,
        match=r"job.yaml: field 'container.credentials': the environment variable LAB_LOGIN_UNSET is not set",
    ):
        check_registry_login(load_job_spec(playbook), playbook)
    monkeypatch.setenv("LAB_LOGIN_UNSET", f"me:{SECRET}")
    check_registry_login(load_job_spec(playbook), playbook)
