"""Horovod plans are pure data: the horovodrun command, slots, cluster SSH files and rank scripts.

No network and no Horovod needed. The shell pieces (rank script, authorize step, ssh wrapper) are
also run for real with ``sh`` and ``ssh -G`` in temporary homes, since their behaviour is the point.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
from pathlib import Path

import paramiko
import pytest

from launch.cli.app import make_plan
from launch.errors import SpecError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.planning import cluster_ssh
from launch.planning.launchers import get_launcher
from launch.planning.launchers.horovod import HorovodLauncher, rank_command
from launch.planning.plan import LaunchPlan
from tests.conftest import REPO, SAMPLE_HOST_KEYS, sample_inventory

FAKE_KEY = cluster_ssh.ClusterKey(
    private_key="-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-material\n-----END OPENSSH PRIVATE KEY-----\n",
    public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPartOfTheClusterKeyForTests fleetrun-cluster:abc123",
    tag="fleetrun-cluster:abc123",
)


def inventory(n: int, gpus: int | None = 0, ports: list[int] | None = None) -> Inventory:
    return sample_inventory(n, gpus=gpus, ports=ports)


def spec(tmp_path: Path, **kw: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "job",
        "workdir": tmp_path,
        "launcher": "horovod",
        "entrypoint": "python -m trainer.task_horovod --epochs 3",
        "nodes": 3,
        "procs_per_node": 1,
    }
    fields.update(kw)
    return JobSpec.model_validate(fields)


def plan(
    tmp_path: Path, inv: Inventory | None = None, install: str = "echo install\n", **kw: object
) -> LaunchPlan:
    launcher = HorovodLauncher(FAKE_KEY, install)
    return launcher.plan(spec(tmp_path, **kw), inv or inventory(3), "job-1")


def files(p: LaunchPlan, rank: int) -> dict[str, cluster_ssh.RemoteFile]:
    return {f.path: f for f in p.nodes[rank].files}


def test_horovodrun_on_the_head_only_with_explicit_hosts_slots_ssh_and_interface(tmp_path: Path) -> None:
    p = plan(tmp_path)
    head, *workers = p.nodes
    assert p.launcher == "horovod" and p.total_processes == 3
    assert head.starts_processes and head.role == "head"
    assert all(not w.starts_processes and w.command is None for w in workers), (
        "workers are started by horovodrun"
    )
    assert head.command is not None
    assert head.command.startswith(
        "python -m horovod.runner.launch --gloo --disable-cache -np 3 -H 10.0.0.1:1,10.0.0.2:1,10.0.0.3:1 "
        '--network-interfaces "$IFACE" -p 22 -i "$HOME/.fleetrun/cluster/id_ed25519" '
    )
    assert "--start-timeout 120 --gloo-timeout-seconds 120" in head.command
    assert head.command.endswith(rank_command())
    assert head.launch_script is not None
    lines = head.launch_script.splitlines()
    assert lines[-1] == f"exec {head.command}"
    assert lines[-2] == 'export PATH="$HOME/.fleetrun/cluster/bin:$PATH"', (
        "the strict ssh wrapper comes first"
    )
    assert "IFACE=ens5" in head.launch_script


def test_playbook_env_reaches_ranks_through_rank_sh_not_horovodruns_command_line(tmp_path: Path) -> None:
    p = plan(tmp_path, env={"WANDB_API_KEY": "s3cret", "HOROVOD_FUSION_THRESHOLD": "0"})
    launch = p.nodes[0].launch_script or ""
    assert launch.splitlines()[-2] == "unset WANDB_API_KEY", "horovodrun would copy it into ps-visible argv"
    for rank in range(3):
        rank_sh = files(p, rank)[".fleetrun/runs/job-1/rank.sh"].content
        assert "export WANDB_API_KEY=s3cret" in rank_sh and "export HOROVOD_FUSION_THRESHOLD=0" in rank_sh


def test_slots_follow_procs_per_node_and_auto_gpus(tmp_path: Path) -> None:
    two = plan(tmp_path, procs_per_node=2)
    assert "-np 6 -H 10.0.0.1:2,10.0.0.2:2,10.0.0.3:2 " in (two.nodes[0].command or "")
    gpus = plan(tmp_path, inventory(3, gpus=8), procs_per_node="auto")
    assert "-np 24 -H 10.0.0.1:8,10.0.0.2:8,10.0.0.3:8 " in (gpus.nodes[0].command or "")


def test_unknown_gpu_counts_take_the_heads_count_for_every_host(tmp_path: Path) -> None:
    p = plan(tmp_path, inventory(3, gpus=None), procs_per_node="auto")
    head = p.nodes[0]
    assert p.total_processes is None
    assert '-np "$((3 * NPROC))" -H "10.0.0.1:$NPROC,10.0.0.2:$NPROC,10.0.0.3:$NPROC"' in (head.command or "")
    assert head.launch_script is not None and "NPROC=$(nvidia-smi -L" in head.launch_script
    assert any("as many slots as the head has GPUs" in n for n in p.notes)


def test_worker_ports_differing_are_left_to_ssh_config(tmp_path: Path) -> None:
    p = plan(tmp_path, inventory(3, ports=[22, 2201, 2202]))
    assert " -p " not in (p.nodes[0].command or "")
    config = files(p, 0)[cluster_ssh.SSH_CONFIG].content
    assert "Host 10.0.0.2\n    User user1\n    Port 2201\n" in config
    assert "[10.0.0.3]:2202 " + SAMPLE_HOST_KEYS[2] in files(p, 0)[cluster_ssh.KNOWN_HOSTS].content


def test_single_node_needs_no_cluster_ssh(tmp_path: Path) -> None:
    p = plan(tmp_path, inventory(1), nodes=1)
    head = p.nodes[0]
    assert "-H 10.0.0.1:1 " in (head.command or "") and " -i " not in (head.command or "")
    assert "--network-interfaces" not in (head.command or ""), "all-local horovodrun wants loopback"
    assert cluster_ssh.PRIVATE_KEY not in files(p, 0)


def test_head_gets_secret_key_and_pinned_worker_keys_never_tofu(tmp_path: Path) -> None:
    p = plan(tmp_path)
    head_files = files(p, 0)
    key = head_files[cluster_ssh.PRIVATE_KEY]
    assert key.secret and key.mode == 0o600 and key.content == FAKE_KEY.private_key
    known = head_files[cluster_ssh.KNOWN_HOSTS].content
    assert known == f"10.0.0.2 {SAMPLE_HOST_KEYS[1]}\n10.0.0.3 {SAMPLE_HOST_KEYS[2]}\n", (
        "workers only, private addresses, pinned keys"
    )
    config = head_files[cluster_ssh.SSH_CONFIG].content
    assert "Host 10.0.0.2\n    User user1\n" in config and "Host 10.0.0.3\n    User user2\n" in config
    assert "StrictHostKeyChecking yes" in config and "IdentitiesOnly yes" in config
    assert head_files[cluster_ssh.SSH_WRAPPER].mode == 0o755
    rendered = p.render()
    assert "secret-material" not in rendered, "--dry-run never prints the private key"
    code = "\n".join(line for line in rendered.splitlines() if not line.lstrip().startswith("#"))
    assert "StrictHostKeyChecking=no" not in code and "StrictHostKeyChecking no" not in code
    assert "ssh-keyscan" not in code
    assert "images/horovod/install.sh" in rendered and "echo install" not in rendered
    assert "horovodrun slots: n0 10.0.0.1:1, n1 10.0.0.2:1, n2 10.0.0.3:1 (-np 3)" in rendered
    assert "python -m horovod.runner.launch --gloo" in rendered
    for worker in (1, 2):
        assert cluster_ssh.PRIVATE_KEY not in files(p, worker), "the private key stays on the head"


def test_workers_authorize_the_key_from_the_head_only_before_the_setup_hash_check(tmp_path: Path) -> None:
    p = plan(tmp_path)
    for worker in p.nodes[1:]:
        script = worker.setup_script
        line = cluster_ssh.authorized_key_line(FAKE_KEY, p.nodes[0].host)
        assert line.startswith(
            'from="10.0.0.1",no-agent-forwarding,no-port-forwarding,no-X11-forwarding,no-pty'
        )
        assert line in script
        assert script.index("CLUSTER_KEY=") < script.index("FLEETRUN_SETUP=skipped"), (
            "runs even when setup is skipped"
        )
    assert "CLUSTER_KEY=" not in p.nodes[0].setup_script


def run_authorize(home: Path, key: cluster_ssh.ClusterKey, head: Host) -> str:
    proc = subprocess.run(
        ["sh", "-c", cluster_ssh.authorize_script(key, head)],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_authorize_step_is_idempotent_and_keeps_every_other_line(tmp_path: Path) -> None:
    head = inventory(3).head
    (tmp_path / ".ssh").mkdir()
    ak = tmp_path / ".ssh" / "authorized_keys"
    other = cluster_ssh.ClusterKey("", FAKE_KEY.public_key.replace("PublicPart", "OldPart"), FAKE_KEY.tag)
    ak.write_text(f"ssh-ed25519 AAAAoperator operator\n{cluster_ssh.authorized_key_line(other, head)}\n")
    ak.chmod(0o644)
    assert "FLEETRUN_KEY=installed" in run_authorize(tmp_path, FAKE_KEY, head)
    assert "installed" not in run_authorize(tmp_path, FAKE_KEY, head), "second run changes nothing"
    lines = ak.read_text().splitlines()
    assert lines == [
        "ssh-ed25519 AAAAoperator operator",
        cluster_ssh.authorized_key_line(other, head),  # not noted by fleetrun: never removed
        cluster_ssh.authorized_key_line(FAKE_KEY, head),
    ]
    assert stat.S_IMODE(ak.stat().st_mode) == 0o644, "the operator's file keeps its mode"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (ssh -G)")
def test_ssh_wrapper_makes_strict_checking_win_over_horovodruns_options(tmp_path: Path) -> None:
    """horovodrun passes ``-o StrictHostKeyChecking=no``; ``ssh -G`` shows what OpenSSH would use."""
    p = plan(tmp_path / "w")
    home = tmp_path / "home"
    for f in p.nodes[0].files:
        target = home / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
        target.chmod(f.mode)
    argv = [
        str(home / cluster_ssh.SSH_WRAPPER),
        "-G",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "StrictHostKeyChecking=no",
        "10.0.0.2",
        "-p",
        "22",
        "-i",
        str(home / cluster_ssh.PRIVATE_KEY),
    ]
    out = subprocess.run(
        argv, env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, check=True
    )
    conf = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert conf["stricthostkeychecking"] == "true"
    assert conf["user"] == "user1", "the worker's own user, from fleetrun's ssh_config"
    assert conf["userknownhostsfile"] == str(home / cluster_ssh.KNOWN_HOSTS)
    assert conf["globalknownhostsfile"] == "/dev/null"
    assert conf["batchmode"] == "yes" and conf["identitiesonly"] == "yes"


def test_setup_installs_horovod_and_its_hash_follows_the_install_script(tmp_path: Path) -> None:
    a = plan(tmp_path, install="echo one\n")
    b = plan(tmp_path, install="echo two\n")
    for node in a.nodes:
        assert 'sh "$HOME/.fleetrun/horovod/install.sh" python' in node.setup_script
        assert node.setup_script.index("install.sh") < node.setup_script.index("FLEETRUN_SETUP=ran")
        assert files(a, node.node_rank)[".fleetrun/horovod/install.sh"].mode == 0o755
    assert a.nodes[0].setup_hash != b.nodes[0].setup_hash, "a changed install script reruns setup"
    assert len({n.setup_hash for n in a.nodes}) == 1


def test_plan_needs_a_cluster_key_and_the_registry_knows_horovod(tmp_path: Path) -> None:
    launcher = get_launcher("horovod")
    assert isinstance(launcher, HorovodLauncher)
    with pytest.raises(SpecError, match="cluster's SSH key"):
        launcher.plan(spec(tmp_path), inventory(3), "job-1")


def test_make_plan_writes_no_key_and_gives_each_run_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning (and so ``--dry-run``) writes nothing: the key exists only inside the plan."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    inv = inventory(4)
    first = make_plan(spec(tmp_path), inv, run_id="job-1")
    second = make_plan(spec(tmp_path), inv, run_id="job-2")
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*")), "no key on disk"
    shipped = files(first, 0)[cluster_ssh.PRIVATE_KEY].content
    assert shipped != files(second, 0)[cluster_ssh.PRIVATE_KEY].content, "a key per run"
    loaded = paramiko.Ed25519Key.from_private_key(io.StringIO(shipped))
    public = f"{loaded.get_name()} {loaded.get_base64()}"
    assert public in first.nodes[1].setup_script, "the workers authorize this very key"
    assert 'expiry-time="' in first.nodes[1].setup_script


def write_fake_node(home: Path, job: str) -> None:
    """A node home with a stub venv (activate prepends its bin) and a workdir."""
    env_bin = home / ".fleetrun" / "envs" / job / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "activate").write_text(
        f'VIRTUAL_ENV="{env_bin.parent}"; export VIRTUAL_ENV; PATH="{env_bin}:$PATH"\n'
    )
    (home / ".fleetrun" / "work" / job).mkdir(parents=True)
    lib = home / ".fleetrun" / "lib"  # what the sync ships: the node library
    lib.mkdir(parents=True)
    shutil.copy(REPO / "launch" / "nodelib" / "fleetrun_sagemaker.py", lib)


def run_rank(
    tmp_path: Path,
    p: LaunchPlan,
    rank_node: int,
    horovod_rank: int,
    extra_env: dict[str, str] | None = None,
    bin_first: Path | None = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run node ``rank_node``'s rank.sh as horovodrun would: the head's environment, the node's
    home as ``$1``; ``bin_first``: a folder put first on that ``PATH`` (recorders)."""
    home = tmp_path / f"node{rank_node}"
    write_fake_node(home, "job")
    script = files(p, rank_node)[".fleetrun/runs/job-1/rank.sh"]
    path = home / script.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script.content)
    head_env = {
        "HOME": "/home/the-head",
        "PATH": f"/home/the-head/.fleetrun/envs/job/bin:/home/the-head/.fleetrun/cluster/bin:{os.environ['PATH']}",
        "PYTHONPATH": "/home/the-head/.fleetrun/lib",
        "VIRTUAL_ENV": "/home/the-head/.fleetrun/envs/job",
        "FLEETRUN_RUN_ID": "job-1",
        "FLEETRUN_NODE_RANK": "0",
        "HOROVOD_RANK": str(horovod_rank),
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_GLOO_IFACE": "eth-of-the-head",
        **(extra_env or {}),
    }
    if bin_first is not None:
        head_env["PATH"] = f"{bin_first}:{head_env['PATH']}"
    proc = subprocess.run(
        ["sh", str(path), str(home)], env=head_env, capture_output=True, text=True, timeout=30
    )
    return proc, home


def test_rank_script_restores_the_nodes_own_environment(tmp_path: Path) -> None:
    p = plan(tmp_path / "w", entrypoint="sh -c 'echo \"cwd=$(pwd)\" && env'", env={"OMP_NUM_THREADS": "1"})
    proc, home = run_rank(tmp_path, p, rank_node=1, horovod_rank=1)
    assert proc.returncode == 0, proc.stderr
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert env["HOME"] == str(home)
    assert env["cwd"] == str(home / ".fleetrun/work/job")
    assert "/home/the-head" not in env["PATH"] and "/home/the-head" not in env["PYTHONPATH"]
    assert env["PATH"].startswith(str(home / ".fleetrun/envs/job/bin") + ":")
    assert env["PYTHONPATH"] == str(home / ".fleetrun/lib")
    assert env["FLEETRUN_NODE_RANK"] == "1" and env["NODE_RANK"] == "1"
    assert env["FLEETRUN_RUN_DIR"] == str(home / ".fleetrun/runs/job-1")
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == "0"
    assert env["HOROVOD_GLOO_IFACE"] == "ens5", "this node's interface, not the head's"
    assert env["FLEETRUN_RUN_ID"] == "job-1" and env["OMP_NUM_THREADS"] == "1"
    assert (home / ".fleetrun/runs/job-1/rank-1.log").read_text() == proc.stdout, "a per-rank log"
    assert not (home / ".fleetrun/runs/job-1/rc").exists(), "a rank that succeeded records no failure"


def test_failing_rank_records_its_exit_code_on_a_worker_only(tmp_path: Path) -> None:
    p = plan(tmp_path / "w", entrypoint="sh -c 'echo going down; exit 3'")
    proc, home = run_rank(tmp_path, p, rank_node=2, horovod_rank=2)
    assert proc.returncode == 3 and "going down" in proc.stdout
    assert (home / ".fleetrun/runs/job-1/rc").read_text().strip() == "3", "the node agent reports it"
    proc, home = run_rank(tmp_path, p, rank_node=0, horovod_rank=0)
    assert proc.returncode == 3
    assert not (home / ".fleetrun/runs/job-1/rc").exists(), "on the head, rc is horovodrun's (the agent's)"


def test_generated_shell_is_valid_sh(tmp_path: Path) -> None:
    p = plan(tmp_path, env={"QUOTED": 'it\'s "fine" $HOME'})
    for node in p.nodes:
        for text in [
            node.setup_script,
            node.launch_script or "",
            *(f.content for f in node.files if f.path.endswith((".sh", "/ssh"))),
        ]:
            subprocess.run(["sh", "-n"], input=text, text=True, check=True)
    subprocess.run(["sh", "-n", "-c", rank_command()], check=True)


# -- with container: horovodrun in the head's container, a container per rank on the workers ------

RECORDER = (
    '#!/bin/sh\nfor word in "$0" "$@"; do printf "%s\\n" "$word"; done > "$RECORD"\n'
    'env > "$RECORD.env"\nexit "${RECORDER_RC:-0}"\n'
)
BOXED_ENTRY = "python -m trainer.task_horovod --epochs 3"


def recorders(tmp_path: Path, *names: str) -> Path:
    """A folder of recorders named ``names`` (each writes its argv to ``$RECORD``, its environment
    to ``$RECORD.env``, and exits ``$RECORDER_RC``)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(RECORDER)
        (folder / name).chmod(0o755)
    return folder


def boxed(tmp_path: Path, runtime: str, **kw: object) -> LaunchPlan:
    fields: dict[str, object] = {
        "container": {"image": "ghcr.io/lab/train:1", "runtime": runtime},
        "env": {"API_TOKEN": "s3cr3t-value"},
        "entrypoint": BOXED_ENTRY,
        **kw,
    }
    return HorovodLauncher(FAKE_KEY, "echo install\n").plan(
        spec(tmp_path / "w", **fields), inventory(3), "job-1"
    )


def run_boxed_rank(
    tmp_path: Path, runtime: str, rc: int = 0
) -> tuple[subprocess.CompletedProcess[str], Path, list[str], dict[str, str]]:
    """Worker 1's rank.sh with a recorder standing in for ``runtime``: (the script's run, the
    node's home, the runtime's argv, the runtime's environment)."""
    p = boxed(tmp_path, runtime)
    record = tmp_path / "argv"
    extra = {"RECORD": str(record), "RECORDER_RC": str(rc), "FLEETRUN_ATTEMPT": "2"}
    proc, home = run_rank(tmp_path, p, 1, 1, extra, recorders(tmp_path, runtime))
    argv = record.read_text().splitlines() if record.exists() else []
    if argv:
        argv[0] = os.path.basename(argv[0])
    seen = Path(f"{record}.env").read_text().splitlines() if record.exists() else []
    return proc, home, argv, dict(line.split("=", 1) for line in seen if "=" in line)


def boxed_env_names(p: LaunchPlan) -> list[str]:
    """What a worker's rank container gets by name: the node's variables, the launch script's
    own, horovodrun's (``RANK_ENV``), each once, in that order."""
    from launch.planning.launchers.base import CONTAINER_EXTRA_ENV
    from launch.planning.launchers.horovod import RANK_ENV

    names = list(p.nodes[1].env)
    for name in (*CONTAINER_EXTRA_ENV, *RANK_ENV):
        if name not in names:
            names.append(name)
    return names


def env_flags(names: list[str]) -> list[str]:
    return [word for name in names for word in ("--env", name)]


def same_paths(home: Path, flag: str) -> list[str]:
    folders = [".fleetrun/lib", ".fleetrun/work/job", ".fleetrun/runs/job-1", ".fleetrun/cache/torchinductor"]
    return [word for f in folders for word in (flag, f"{home}/{f}:{home}/{f}")]


def test_a_workers_rank_runs_in_its_own_podman_container(tmp_path: Path) -> None:
    proc, home, argv, env = run_boxed_rank(tmp_path, "podman")
    assert proc.returncode == 0, proc.stderr
    names = boxed_env_names(boxed(tmp_path, "podman"))
    assert argv == [
        "podman", "run", "--rm", "--init", "--pull", "never", "--name", "fleetrun-job-1-n1-a2-r1",
        "--label", "fleetrun.run=job-1", "--network", "host", "--uts", "host", "--ipc", "host",
        *same_paths(home, "--volume"), "--workdir", f"{home}/.fleetrun/work/job", *env_flags(names),
        "ghcr.io/lab/train:1", "sh", "-c", BOXED_ENTRY,
    ]  # fmt: skip
    assert "s3cr3t-value" not in " ".join(argv), "values reach the runtime by environment only"
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "3" and env["RANK"] == "1"
    assert env["HOROVOD_GLOO_IFACE"] == "ens5" and env["API_TOKEN"] == "s3cr3t-value"
    assert env["HOME"] == str(home) and env["FLEETRUN_RUN_DIR"] == str(home / ".fleetrun/runs/job-1")
    run_dir = home / ".fleetrun/runs/job-1"
    assert (run_dir / "container_runtime").read_text() == "podman\n", "the stop finds the containers by it"
    assert not (run_dir / "rc").exists()


def test_a_workers_rank_runs_in_its_own_docker_container_as_the_node_user(tmp_path: Path) -> None:
    proc, home, argv, _ = run_boxed_rank(tmp_path, "docker")
    assert proc.returncode == 0, proc.stderr
    names = boxed_env_names(boxed(tmp_path, "docker"))
    assert argv == [
        "docker", "run", "--rm", "--init", "--pull", "never", "--name", "fleetrun-job-1-n1-a2-r1",
        "--label", "fleetrun.run=job-1", "--network", "host", "--uts", "host", "--ipc", "host",
        "--user", f"{os.getuid()}:{os.getgid()}", *same_paths(home, "--volume"),
        "--workdir", f"{home}/.fleetrun/work/job", *env_flags(names),
        "ghcr.io/lab/train:1", "sh", "-c", BOXED_ENTRY,
    ]  # fmt: skip


def test_a_workers_rank_runs_in_apptainer_from_the_pulled_sif(tmp_path: Path) -> None:
    proc, home, argv, env = run_boxed_rank(tmp_path, "apptainer")
    assert proc.returncode == 0, proc.stderr
    assert argv == [
        "apptainer", "exec", "--no-home", *same_paths(home, "--bind"),
        "--pwd", f"{home}/.fleetrun/work/job", f"{home}/.fleetrun/images/ghcr.io_lab_train_1.sif",
        "sh", "-c", BOXED_ENTRY,
    ]  # fmt: skip
    assert env["HOROVOD_RANK"] == "1", "apptainer passes the rank script's environment on"


def test_a_rank_failing_in_its_container_records_the_runtimes_exit_code_on_the_worker(tmp_path: Path) -> None:
    proc, home, argv, _ = run_boxed_rank(tmp_path, "podman", rc=137)
    assert argv[:2] == ["podman", "run"]
    assert proc.returncode == 137
    assert (home / ".fleetrun/runs/job-1/rc").read_text().strip() == "137", "the node agent reports it"


def test_horovodrun_runs_in_the_heads_container_with_the_cluster_ssh_mounted(tmp_path: Path) -> None:
    p = boxed(tmp_path, "podman")
    head = p.nodes[0]
    script = head.launch_script or ""
    run_line = next(line for line in script.splitlines() if "exec podman run" in line)
    assert '--volume "$HOME/.fleetrun/cluster:$HOME/.fleetrun/cluster"' in run_line
    assert '--name "fleetrun-job-1-n0-a$FLEETRUN_ATTEMPT" ' in run_line, "one container on the head"
    assert "horovod/install.sh" not in head.setup_script, "Horovod is the image's: nothing built on the node"
    assert "cluster" not in " ".join(
        line
        for line in (files(p, 1)[".fleetrun/runs/job-1/rank.sh"].content.splitlines())
        if "--volume" in line
    ), "a worker's rank needs no key"
    # what the container runs: horovodrun, with the strict ssh wrapper first and the playbook's
    # variables gone from what it copies onto the workers' command lines
    home = tmp_path / "head"
    record = tmp_path / "argv"
    env = {
        "HOME": str(home),
        "PATH": f"{recorders(tmp_path, 'python')}:/usr/bin:/bin",
        "RECORD": str(record),
        "API_TOKEN": "s3cr3t-value",
        "GLOO_SOCKET_IFNAME": "ens5",
        "FLEETRUN_PROCS_PER_NODE": "1",
    }
    done = subprocess.run(
        ["sh", "-c", head.command or ""], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    argv = record.read_text().splitlines()
    assert argv[1:] == [
        "-m", "horovod.runner.launch", "--gloo", "--disable-cache", "-np", "3",
        "-H", "10.0.0.1:1,10.0.0.2:1,10.0.0.3:1", "--network-interfaces", "ens5", "-p", "22",
        "-i", f"{home}/.fleetrun/cluster/id_ed25519", "--start-timeout", "120", "--gloo-timeout-seconds", "120",
        "sh", "-c", rank_command().split(" ", 2)[2].strip("'"),
    ]  # fmt: skip
    seen = dict(line.split("=", 1) for line in Path(f"{record}.env").read_text().splitlines() if "=" in line)
    assert seen["PATH"].startswith(f"{home}/.fleetrun/cluster/bin:"), "the pinned ssh wrapper first"
    assert "API_TOKEN" not in seen


def test_the_heads_ranks_run_in_horovodruns_container_without_another(tmp_path: Path) -> None:
    """In the head's container the user has no name of the node's (rootless podman: root):
    the rank command falls back to ``HOME`` (the node user's, passed in), and the head's rank
    script runs the entrypoint where it is, with no runtime and no venv."""
    p = boxed(tmp_path, "podman", entrypoint="sh -c 'echo \"cwd=$(pwd)\" && env'")
    home = tmp_path / "node0"
    write_fake_node(home, "job")
    script = files(p, 0)[".fleetrun/runs/job-1/rank.sh"]
    (home / script.path).parent.mkdir(parents=True, exist_ok=True)
    (home / script.path).write_text(script.content)
    bin_dir = recorders(tmp_path, "podman", "docker", "apptainer")
    (bin_dir / "id").write_text("#!/bin/sh\necho no-such-user-here\n")
    (bin_dir / "id").chmod(0o755)
    record = tmp_path / "argv"
    env = {
        "HOME": str(home),
        "USER": "u",
        "PATH": f"{bin_dir}:{home}/.fleetrun/cluster/bin:{os.environ['PATH']}",
        "RECORD": str(record),
        "FLEETRUN_RUN_ID": "job-1",
        "GLOO_SOCKET_IFNAME": "eth-found-by-the-launch-script",
        "HOROVOD_RANK": "0",
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
    }
    proc = subprocess.run(
        ["sh", "-c", rank_command().split(" ", 2)[2].strip("'")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert not record.exists(), "no container started from inside the head's container"
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert seen["HOME"] == str(home) and seen["USER"] == "u"
    assert seen["cwd"] == str(home / ".fleetrun/work/job")
    assert ".fleetrun/envs" not in seen["PATH"], "the image's Python, not a venv"
    assert seen["HOROVOD_GLOO_IFACE"] == "eth-found-by-the-launch-script"
    assert seen["RANK"] == "0" and seen["API_TOKEN"] == "s3cr3t-value"
