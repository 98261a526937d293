"""The playbook's ``container:`` section: an image a registry takes, flags that keep what the run
needs, credentials only by name; every refusal names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.job.container import RegistryCredentials
from launch.job.spec import load_job_spec

GOOD = """
name: demo
workdir: code
entrypoint: python -m trainer.task --epochs 3
nodes: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_a_container_section_loads_with_its_defaults(tmp_path: Path) -> None:
    spec = load_job_spec(write(tmp_path, GOOD + "container:\n  image: ghcr.io/lab/train:1\n"))
    assert spec.container is not None
    assert spec.container.image == "ghcr.io/lab/train:1"
    assert spec.container.runtime == "auto"
    assert spec.container.options == []
    assert spec.container.credentials is None
    assert load_job_spec(write(tmp_path, GOOD)).container is None


def test_the_full_container_section(tmp_path: Path) -> None:
    text = GOOD + (
        "container:\n  image: nvcr.io/nvidia/pytorch:24.05-py3\n  runtime: podman\n"
        "  options: ['--device', '/dev/infiniband', '--cap-add=IPC_LOCK']\n  shm_size: 16g\n"
        "  credentials: $NGC_API_KEY\n"
    )
    container = load_job_spec(write(tmp_path, text)).container
    assert container is not None
    assert container.options == ["--device", "/dev/infiniband", "--cap-add=IPC_LOCK"]
    assert container.shm_size == "16g"
    assert container.credentials == RegistryCredentials(env="NGC_API_KEY")


def test_credentials_short_forms_and_mapping(tmp_path: Path) -> None:
    file_form = GOOD + "container:\n  image: lab/train:1\n  credentials: ~/.docker/config.json\n"
    container = load_job_spec(write(tmp_path, file_form)).container
    assert container is not None and container.credentials == RegistryCredentials(
        file="~/.docker/config.json"
    )
    mapping = GOOD + "container:\n  image: lab/train:1\n  credentials: {env: GHCR_TOKEN}\n"
    container = load_job_spec(write(tmp_path, mapping)).container
    assert container is not None and container.credentials == RegistryCredentials(env="GHCR_TOKEN")


def test_an_apptainer_image_file_on_the_nodes(tmp_path: Path) -> None:
    text = GOOD + "container:\n  image: /shared/images/train.sif\n  runtime: apptainer\n"
    container = load_job_spec(write(tmp_path, text)).container
    assert container is not None and container.image == "/shared/images/train.sif"


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("  image: ghcr.io/Lab/Train:1\n", "field 'container.image': the repository path must be lowercase"),
        ("  image: lab/train@sha256:abc\n", "field 'container.image': a sha256 digest is 64"),
        ("  image: lab/train:1\n  runtime: lxc\n", "field 'container.runtime'"),
        (
            "  image: lab/train:1\n  options: ['--network=bridge']\n",
            "--network is not allowed: fleetrun runs",
        ),
        ("  image: lab/train:1\n  options: ['--net', 'none']\n", "--net is not allowed"),
        ("  image: lab/train:1\n  options: ['--name', 'x']\n", "--name is not allowed"),
        ("  image: lab/train:1\n  options: ['-dit']\n", "-d is not allowed"),
        ("  image: lab/train:1\n  options: ['-eTOKEN=x']\n", "-e is not allowed"),
        ("  image: lab/train:1\n  options: ['--ipc=private']\n", "--ipc is not allowed"),
        ("  image: lab/train:1\n  options: ['--containall']\n", "--containall is not allowed"),
        (
            '  image: lab/train:1\n  options: ["--device=/dev/x\\n--network=none"]\n',
            "item 0: one argument on one line",
        ),
        ("  image: lab/train:1\n  options: ['/dev/x']\n", "item 0: '/dev/x' is not a flag"),
        ("  image: lab/train:1\n  shm_size: lots\n", "field 'container.shm_size': expected a size"),
        ("  image: lab/train:1\n  credentials: {env: A, file: b}\n", "give exactly one of env"),
        ("  image: lab/train:1\n  credentials: {env: 'A B'}\n", "expected an environment variable name"),
        ("  image: lab/train:1\n  password: x\n", "field 'container.password': unknown field"),
    ],
)
def test_a_broken_container_section_names_the_file_and_field(
    tmp_path: Path, section: str, expected: str
) -> None:
    path = write(tmp_path, GOOD + "container:\n" + section)
    with pytest.raises(SpecError) as info:
        load_job_spec(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)
