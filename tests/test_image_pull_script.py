"""The node-side pull script (``launch.planning.image_pull``), run for real: Podman against a
registry started here (``tests/registrykit.py``), each Podman with storage of its own. The
script decides present / pulled, keeps credentials off the command line and out of the node's
files, and its failures classify as the runtime's real errors do."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from launch.planning.image_pull import (
    AUTH_DIR,
    DOCKER_HUB,
    NO_RUNTIME_EXIT,
    parse_progress,
    parse_pull_result,
    pull_command,
    pull_script,
    registry_of,
    sif_name,
)
from launch.planning.remote_layout import rundir
from launch.rules.image_pull import classify_pull_error
from tests.registrykit import LocalRegistry, have_registry, podman_env, tiny_image

needs_podman = pytest.mark.skipif(
    os.geteuid() != 0 or not have_registry(), reason="needs root, podman and docker-registry"
)


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io"),
        ("10.60.0.1:5000/lab/digits:1", "10.60.0.1:5000"),
        ("localhost/lab/digits", "localhost"),
        ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", DOCKER_HUB),
        ("ubuntu", DOCKER_HUB),
    ],
)
def test_registry_of(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def test_sif_name_is_one_safe_file_name() -> None:
    name = sif_name("nvcr.io/nvidia/pytorch:24.05-py3")
    assert name == "nvcr.io_nvidia_pytorch_24.05-py3.sif"
    assert "/" not in sif_name("a/../../etc/passwd")


def test_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="runtime 'rkt'"):
        pull_script("r/x:1", "rkt", "run-1", login=False)


def test_the_script_takes_the_auth_file_on_stdin() -> None:
    script = pull_script("nvcr.io/nvidia/pytorch:24.05-py3", "auto", "run-1", login=True)
    assert 'cat >"$auth/config.json"' in script
    assert '--authfile "$auth/config.json"' in script
    assert 'rm -rf "$auth"' in script  # the auth file goes on every way out


def test_an_apptainer_file_is_checked_not_pulled(tmp_path: Path) -> None:
    sif = tmp_path / "train.sif"
    script = pull_script(str(sif), "auto", "run-1", login=False)
    assert "pull" not in script.replace("FLEETRUN_PULL", "")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "apptainer").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    missing = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True)
    assert missing.returncode == 1
    assert classify_pull_error(missing.stderr).kind == "not_found"
    sif.write_bytes(b"SIF")
    there = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    assert parse_pull_result(there.stdout) == ("present", "apptainer")


def test_parse_pull_result() -> None:
    assert parse_pull_result("noise\nFLEETRUN_PULL=pulled podman\n") == ("pulled", "podman")
    assert parse_pull_result("FLEETRUN_PULL=present apptainer") == ("present", "apptainer")
    assert parse_pull_result("FLEETRUN_PULL=pulled rkt") is None
    assert parse_pull_result("") is None


def test_parse_progress_believes_digits_only() -> None:
    assert parse_progress("FLEETRUN_PULL_BYTES=1048576") == 1048576
    assert parse_progress("FLEETRUN_PULL_BYTES=0\n") == 0
    for line in (
        "FLEETRUN_PULL_BYTES=",
        "FLEETRUN_PULL_BYTES=-5",
        "FLEETRUN_PULL_BYTES=1e9",
        "FLEETRUN_PULL_BYTES=١٢٣",  # digits, not ASCII ones
        "FLEETRUN_PULL_BYTES=" + "9" * 40,
        "FLEETRUN_PULL=pulled podman",
        "noise FLEETRUN_PULL_BYTES=5",
    ):
        assert parse_progress(line) is None, line


FAKE_PODMAN = """#!/bin/sh
# a podman whose pull downloads a blob where podman does, then waits to be let go
case "$1" in
  image) exit 1 ;;
  pull)
    mkdir -p "$TMPDIR/storage4242"
    head -c 300000 /dev/zero >"$TMPDIR/storage4242/1"
    i=0
    while [ ! -e "$RELEASE" ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i + 1)); done
    rm -rf "$TMPDIR/storage4242"
    echo "Writing manifest to image destination"
    exit 0 ;;
esac
exit 2
"""


def test_a_podman_pull_reports_the_bytes_received_while_it_runs(tmp_path: Path) -> None:
    """The script's progress lines come while the pull runs (the fake pull ends only once one
    has come with its blob's size), and its result line last; the watcher goes with the script."""
    bindir, tmp, home = tmp_path / "bin", tmp_path / "tmp", tmp_path / "home"
    for folder in (bindir, tmp, home):
        folder.mkdir()
    (bindir / "podman").write_text(FAKE_PODMAN)
    (bindir / "podman").chmod(0o755)
    release = tmp_path / "release"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp), "RELEASE": str(release)}
    script = pull_script("r.example:5000/x:1", "podman", "run-1", login=False)
    proc = subprocess.Popen(pull_command(script), shell=True, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    seen: list[int] = []
    try:
        for raw in proc.stdout:
            size = parse_progress(raw.decode())
            if size is not None:
                seen.append(size)
                if size >= 300000:
                    release.touch()
            elif raw.startswith(b"FLEETRUN_PULL="):
                assert parse_pull_result(raw.decode()) == ("pulled", "podman")
                break
    finally:
        release.touch()
        assert proc.wait(timeout=300) == 0
    assert seen and max(seen) >= 300000, seen
    assert proc.stdout.read() == b"", "nothing after the result line: the watcher was stopped"


def run_script(
    script: str, home: Path, env: dict[str, str], stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        pull_command(script),
        shell=True,
        input=stdin,
        capture_output=True,
        env={**env, "HOME": str(home)},
        timeout=300,
    )


def test_no_runtime_is_its_own_exit(tmp_path: Path) -> None:
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path)}
    proc = subprocess.run(
        ["/bin/sh", "-c", pull_script("r/x:1", "auto", "run-1", login=False)], env=env, capture_output=True
    )
    assert proc.returncode == NO_RUNTIME_EXIT
    assert b"no container runtime on this node" in proc.stderr


@needs_podman
def test_pull_then_present_then_missing_tag_then_unreachable(tmp_path: Path) -> None:
    with LocalRegistry() as registry:
        env = podman_env(tmp_path / "podman", registry.location)
        image = f"{registry.location}/fleetrun/tiny:1"
        tiny_image(env, tmp_path / "img", image)
        home = tmp_path / "home"
        first = run_script(pull_script(image, "podman", "run-1", login=False), home, env)
        assert first.returncode == 0, first.stderr
        assert parse_pull_result(first.stdout.decode()) == ("pulled", "podman")
        again = run_script(pull_script(image, "auto", "run-2", login=False), home, env)
        assert parse_pull_result(again.stdout.decode()) == ("present", "podman")
        assert (home / rundir("run-1") / "image-pull.log").exists()

        missing = run_script(
            pull_script(f"{registry.location}/fleetrun/tiny:2", "podman", "run-3", login=False), home, env
        )
        assert missing.returncode != 0
        assert classify_pull_error(missing.stderr).kind == "not_found"
    gone = run_script(
        pull_script(f"{registry.location}/fleetrun/other:1", "podman", "run-4", login=False), home, env
    )
    assert gone.returncode != 0
    assert classify_pull_error(gone.stderr).kind == "network"


def auth_file(registry: str, user: str, secret: str) -> bytes:
    token = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": token}}}).encode()


@needs_podman
def test_private_registry_auth_file_on_stdin_leaves_nothing(tmp_path: Path) -> None:
    secret = "s3cr3t-pull-token-2f9c"
    with LocalRegistry(users={"lab": secret}) as registry:
        env = podman_env(tmp_path / "podman", registry.location)
        image = f"{registry.location}/lab/private:1"
        tiny_image(env, tmp_path / "img", image, creds=("lab", secret))
        home = tmp_path / "home"

        anonymous = run_script(pull_script(image, "podman", "run-1", login=False), home, env)
        assert classify_pull_error(anonymous.stderr).kind == "auth"

        wrong = auth_file(registry.location, "lab", "not-the-secret")
        refused = run_script(pull_script(image, "podman", "run-2", login=True), home, env, wrong)
        assert refused.returncode != 0
        assert classify_pull_error(refused.stderr).kind == "auth"

        script = pull_script(image, "podman", "run-3", login=True)
        assert secret not in pull_command(script)
        ok = run_script(script, home, env, auth_file(registry.location, "lab", secret))
        assert ok.returncode == 0, ok.stderr
        assert parse_pull_result(ok.stdout.decode()) == ("pulled", "podman")
        token = base64.b64encode(f"lab:{secret}".encode())
        for path in home.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes() and token not in path.read_bytes(), path
        assert not (home / rundir("run-3") / AUTH_DIR).exists()
