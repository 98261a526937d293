"""Shared machines, without root: the per-run rendezvous port plumbing (spec -> plan -> launch
script -> runner), ``gpus: [..]`` lists, and the busy-GPU verdict from (hostile) nvidia-smi output."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from launch.cli.app import make_plan
from launch.job.inventory import Host
from launch.job.spec import JobSpec
from launch.planning import cluster_ssh
from launch.planning.claim import GpuApp, ProbeAnswer, busy_gpus, parse_probe, probe_command
from launch.planning.launchers.base import RDZV_PORT_FILE
from launch.planning.launchers.horovod import HorovodLauncher
from tests.conftest import SAMPLE_HOST_KEYS, sample_inventory
from tests.fakefleet import JobScript, NodeScript, fake_inventory, run_on_fake_fleet


def spec(tmp_path: Path, **kw: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "job",
        "workdir": tmp_path,
        "entrypoint": "python train.py",
        "nodes": 3,
    }
    fields.update(kw)
    return JobSpec.model_validate(fields)


# -- the rendezvous port ------------------------------------------------------------------------
def test_rdzv_port_defaults_to_auto_and_an_explicit_number_wins(tmp_path: Path) -> None:
    assert spec(tmp_path).rdzv_port == "auto"
    assert spec(tmp_path, rdzv_port=29600).rdzv_port == 29600
    for bad in (80, 70000, True, "29500", "Auto", 29500.0, None):
        with pytest.raises(ValidationError, match="rdzv_port"):
            spec(tmp_path, rdzv_port=bad)


def test_auto_port_reaches_every_node_through_the_port_file_not_the_plan(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path), sample_inventory(3, gpus=0, user="u"), run_id="job-1")
    assert plan.rdzv_port == "auto" and "# rendezvous port: auto" in plan.render()
    for node in plan.nodes:
        assert "MASTER_PORT" not in node.env, "no port is known at plan time"
        assert '--rdzv-endpoint=10.0.0.1:"$MASTER_PORT"' in (node.command or "")
        assert f"/.fleetrun/runs/job-1/{RDZV_PORT_FILE}" in (node.launch_script or "")
    fixed = make_plan(spec(tmp_path, rdzv_port=29600), sample_inventory(3, gpus=0, user="u"), run_id="job-1")
    assert fixed.rdzv_port == 29600
    for node in fixed.nodes:
        assert node.env["MASTER_PORT"] == "29600" and RDZV_PORT_FILE not in (node.launch_script or "")


def _port_from_script(tmp_path: Path, content: str | None) -> subprocess.CompletedProcess[str]:
    """Run the launch script's lines up to the port line, with ``content`` as the port file."""
    plan = make_plan(spec(tmp_path), sample_inventory(3, gpus=0, user="u"), run_id="job-1")
    script = plan.nodes[1].launch_script or ""
    head = script.split(f"{RDZV_PORT_FILE}", 1)[0].rsplit("\n", 1)[0]
    port_line = next(line for line in script.splitlines() if RDZV_PORT_FILE in line)
    run_dir = tmp_path / ".fleetrun" / "runs" / "job-1"
    run_dir.mkdir(parents=True, exist_ok=True)
    if content is not None:
        (run_dir / RDZV_PORT_FILE).write_text(content)
    body = "\n".join(line for line in head.splitlines() if line.startswith("export "))
    return subprocess.run(
        ["sh", "-c", body + "\n" + port_line + '\nprintf "%s" "$MASTER_PORT"'],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
    )


def test_the_launch_script_reads_the_port_and_refuses_a_missing_or_odd_one(tmp_path: Path) -> None:
    ok = _port_from_script(tmp_path, "41234")
    assert (ok.returncode, ok.stdout) == (0, "41234")
    (tmp_path / ".fleetrun" / "runs" / "job-1" / RDZV_PORT_FILE).unlink()
    missing = _port_from_script(tmp_path, None)
    assert missing.returncode == 2 and "no rendezvous port" in missing.stderr
    odd = _port_from_script(tmp_path, "1; touch pwned")
    assert odd.returncode == 2 and not (tmp_path / "pwned").exists()


def test_horovod_needs_no_port_from_fleetrun(tmp_path: Path) -> None:
    launcher = HorovodLauncher(cluster_ssh.ClusterKey("k", "ssh-ed25519 AAAA t", "t"), "echo\n")
    plan = launcher.plan(spec(tmp_path, launcher="horovod"), sample_inventory(3, gpus=0, user="u"), "job-1")
    assert plan.rdzv_port is None
    assert all(RDZV_PORT_FILE not in (n.launch_script or "") for n in plan.nodes)


def test_runner_sends_the_port_claimed_on_the_head_to_every_starting_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_on_fake_fleet(tmp_path, monkeypatch, JobScript(steps=2), inventory=fake_inventory(3))
    assert run.summary.outcome == "succeeded"
    head = run.fleet.nodes["n0"]
    assert any("FLEETRUN_RDZV_PORT" in c for c in head.commands), "the head was asked for a port"
    for name, node in run.fleet.nodes.items():
        assert node.files.get(RDZV_PORT_FILE) == "40123", name
        if name != "n0":
            assert not any("FLEETRUN_RDZV_PORT" in c for c in node.commands), "only the head picks"


def test_port_probe_binds_the_given_address_and_reports_a_usable_port() -> None:
    out = subprocess.run(
        ["sh", "-c", probe_command("python3", "127.0.0.1", want_port=True, want_gpus=False)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    answer = parse_probe(out)
    assert answer.port is not None and 1024 <= answer.port <= 65535
    assert answer.me == pwd.getpwuid(os.getuid()).pw_name
    with socket.socket() as s:  # released: the run's torchrun can bind it
        s.bind(("127.0.0.1", answer.port))


# -- gpus: [..] ------------------------------------------------------------------------------------
def host(**kw: object) -> Host:
    return Host.model_validate(
        {"name": "h", "address": "10.0.0.1", "user": "u", "host_key": SAMPLE_HOST_KEYS[0], **kw}
    )


def test_gpus_list_sets_cuda_visible_devices_and_auto_procs(tmp_path: Path) -> None:
    h = host(gpus=[2, 0])
    assert (h.gpu_count, h.gpu_indices) == (2, [2, 0])
    assert (host(gpus=4).gpu_count, host(gpus=4).gpu_indices) == (4, None)
    inv = sample_inventory(2, gpus=0, user="u")
    hosts = [inv.hosts[0].model_copy(update={"gpus": [1, 3]}), inv.hosts[1]]
    inv = inv.model_copy(update={"hosts": hosts})
    plan = make_plan(spec(tmp_path, nodes=2), inv, run_id="job-1")
    assert plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert "--nproc-per-node=2" in (plan.nodes[0].command or "")
    assert "CUDA_VISIBLE_DEVICES" not in plan.nodes[1].env, "a count restricts nothing"


@pytest.mark.parametrize(
    "bad",
    [[], [0, 0], [-1], [1024], [True], ["0"], [0.5], 1025, -1, "all", [0] * 1025],
)
def test_gpus_field_refuses_what_is_not_a_count_or_unique_indices(bad: object) -> None:
    with pytest.raises(ValidationError, match="gpus"):
        host(gpus=bad)


# -- busy GPUs ------------------------------------------------------------------------------------
PROBE_OUT = (
    "FLEETRUN_ME=alice\n"
    "G 0, GPU-aaaa\nG 1, GPU-bbbb\n"
    "A GPU-aaaa, 4242, 10240, bob\n"
    "A GPU-bbbb, 5151, 2048, alice\n"
    "FLEETRUN_RDZV_PORT=40001\n"
)


def test_other_users_process_is_named_with_user_pid_memory_and_gpu() -> None:
    answer = parse_probe(PROBE_OUT)
    assert answer.port == 40001 and answer.me == "alice" and answer.gpus == {"GPU-aaaa": 0, "GPU-bbbb": 1}
    assert busy_gpus(answer, None) == ["GPU 0 is busy: user bob, pid 4242, 10240 MiB"]
    assert busy_gpus(answer, [1]) == [], "GPU 0 is not this run's; alice's own process never counts"
    assert busy_gpus(answer, [0, 1]) == ["GPU 0 is busy: user bob, pid 4242, 10240 MiB"]


def test_hostile_nvidia_smi_output_is_bounded_and_never_trusted() -> None:
    hostile = (
        "FLEETRUN_ME=\x1b[31mroot\n"  # not a user name: nobody counts as us
        "G 0, GPU-aaaa\nG x, GPU-cccc\nG 1, GPU-$(reboot)\n"
        "A GPU-aaaa, 12; rm -rf /, 5, eve\n"  # pid not a number: skipped
        "A GPU-aaaa, 99, [N/A], \x1b]0;pwned\x07\n"  # memory unknown, user not a name
        "A GPU-zzzz, 100, 1, eve\n"  # a GPU the node did not list: busy, named by uuid
        "A GPU-aaaa, 101, 1, eve, extra\n"
        "FLEETRUN_RDZV_PORT=80\n" + "A GPU-aaaa, 7, 1, mallory\n" * 5000
    )
    answer = parse_probe(hostile)
    assert answer.me == "" and answer.port is None and answer.gpus == {"GPU-aaaa": 0}
    problems = busy_gpus(answer, [0])
    assert problems[0] == "GPU 0 is busy: user (unknown user), pid 99, unknown memory"
    assert problems[1] == "GPU GPU-zzzz is busy: user eve, pid 100, 1 MiB"
    assert len(problems) <= 2048 and all("\x1b" not in p and "rm" not in p for p in problems)
    assert parse_probe("FLEETRUN_RDZV_PORT=40000; rm -rf /\n").port is None
    assert parse_probe("").apps == () and busy_gpus(ProbeAnswer(), None) == []


def test_gpu_probe_runs_a_stand_in_nvidia_smi_and_reads_the_owner_from_ps(tmp_path: Path) -> None:
    """The node-side shell: ``FLEETRUN_NVIDIA_SMI`` names the stand-in; pid 1's owner comes from ps."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-gpu=*) echo "0, GPU-aaaa"; echo "1, GPU-bbbb";; '
        '--query-compute-apps=*) echo "GPU-bbbb, 1, 3072";; esac\n'
    )
    smi.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", probe_command("python3", "127.0.0.1", want_port=False, want_gpus=True)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FLEETRUN_NVIDIA_SMI": str(smi)},
    ).stdout
    answer = parse_probe(out)
    owner = pwd.getpwuid(os.stat("/proc/1").st_uid).pw_name
    assert answer.gpus == {"GPU-aaaa": 0, "GPU-bbbb": 1}
    assert answer.apps == (GpuApp("GPU-bbbb", 1, 3072, owner),)
    as_other = ProbeAnswer(me="someone-else", gpus=answer.gpus, apps=answer.apps)
    assert busy_gpus(as_other, [1]) == [f"GPU 1 is busy: user {owner}, pid 1, 3072 MiB"]
    missing = subprocess.run(
        ["sh", "-c", probe_command("python3", "127.0.0.1", want_port=False, want_gpus=True)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FLEETRUN_NVIDIA_SMI": str(tmp_path / "absent")},
    ).stdout
    assert parse_probe(missing).apps == (), "no nvidia-smi: no GPUs, nothing to check"


def test_a_busy_gpu_refuses_the_start_unless_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = JobScript(steps=2, nodes={"n1": NodeScript(busy_gpu_user="bob")})
    run = run_on_fake_fleet(tmp_path, monkeypatch, job, inventory=fake_inventory(2))
    assert (run.summary.outcome, run.summary.rule, run.summary.failed_nodes) == (
        "failed",
        "claim_failed",
        ("n1",),
    )
    assert "GPU 0 is busy: user bob, pid 777, 5120 MiB" in run.summary.reason
    assert "--allow-busy-gpus" in run.summary.reason
    assert not any(node.launched for node in run.fleet.nodes.values())
    (tmp_path / "b").mkdir()
    allowed = run_on_fake_fleet(
        tmp_path / "b", monkeypatch, job, inventory=fake_inventory(2), allow_busy_gpus=True
    )
    assert allowed.summary.outcome == "succeeded"
