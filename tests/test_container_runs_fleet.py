"""Runs inside a container image on a real 3-node local fleet (``LocalFleet.up(containers=True)``):
each node user's own rootless podman (Debian's package, unmodified) starts the ranks in the test
image (``launch.fleets.local.container_image``: the fleet's Python and torch as an image in the
machine's shared store), with the host's network and IPC, fleetrun's folders mounted at the same paths.

One fleet for the module, its tests in order: the digits example trained across the 3 nodes
in the image with the loss of the same run in the virtualenv, with torchrun and with Horovod
(horovodrun in the head's container, a container per rank on the workers); a rank killed inside its container
(the run failed, the others stopped, no container left); a pull failure on one node (named,
nothing started anywhere); a worker lost with ``recovery:`` (the run resumes in containers on
the replacement node); and last, the laptop gone (the nodes' watchdogs stop the containers and
power the nodes off). Every wait is for an event, bounded only so a broken run fails.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.fleets.local import LocalFleet
from launch.fleets.local.container_image import VENV_PATH, ensure_container_image
from launch.run.summary import RunResult
from tests.conftest import REPO, fleet_prefix, fleet_subnet, module_fleet, needs_root, write_playbook
from tests.containerkit import containers_on, node_podman
from tests.faultkit import first_worker, run_with_fault, wait_for, worker_pids
from tests.recovery_helpers import attempts_of, run_dirs, step_reached

pytestmark = needs_root()
PREFIX = fleet_prefix("o")
NODES = 3
JOB = REPO / "tests" / "recovery_job"


@pytest.fixture(scope="module")
def fleet(fleetrun_home: Path) -> Iterator[LocalFleet]:
    with module_fleet(PREFIX, fleet_subnet(21), NODES, containers=True) as local:
        yield local


@pytest.fixture(scope="module")
def image(fleet: LocalFleet) -> str:
    """The test image, built into the shared store once (after the fleet's Python image it holds)."""
    return ensure_container_image()


def in_image(image: str) -> dict[str, object]:
    return {"image": image, "runtime": "podman"}


def losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, filter(None, lines)) if "loss" in record]


def node_run_dir(fleet: LocalFleet, i: int, run_id: str) -> Path:
    return Path(f"/home/{fleet.node_name(i)}/.fleetrun/runs/{run_id}")


def no_containers_left(fleet: LocalFleet) -> None:
    left = {fleet.node_name(i): containers_on(fleet, i) for i in range(NODES)}
    assert not any(left.values()), f"containers left on the nodes: {left}"


def no_ranks_left(fleet: LocalFleet, marker: str) -> bool:
    return not any(
        subprocess.run(["pgrep", "-u", fleet.node_name(i), "-f", marker], capture_output=True).stdout.strip()
        for i in range(NODES)
    )


def test_the_node_users_podman_sees_the_image_of_the_shared_store(fleet: LocalFleet, image: str) -> None:
    for i in range(NODES):
        found = node_podman(fleet, i, "image", "exists", image)
        assert found.returncode == 0, found.stderr[-1000:]


def test_digits_trains_across_three_nodes_in_the_image_with_the_loss_of_the_virtualenv(
    fleet: LocalFleet, image: str, digits_workdir: Path, tmp_path: Path
) -> None:
    results: dict[str, RunResult] = {}
    for name, container in (("venv", None), ("image", in_image(image))):
        fields: dict[str, object] = {
            "name": f"t-ctr-{name}",
            "entrypoint": "python -m trainer.task --epochs 2",
        }
        if container is not None:
            fields["container"] = container
        playbook = write_playbook(tmp_path / f"{name}.yaml", digits_workdir, **fields)
        results[name] = run_with_fault(playbook, fleet, None)
        assert results[name].outcome == "succeeded", results[name].reason
    inside = results["image"]
    for i in range(NODES):
        node = fleet.node_name(i)
        assert "podman run" in (inside.folder / "nodes" / node / "launch.sh").read_text()
        runtime = node_run_dir(fleet, i, inside.run_id) / "container_runtime"
        assert runtime.read_text().strip() == "podman", f"{node}: the ranks ran through podman"
        assert (inside.folder / "nodes" / node / "rc").read_text().strip() == "0"
    assert inside.world is not None and inside.world["world_size"] == 3
    assert {r["host"] for r in inside.world["ranks"]} == {fleet.node_name(i) for i in range(NODES)}
    venv, image_losses = losses(results["venv"].folder), losses(inside.folder)
    assert len(venv) >= 10 and len(image_losses) == len(venv), (len(venv), len(image_losses))
    for step, (a, b) in enumerate(zip(venv, image_losses, strict=True)):
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: {a} (virtualenv) vs {b} (image)"
    no_containers_left(fleet)


def test_horovod_trains_across_three_nodes_in_the_image_with_the_loss_of_the_virtualenv(
    fleet: LocalFleet, image: str, digits_workdir: Path, tmp_path: Path
) -> None:
    """horovodrun in the head's container SSHes (pinned, through the cluster wrapper) to the
    workers, where each rank's own container starts; the image's Horovod trains the digits MLP
    with the loss of the same horovod run in the virtualenv, and no container is left."""
    results: dict[str, RunResult] = {}
    for name, container in (("venv", None), ("image", in_image(image))):
        fields: dict[str, object] = {
            "name": f"t-ctr-hvd-{name}",
            "launcher": "horovod",
            "entrypoint": "python -m trainer.task_horovod --epochs 2",
        }
        if container is not None:
            fields["container"] = container
        playbook = write_playbook(tmp_path / f"hvd-{name}.yaml", digits_workdir, **fields)
        results[name] = run_with_fault(playbook, fleet, None)
        assert results[name].outcome == "succeeded", results[name].reason
    inside = results["image"]
    head = inside.folder / "nodes" / fleet.node_name(0) / "launch.sh"
    assert "podman run" in head.read_text() and "horovod.runner.launch" in head.read_text()
    for i in range(NODES):
        runtime = node_run_dir(fleet, i, inside.run_id) / "container_runtime"
        assert runtime.read_text().strip() == "podman", f"{fleet.node_name(i)}: the ranks ran through podman"
    assert inside.world is not None and inside.world["world_size"] == 3
    assert inside.world["backend"] == "horovod-gloo"
    ranks = sorted(inside.world["ranks"], key=lambda r: r["rank"])
    assert [r["host"] for r in ranks] == [fleet.node_name(i) for i in range(NODES)]
    assert {r["python"] for r in ranks} == {f"{VENV_PATH}/python"}, "the image's Python, not a job venv"
    venv, image_losses = losses(results["venv"].folder), losses(inside.folder)
    assert len(venv) >= 10 and len(image_losses) == len(venv), (len(venv), len(image_losses))
    for step, (a, b) in enumerate(zip(venv, image_losses, strict=True)):
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: {a} (virtualenv) vs {b} (image)"
    no_containers_left(fleet)


def test_a_rank_killed_in_its_container_fails_the_run_and_no_container_is_left(
    fleet: LocalFleet, image: str, digits_workdir: Path, tmp_path: Path
) -> None:
    victim = fleet.node_name(1)
    playbook = write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-ctr-kill",
        entrypoint="python -m trainer.task --epochs 200 --step-sleep 0.05",
        container=in_image(image),
    )

    old = run_dirs(fleet)

    def kill_a_rank() -> None:  # the fault waits for any metrics: the module's earlier runs have some
        wait_for(lambda: step_reached(fleet, 2, old), 300, "this run's step 2")
        pid = first_worker(victim)
        # the rank's root is the image's: podman's marker file is there, not on this machine
        assert Path(f"/proc/{pid}/root/run/.containerenv").exists(), "the rank runs inside the image"
        os.kill(pid, signal.SIGKILL)

    result = run_with_fault(playbook, fleet, kill_a_rank)
    assert result.outcome == "failed" and result.rule == "rank_failed", result.reason
    assert result.failed_nodes[0] == victim, result.reason
    wait_for(lambda: no_ranks_left(fleet, "trainer.task"), 60, "the other ranks to be stopped")
    no_containers_left(fleet)


def test_a_pull_failure_on_one_node_is_named_and_nothing_starts(
    fleet: LocalFleet, image: str, digits_workdir: Path, tmp_path: Path
) -> None:
    """An image that nodes 0 and 1 have (imported into their users' own stores) and node 2 does
    not, and no registry can give it: node 2's pull fails, the run names it, and nothing is
    synced or started on any node."""
    only_two = "localhost/fleetrun-only-two:1"
    content = tmp_path / "content"
    content.mkdir()
    (content / "hello").write_text("a layer of one file\n")
    for i in (0, 1):
        rootfs = Path(f"/home/{fleet.node_name(i)}/rootfs.tar")
        subprocess.run(["tar", "-cf", str(rootfs), "-C", str(content), "hello"], check=True)
        rootfs.chmod(0o644)
        done = node_podman(fleet, i, "import", str(rootfs), only_two)
        rootfs.unlink()
        assert done.returncode == 0, done.stderr[-1000:]
    try:
        playbook = write_playbook(
            tmp_path / "job.yaml",
            digits_workdir,
            name="t-ctr-pull",
            entrypoint="python -m trainer.task --epochs 2",
            container=in_image(only_two),
        )
        result = run_with_fault(playbook, fleet, None)
    finally:
        for i in (0, 1):
            node_podman(fleet, i, "rmi", only_two)
    node2 = fleet.node_name(2)
    assert (result.outcome, result.rule, result.failed_nodes) == ("failed", "pull_failed", (node2,))
    assert result.reason.startswith(f"pull failed on {node2}: {node2}: pulling {only_two} failed ("), (
        result.reason
    )
    for i in range(NODES):
        run_dir = node_run_dir(fleet, i, result.run_id)
        assert not (run_dir / "launch.sh").exists() and not (run_dir / "container_runtime").exists()
        assert not Path(f"/home/{fleet.node_name(i)}/.fleetrun/work/t-ctr-pull").exists(), "nothing synced"
    no_containers_left(fleet)


def test_a_worker_lost_with_recovery_resumes_in_containers_on_the_replacement(
    fleet: LocalFleet, image: str, tmp_path: Path
) -> None:
    every = 5
    playbook = write_playbook(
        tmp_path / "job.yaml",
        JOB,
        name="t-ctr-recover",
        entrypoint=f"python ckpt_trainer.py --steps 30 --ckpt-every {every} --step-sleep 0.25",
        recovery={"max_restarts": 2, "grace_s": 2, "confirm_s": 2},
        stop={"unreachable_timeout_s": 6, "watcher_lost_after_s": 300},
        container=in_image(image),
    )
    old = run_dirs(fleet)
    old_key = fleet.inventory().hosts[2].host_key

    def power_off_node2() -> None:
        wait_for(lambda: step_reached(fleet, 2 * every + 2, old), 300, f"step {2 * every + 2}")
        fleet.stop_node(2)

    result = run_with_fault(playbook, fleet, power_off_node2)
    assert result.outcome == "succeeded", result.reason
    attempts = attempts_of(result)
    node2 = fleet.node_name(2)
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["loss"] == "node_lost" and attempts[0]["replaced"] == [node2], attempts[0]
    assert attempts[1]["first_step"] > every, "the second attempt resumed from a checkpoint, not from 0"
    assert fleet.inventory().hosts[2].host_key != old_key, "node 2 is a fresh machine"
    # the replacement's home was emptied: any run folder there is the second attempt's
    (on_replacement,) = Path(f"/home/{node2}/.fleetrun/runs").glob("*/container_runtime")
    assert on_replacement.read_text().strip() == "podman", "the resumed ranks ran in the image"
    no_containers_left(fleet)


def test_with_the_laptop_gone_the_watchdogs_stop_the_containers(
    fleet: LocalFleet, image: str, fleetrun_home: Path, digits_workdir: Path, tmp_path: Path
) -> None:
    """``fab train`` SIGKILLed once training began, then rank 0 hangs (SIGSTOP, inside its
    container): nobody but the nodes' watchdogs is left to act. Node 0's stops its container for
    the stall; the others end when their ranks lose rank 0 (``completed``) or when node 0 powers
    off (``peer_lost``); every node powers itself off with no container left. Last in the
    module: it leaves the nodes off."""
    playbook = write_playbook(
        tmp_path / "job.yaml",
        digits_workdir,
        name="t-ctr-gone",
        entrypoint="python -m trainer.task --epochs 200 --step-sleep 0.05",
        stop={"watcher_lost_after_s": 5, "stall_timeout_s": 10, "unreachable_timeout_s": 10},
        container=in_image(image),
    )
    old = run_dirs(fleet)
    fab = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "fab"), "train", str(playbook), "--inventory", f"local:{fleet.prefix}"],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: step_reached(fleet, 2, old), 300, "this run's step 2")
        assert all(containers_on(fleet, i) for i in range(NODES)), "the ranks run in containers"
    finally:
        fab.kill()
        fab.wait()
    for pid in worker_pids(fleet.node_name(0)):
        os.kill(pid, signal.SIGSTOP)
    for i in range(NODES):
        wait_for(lambda i=i: fleet.powered_off(i), 300, f"node {i} to power itself off")
    (run_id,) = {p.name for p in run_dirs(fleet) - old}
    rules = []
    for i in range(NODES):
        outcome = json.loads((node_run_dir(fleet, i, run_id) / "guard-outcome.json").read_text())
        assert outcome["stopped"]["remaining"] == 0, outcome
        rules.append(outcome["rule"])
    assert rules[0] == "stalled" and set(rules[1:]) <= {"peer_lost", "completed"}, rules
    assert no_ranks_left(fleet, "trainer.task")
    no_containers_left(fleet)
