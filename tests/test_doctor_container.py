"""``fab doctor`` with a playbook's ``container:``: the runtime (which one ``auto`` takes), the
GPU hook on GPU nodes, and whether the image is there or can be pulled. Verdicts from the fake
fleet's probe answers; the probe's own container facts run for real against Podman and a
registry started here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launch.rules.preflight import ERROR, OK, WARN, Job, judge
from launch.run.doctor import ContainerCheck, gather, probe_command, probe_source
from tests.fakefleet import FakeClock, FakeFleet, JobScript, NodeScript, fake_hosts, run_on_fake_fleet
from tests.registrykit import LocalRegistry, have_registry, podman_env, tiny_image

IMAGE = "10.60.0.1:5000/lab/digits:1"
CHECK = ContainerCheck("auto", IMAGE)


def verdicts(
    scripts: dict[str, NodeScript], gpus: int | None = None, check: ContainerCheck = CHECK
) -> dict[tuple[str, str], tuple[str, str]]:
    hosts = [h.model_copy(update={"gpus": gpus}) for h in fake_hosts(2)]
    fleet = FakeFleet(hosts, JobScript(nodes=scripts), FakeClock())
    observations = gather(fleet, hosts, "full", 29500, container=check)
    findings = judge(observations, Job(head=hosts[0].name, port=29500, full=True, **check.job_fields()))
    return {
        (v.node, v.check): (v.level, v.message)
        for v in findings.verdicts
        if v.check in ("container", "gpu-hook", "image")
    }


def facts(**fields: Any) -> NodeScript:
    base: dict[str, Any] = {
        "wanted": "auto",
        "found": ["podman"],
        "runtime": "podman",
        "version": "podman version 4.3.1",
    }
    return NodeScript(container_facts={**base, **fields})


def test_the_probe_is_asked_about_the_container_only_with_one() -> None:
    host = fake_hosts(1)[0]
    plain = probe_command(host, "full", host, 29500)
    asked = probe_command(host, "full", host, 29500, CHECK)
    assert IMAGE not in plain
    assert asked.endswith(f"auto {IMAGE} '~/.fleetrun/images/10.60.0.1_5000_lab_digits_1.sif'")


def test_an_apptainer_file_is_probed_as_itself() -> None:
    sif = "/shared/images/pt.sif"
    assert ContainerCheck("auto", sif).probe_args() == ["apptainer", sif, sif]


def test_runtime_auto_says_which_and_a_pullable_image_is_ok() -> None:
    found = verdicts({})
    assert found[("n0", "container")] == (OK, "podman version 4.3.1 (auto)")
    assert found[("n1", "image")] == (OK, f"{IMAGE} can be pulled (fab train pulls it)")
    assert ("n0", "gpu-hook") not in found  # no GPUs: no hook needed


def test_no_runtime_is_an_error_naming_what_was_looked_for() -> None:
    found = verdicts({"n1": facts(found=[], runtime=None, version=None)})
    assert found[("n1", "container")] == (
        ERROR,
        "no container runtime: podman, docker or apptainer not found on the node's PATH",
    )
    assert found[("n0", "container")][0] == OK


@pytest.mark.parametrize(
    ("fields", "level", "words"),
    [
        ({}, ERROR, "no GPU hook for podman: install the NVIDIA Container Toolkit"),
        ({"cdi_gpu": ["/etc/cdi/nvidia.yaml"]}, OK, "CDI spec /etc/cdi/nvidia.yaml names nvidia.com/gpu"),
        ({"nvidia_ctk": True}, WARN, "nvidia-ctk cdi generate"),
        (
            {"runtime": "docker", "found": ["docker"], "nvidia_container_cli": True},
            OK,
            "nvidia-container-cli",
        ),
        ({"runtime": "apptainer", "found": ["apptainer"]}, OK, "apptainer --nv"),
    ],
)
def test_gpu_hook_on_gpu_nodes(fields: dict[str, Any], level: str, words: str) -> None:
    found = verdicts({"n0": facts(**fields)}, gpus=8)
    got_level, message = found[("n0", "gpu-hook")]
    assert got_level == level and words in message


def test_image_present_and_image_not_found() -> None:
    error = "Error: reading manifest 1 in 10.60.0.1:5000/lab/digits: manifest unknown: manifest unknown"
    found = verdicts(
        {
            "n0": facts(image={"present": True, "pullable": None, "error": None}),
            "n1": facts(image={"present": False, "pullable": False, "error": error}),
        }
    )
    assert found[("n0", "image")] == (OK, f"{IMAGE} is on the node")
    level, message = found[("n1", "image")]
    assert level == ERROR and message.startswith(
        f"pulling {IMAGE} failed (not found): Error: reading manifest"
    )


def test_a_private_image_the_doctor_cannot_see_is_a_warning() -> None:
    error = "Error: reading manifest 1 in 10.60.0.1:5000/lab/digits: unauthorized: authentication required"
    scripts = {"n0": facts(image={"present": False, "pullable": False, "error": error})}
    level, message = verdicts(scripts, check=ContainerCheck("auto", IMAGE, login=True))[("n0", "image")]
    assert level == WARN and "fab train's pull does" in message
    assert verdicts(scripts)[("n0", "image")][0] == ERROR


def test_fab_train_refuses_a_node_without_a_runtime_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    none = NodeScript(container_facts={"wanted": "podman", "found": [], "runtime": None})
    run = run_on_fake_fleet(
        tmp_path, monkeypatch, JobScript(nodes={"n1": none}), container={"image": IMAGE, "runtime": "podman"}
    )
    assert (run.summary.rule, run.summary.failed_nodes) == ("preflight_failed", ("n1",))
    assert "no container runtime: podman not found" in run.summary.reason
    assert not any(node.pull_inputs for node in run.fleet.nodes.values())


@pytest.mark.skipif(os.geteuid() != 0 or not have_registry(), reason="needs root, podman and docker-registry")
def test_the_probe_reads_a_real_podman_and_registry(tmp_path: Path) -> None:
    with LocalRegistry() as registry:
        env = podman_env(tmp_path / "podman", registry.location)
        image = f"{registry.location}/fleetrun/tiny:1"
        tiny_image(env, tmp_path / "img", image)

        def probe(ref: str) -> dict[str, Any]:
            args = ["full", "127.0.0.1", "0", "0", ".fleetrun/lib", *ContainerCheck("auto", ref).probe_args()]
            proc = subprocess.run(
                [sys.executable, "-", *args],
                input=probe_source(),
                capture_output=True,
                env={**env, "HOME": str(tmp_path)},
                timeout=120,
            )
            return json.loads(proc.stdout.decode().splitlines()[-1])["container"]

        pullable = probe(image)
        assert pullable["runtime"] == "podman" and "podman" in pullable["found"]
        assert pullable["image"] == {"present": False, "pullable": True, "error": None}
        missing = probe(f"{registry.location}/fleetrun/tiny:2")["image"]
        assert missing["pullable"] is False and "manifest unknown" in missing["error"]
        subprocess.run(["podman", "pull", "-q", image], env=env, check=True, capture_output=True)
        assert probe(image)["image"]["present"] is True
