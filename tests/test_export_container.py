"""``fab export`` with a playbook's ``container.image``: the pods run the image the fleet runs,
and ``--image`` is needed only without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launch.cli.export import export
from launch.errors import SpecError

REPO = Path(__file__).resolve().parents[1]
FLEET_IMAGE = "ghcr.io/lab/digits:7"


def playbook(tmp_path: Path, container: dict[str, str] | None) -> Path:
    data = yaml.safe_load((REPO / "playbooks" / "digits-ddp.yaml").read_text())
    data["workdir"] = str(REPO / "examples" / "digits")
    if container is not None:
        data["container"] = container
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def pod_images(path: Path) -> set[str]:
    manifest = yaml.safe_load(path.read_text())
    replicas = manifest["spec"]["pytorchReplicaSpecs"].values()
    return {c["image"] for r in replicas for c in r["template"]["spec"]["containers"]}


def test_the_pods_run_the_fleets_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    out = export(
        str(playbook(tmp_path, {"image": FLEET_IMAGE})),
        to="pytorchjob",
        output=str(tmp_path / "job.k8s.yaml"),
    )
    assert out is not None and pod_images(out) == {FLEET_IMAGE}
    said = capsys.readouterr().err
    assert f"image: {FLEET_IMAGE}, the playbook's container.image" in said
    assert f"-t {FLEET_IMAGE} ." in said  # how that image is made from images/docker/Dockerfile


def test_image_flag_still_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = export(
        str(playbook(tmp_path, {"image": FLEET_IMAGE})),
        to="pytorchjob",
        image="ghcr.io/lab/pods:1",
        output=str(tmp_path / "m.yaml"),
    )
    assert out is not None and pod_images(out) == {"ghcr.io/lab/pods:1"}


def test_without_container_the_image_flag_is_required(tmp_path: Path) -> None:
    with pytest.raises(
        SpecError,
        match="--image: the container image the pods run is required when the playbook has no container.image",
    ):
        export(str(playbook(tmp_path, None)), to="pytorchjob")
