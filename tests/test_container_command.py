"""The command that runs a node's ranks inside the image (``launch.planning.container``): the exact
argv each runtime receives, read by running the launch script's lines under ``sh`` with a recorder
standing in for the runtime on ``PATH`` (so the shell's quoting and expansion are part of what is
checked), and the launch script a ``container:`` playbook gets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launch.cli.app import make_plan
from launch.errors import SpecError
from launch.job.container import ContainerSpec
from launch.job.spec import JobSpec, load_job_spec
from launch.planning.container import ContainerRun, launch_lines
from tests.conftest import sample_inventory

RECORDER = '#!/bin/sh\nfor word in "$0" "$@"; do printf "%s\\n" "$word"; done > "$RECORD"\n'


def run_lines(
    tmp_path: Path, lines: list[str], runtimes: tuple[str, ...], gpus: int = 0
) -> tuple[int, list[str]]:
    """Run ``lines`` with recorders for ``runtimes`` as the only runtimes on PATH; the argv one received."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in runtimes:
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    for tool in ("id",):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    record = tmp_path / "argv"
    record.unlink(missing_ok=True)
    env = {
        "PATH": str(bin_dir),
        "HOME": "/home/u",
        "RECORD": str(record),
        "FLEETRUN_RUN_DIR": str(run_dir),
        "FLEETRUN_ATTEMPT": "2",
        "FLEETRUN_NODE_GPUS": str(gpus),
    }
    done = subprocess.run(
        ["/bin/sh", "-c", "\n".join(lines)], env=env, capture_output=True, text=True, check=False
    )
    argv = record.read_text().splitlines() if record.exists() else []
    if argv:
        argv[0] = os.path.basename(argv[0])
    return done.returncode, argv if argv else [done.stderr.strip()]


def container_run(runtime: str = "auto", **spec: object) -> ContainerRun:
    return ContainerRun(
        run_id="job-1",
        node_rank=1,
        spec=ContainerSpec.model_validate({"image": "ghcr.io/lab/train:1", "runtime": runtime, **spec}),
        env_names=("FLEETRUN_RUN_ID", "TF_CONFIG"),
        mounts=("$HOME/.fleetrun/lib", "/data/x"),
        workdir="$HOME/.fleetrun/work/job",
        command='python -m torch.distributed.run --rdzv-endpoint=10.0.0.1:"$MASTER_PORT" -m train',
    )


INSIDE = ["sh", "-c", 'python -m torch.distributed.run --rdzv-endpoint=10.0.0.1:"$MASTER_PORT" -m train']
MOUNTS = ["/home/u/.fleetrun/lib:/home/u/.fleetrun/lib", "/data/x:/data/x"]


def test_podman_argv(tmp_path: Path) -> None:
    rc, argv = run_lines(
        tmp_path, launch_lines(container_run("podman", options=["--cap-add=IPC_LOCK"])), ("podman",)
    )
    assert rc == 0
    assert argv == [
        "podman", "run", "--rm", "--init", "--pull", "never", "--name", "fleetrun-job-1-n1-a2",
        "--label", "fleetrun.run=job-1", "--network", "host", "--uts", "host", "--ipc", "host",
        "--volume", MOUNTS[0], "--volume", MOUNTS[1], "--workdir", "/home/u/.fleetrun/work/job",
        "--env", "FLEETRUN_RUN_ID", "--env", "TF_CONFIG", "--cap-add=IPC_LOCK", "ghcr.io/lab/train:1", *INSIDE,
    ]  # fmt: skip
    assert (tmp_path / "run" / "container_runtime").read_text() == "podman\n"


def test_podman_with_gpus_uses_cdi_and_a_sized_shm(tmp_path: Path) -> None:
    rc, argv = run_lines(tmp_path, launch_lines(container_run("podman", shm_size="16g")), ("podman",), gpus=8)
    assert rc == 0
    assert argv[14:20] == ["--shm-size", "16g", "--device", "nvidia.com/gpu=all", "--volume", MOUNTS[0]]
    assert "--ipc" not in argv


def test_docker_argv_runs_as_the_node_user_with_its_gpus(tmp_path: Path) -> None:
    rc, argv = run_lines(tmp_path, launch_lines(container_run("docker")), ("docker",), gpus=2)
    assert rc == 0
    ids = f"{os.getuid()}:{os.getgid()}"
    assert argv == [
        "docker", "run", "--rm", "--init", "--pull", "never", "--name", "fleetrun-job-1-n1-a2",
        "--label", "fleetrun.run=job-1", "--network", "host", "--uts", "host", "--ipc", "host", "--gpus", "all",
        "--user", ids, "--volume", MOUNTS[0], "--volume", MOUNTS[1], "--workdir", "/home/u/.fleetrun/work/job",
        "--env", "FLEETRUN_RUN_ID", "--env", "TF_CONFIG", "ghcr.io/lab/train:1", *INSIDE,
    ]  # fmt: skip


def test_a_channel_folder_is_the_shells_data_not_its_code(tmp_path: Path) -> None:
    """A playbook's channel folder is the user's text: whatever it holds reaches the runtime as
    one literal argument, never run or expanded by the launch script's shell."""
    marker = tmp_path / "ran"
    hostile = f'/data/$(touch {marker})"`touch {marker}`'
    run = ContainerRun(**{**container_run("podman").__dict__, "mounts": ("$HOME/.fleetrun/lib", hostile)})
    rc, argv = run_lines(tmp_path, launch_lines(run), ("podman",))
    assert rc == 0 and not marker.exists()
    assert argv[argv.index("--volume", argv.index("--volume") + 1) + 1] == f"{hostile}:{hostile}"


def test_the_probe_and_the_launch_take_runtime_auto_in_one_order() -> None:
    """The probe runs alone on a node (it cannot import planning): its copy of the order must be
    the launch's and the pull's, or doctor would name a runtime the run does not use."""
    from launch.nodelib.fleetrun_probe import CONTAINER_RUNTIMES
    from launch.planning.container import RUNTIMES_BY_PREFERENCE
    from launch.planning.image_pull import RUNTIME_ORDER

    assert CONTAINER_RUNTIMES == RUNTIMES_BY_PREFERENCE == RUNTIME_ORDER


def test_apptainer_argv(tmp_path: Path) -> None:
    rc, argv = run_lines(tmp_path, launch_lines(container_run("apptainer")), ("apptainer",), gpus=1)
    assert rc == 0
    assert argv == [
        "apptainer", "exec", "--nv", "--no-home", "--bind", MOUNTS[0], "--bind", MOUNTS[1],
        "--pwd", "/home/u/.fleetrun/work/job", "/home/u/.fleetrun/images/ghcr.io_lab_train_1.sif", *INSIDE,
    ]  # fmt: skip  # the SIF the pull stage made (image_pull.sif_path), not docker:// at every start
    rc, argv = run_lines(
        tmp_path, launch_lines(container_run("apptainer", image="/img/t.sif")), ("apptainer",)
    )
    assert argv[:2] == ["apptainer", "exec"] and "--nv" not in argv and "/img/t.sif" in argv


@pytest.mark.parametrize(
    ("present", "chosen"),
    [
        (("podman", "docker", "apptainer"), "podman"),
        (("docker", "apptainer"), "docker"),
        (("apptainer",), "apptainer"),
    ],
)
def test_auto_takes_the_first_runtime_the_node_has_and_records_it(
    tmp_path: Path, present: tuple[str, ...], chosen: str
) -> None:
    rc, argv = run_lines(tmp_path, launch_lines(container_run("auto")), present)
    assert rc == 0 and argv[0] == chosen
    assert (tmp_path / "run" / "container_runtime").read_text() == f"{chosen}\n"


def test_a_node_without_the_runtime_says_so(tmp_path: Path) -> None:
    rc, said = run_lines(tmp_path, launch_lines(container_run("docker")), ("podman",))
    assert rc == 127
    assert said == ["fleetrun: no container runtime on this node (looked for docker)"]


def spec(tmp_path: Path, **kw: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "job",
        "workdir": tmp_path,
        "entrypoint": "python -m trainer.task --epochs 3",
        "nodes": 2,
        "container": {"image": "ghcr.io/lab/train:1", "runtime": "podman"},
        "env": {"API_TOKEN": "s3cr3t-value"},
        "channels": {"train": "/data/train"},
    }
    fields.update(kw)
    return JobSpec.model_validate(fields)


def test_the_launch_script_starts_the_ranks_in_the_image_with_the_environment_by_name(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path), sample_inventory(2, gpus=0, user="u"), run_id="job-1")
    node = plan.nodes[1]
    script = node.launch_script or ""
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    assert "bin/activate" not in script, "the ranks use the image's Python, not the node's venv"
    run_line = next(line for line in script.splitlines() if "exec podman run" in line)
    assert "s3cr3t-value" not in run_line, "values never on the runtime's command line"
    for name in (
        "FLEETRUN_RUN_ID",
        "MASTER_ADDR",
        "TF_CONFIG",
        "SM_HOSTS",
        "API_TOKEN",
        "PYTHONPATH",
        "MASTER_PORT",
    ):
        assert f"--env {name} " in run_line, name
    for mount in (
        "$HOME/.fleetrun/lib",
        "$HOME/.fleetrun/work/job",
        "$HOME/.fleetrun/runs/job-1",
    ):
        assert f'--volume "{mount}:{mount}"' in run_line, mount
    assert "--volume /data/train:/data/train" in run_line, (
        "the playbook's folder: single-quoted when it needs it"
    )
    assert '--name "fleetrun-job-1-n1-a$FLEETRUN_ATTEMPT"' in run_line
    assert "torch.distributed.run" in run_line and "--local-addr=10.0.0.2" in run_line


def test_a_node_of_unknown_gpu_count_gives_its_count_to_torchrun_inside_the_image(tmp_path: Path) -> None:
    """Hosts without a GPU count: torchrun's ``--nproc-per-node="$NPROC"`` is expanded inside the
    image from the variables passed by name, so the count the launch script finds must be in
    its environment, not only its shell (it was not: an empty ``--nproc-per-node=``)."""
    plan = make_plan(spec(tmp_path), sample_inventory(2, gpus=None, user="u"), run_id="job-1")
    script = plan.nodes[1].launch_script or ""
    assert '--nproc-per-node="$NPROC"' in script and "--env NPROC " in script
    count = next(line for line in script.splitlines() if line.startswith("NPROC="))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    inside = subprocess.run(
        ["/bin/sh", "-c", count + "\nsh -c 'echo nproc=$NPROC'"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert inside.stdout.strip() == "nproc=4"


def test_without_container_the_launch_script_is_unchanged(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path, container=None), sample_inventory(2, gpus=0, user="u"), run_id="job-1")
    script = plan.nodes[0].launch_script or ""
    assert '. "$HOME/.fleetrun/envs/job/bin/activate"' in script
    assert "podman" not in script and "container_runtime" not in script


GOOD = "name: demo\nworkdir: code\nentrypoint: python -m trainer.task\nnodes: 2\ncontainer:\n  image: lab/train:1\n"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("requirements: req.txt\n", "field 'requirements': with container: the ranks use the image's Python"),
    ],
)
def test_what_a_container_cannot_run_yet_is_refused_naming_the_field(
    tmp_path: Path, extra: str, expected: str
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "req.txt").write_text("numpy\n")
    path = tmp_path / "job.yaml"
    path.write_text(GOOD + extra)
    with pytest.raises(SpecError) as info:
        load_job_spec(path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_horovod_runs_in_a_container(tmp_path: Path) -> None:
    """horovodrun in the head's container, a container per rank on the workers
    (``launch.planning.launchers.horovod``; tests/test_horovod_plan.py has the commands)."""
    (tmp_path / "code").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(GOOD + "launcher: horovod\n")
    loaded = load_job_spec(path)
    assert loaded.launcher == "horovod" and loaded.container is not None


FAKE_PODMAN = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$1" in
  ps) [ -e "$FAKE_STATE/removed" ] || echo c0ffee ;;
  stop) exec sleep 600 ;;
  rm) touch "$FAKE_STATE/removed" ;;
esac
"""


def test_a_stop_that_cut_the_grace_short_does_not_wait_out_the_runtimes_own_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node agent cuts a recovery's grace when no rank steps (``fleetrun_stepping``); the
    run's containers then go at once too: the runtime's ``stop -t GRACE`` is ended and ``rm -f``
    removes them, instead of the agent waiting for the runtime to sit out the grace."""
    from launch.nodelib import fleetrun_containers

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(FAKE_PODMAN)
    (bin_dir / "podman").chmod(0o755)
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_STATE", str(tmp_path))
    stopping = fleetrun_containers.begin_stop("podman", "job-1", 600)
    assert stopping is not None
    assert fleetrun_containers.finish_stop("podman", "job-1", stopping, hurry=True) == 0
    assert stopping.returncode is not None and stopping.returncode < 0, "the runtime's stop was ended"
    assert stopping.args == ["podman", "stop", "-t", "600", "c0ffee"]
    calls = log.read_text().splitlines()
    assert calls[0] == "ps -aq --filter label=fleetrun.run=job-1" and "rm -f c0ffee" in calls
