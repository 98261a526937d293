"""Launch plans are pure data: what each node runs, checked without a network."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from launch.cli.app import make_plan
from launch.errors import SpecError
from launch.job.inventory import Inventory
from launch.job.spec import JobSpec
from launch.planning.launchers import get_launcher
from launch.planning.launchers.torchrun import entrypoint_tail
from launch.run.run_folder import new_run_id
from tests.conftest import sample_inventory


def inventory(n: int, gpus: int | None = 0) -> Inventory:
    return sample_inventory(n, gpus=gpus, user="u")


def spec(tmp_path: Path, **kw: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "job",
        "workdir": tmp_path,
        "entrypoint": "python -m trainer.task --epochs 3",
        "nodes": 3,
    }
    fields.update(kw)
    return JobSpec.model_validate(fields)


def test_torchrun_plan_per_node(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path, rdzv_port=29500), inventory(4), run_id="job-1")
    assert [n.host.name for n in plan.nodes] == ["n0", "n1", "n2"], "first N hosts, head first"
    assert plan.total_processes == 3
    for rank, node in enumerate(plan.nodes):
        env = node.env
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
        assert env["NODE_RANK"] == str(rank) and env["WORLD_SIZE"] == "3"
        assert env["FLEETRUN_NODE_IPS"] == "10.0.0.1,10.0.0.2,10.0.0.3"
        tf = json.loads(env["TF_CONFIG"])
        assert tf["task"] == {"type": "worker", "index": rank}
        assert tf["cluster"]["worker"][0] == "10.0.0.1:2222"
        assert "--rdzv-endpoint=10.0.0.1:29500" in node.command
        assert "--rdzv-backend=c10d" in node.command and "--nnodes=3" in node.command
        assert f"--local-addr=10.0.0.{rank + 1}" in node.command
        assert f"is_host={1 if rank == 0 else 0}" in node.command
        assert node.command.endswith("-m trainer.task --epochs 3")
        assert "IFACE=ens5" in node.launch_script
        assert 'export GLOO_SOCKET_IFNAME="$IFACE" NCCL_SOCKET_IFNAME="$IFACE"' in node.launch_script


def test_launch_script_is_valid_sh(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path, env={"QUOTED": 'it\'s "fine" $HOME'}), inventory(3), run_id="job-1")
    for node in plan.nodes:
        subprocess.run(["sh", "-n"], input=node.launch_script, text=True, check=True)
        subprocess.run(["sh", "-n"], input=node.setup_script, text=True, check=True)
    assert "export QUOTED='it'\"'\"'s \"fine\" $HOME'" in plan.nodes[0].launch_script


def test_auto_procs_from_gpus_or_nvidia_smi(tmp_path: Path) -> None:
    eight = make_plan(spec(tmp_path), inventory(3, gpus=8), run_id="r")
    assert eight.total_processes == 24 and "--nproc-per-node=8" in eight.nodes[0].command
    unknown = make_plan(spec(tmp_path), inventory(3, gpus=None), run_id="r")
    assert unknown.total_processes is None
    assert '--nproc-per-node="$NPROC"' in unknown.nodes[0].command
    assert "nvidia-smi -L" in unknown.nodes[0].launch_script
    assert "ip -o -4 addr show" in unknown.nodes[0].launch_script, "interface found from the private address"
    cpu = make_plan(spec(tmp_path), inventory(3, gpus=0), run_id="r")
    assert cpu.total_processes == 3


def test_fixed_procs(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path, procs_per_node=2, nodes=2), inventory(2, gpus=8), run_id="r")
    assert plan.total_processes == 4 and "--nproc-per-node=2" in plan.nodes[1].command


@pytest.mark.parametrize(
    ("entrypoint", "tail"),
    [
        ("python -m trainer.task --epochs 3", "-m trainer.task --epochs 3"),
        ("python3 train.py --out $FLEETRUN_OUTPUT_DIR", "train.py --out $FLEETRUN_OUTPUT_DIR"),
        ("train.py", "train.py"),
        ("bash run.sh", "--no-python bash run.sh"),
    ],
)
def test_entrypoint_tail_keeps_shell_text(entrypoint: str, tail: str) -> None:
    assert entrypoint_tail(entrypoint) == tail


def test_dry_run_render_names_every_node(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path), inventory(3), run_id="job-xyz")
    text = plan.render()
    for name in ("n0", "n1", "n2"):
        assert f"## {name} (u@" in text
    assert text.count("exec python -m fleetrun_torchrun") == 3
    assert "run job-xyz" in text


def test_run_ids_unique() -> None:
    ids = {new_run_id("job") for _ in range(200)}
    assert len(ids) == 200
    assert all(re.match(r"^job-\d{8}-\d{6}-[0-9a-f]{6}$", i) for i in ids)


def test_unknown_launcher_is_clear() -> None:
    with pytest.raises(SpecError, match="launcher .mpi. is not available; available: (horovod, )?torchrun"):
        get_launcher("mpi")


def test_too_few_hosts(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="asks for 3 nodes"):
        make_plan(spec(tmp_path), inventory(2), run_id="r")


def test_dry_run_says_when_code_travels_through_the_head(tmp_path: Path) -> None:
    direct = make_plan(spec(tmp_path), inventory(3), run_id="job-a").render()
    relayed = make_plan(spec(tmp_path, relay_sync_above=2), inventory(3), run_id="job-b").render()
    assert "code sync" not in direct
    assert "uploaded once to n0, which copies it to the other 2" in relayed


def test_the_jobs_temp_files_live_in_its_run_dir_and_are_never_pulled(tmp_path: Path) -> None:
    """TMPDIR is the run's ``tmp`` (removed by the node agent when the job ends), so torchrun's
    torchelastic_* dirs never pile up in a shared node's /tmp; torch.compile's cache is kept in
    fleetrun's folder; a playbook's own TMPDIR wins; the pull leaves ``tmp`` on the node."""
    from launch.run.artifacts import pull_argv

    node = make_plan(spec(tmp_path), inventory(3), run_id="job-1").nodes[1]
    assert node.env["TMPDIR"] == "$HOME/.fleetrun/runs/job-1/tmp"
    assert node.env["TORCHINDUCTOR_CACHE_DIR"] == "$HOME/.fleetrun/cache/torchinductor"
    assert 'export TMPDIR="$HOME"/.fleetrun/runs/job-1/tmp' in node.launch_script
    assert 'mkdir -p "$FLEETRUN_OUTPUT_DIR" "$TMPDIR"' in node.launch_script
    own = make_plan(spec(tmp_path, env={"TMPDIR": "/scratch/me"}), inventory(3), run_id="job-1").nodes[0]
    assert own.env["TMPDIR"] == "/scratch/me" and "export TMPDIR=/scratch/me" in own.launch_script
    argv = pull_argv("n0:.fleetrun/runs/job-1/", tmp_path, "ssh")
    assert "--exclude=/tmp/" in argv and argv.index("--exclude=/tmp/") < argv.index("-e")


def test_dry_run_prints_each_file_and_the_setup_under_their_own_headers(tmp_path: Path) -> None:
    """The setup script used to follow the last ``### file`` header (the power-off hook's), so it
    read as that file's content."""
    plan = make_plan(spec(tmp_path), inventory(3), run_id="job-xyz")
    lines = plan.render().splitlines()
    for node in plan.nodes:
        assert node.files, "the plan writes at least the power-off hook"
        section = lines.index(f"## {node.describe()}")
        setup = next(i for i in range(section, len(lines)) if lines[i].startswith("### setup"))
        assert lines[setup + 1] == node.setup_script.splitlines()[0]
        files = [i for i in range(section, setup) if lines[i].startswith("### file")]
        assert len(files) == len(node.files), "every file comes before the setup's header"
