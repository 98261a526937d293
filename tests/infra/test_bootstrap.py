"""The cloud-init user data and the bootstrap script in images/cloud-init/."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from infra.bootstrap import (
    AWS_USER_DATA_LIMIT,
    BOOTSTRAP_SCRIPT,
    SSHD_DROP_IN,
    CloudFile,
    NodeBootstrap,
    parse_user_data,
    render_user_data,
)

IMAGES = BOOTSTRAP_SCRIPT.parent.parent
PACKER_DIR = IMAGES / "packer"


def _keypair() -> tuple[str, str]:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode() + "\n"


def _node(**overrides: object) -> NodeBootstrap:
    private, public = _keypair()
    values: dict[str, object] = dict(
        cluster_id="fr-dev-abc123",
        cloud="aws",
        node_name="fr-dev-abc123-node3",
        rank=3,
        gpus=8,
        ssh_user="ubuntu",
        authorized_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorKey op@laptop",
        host_private_key=private,
        host_public_key=public,
        bucket="fr-dev-abc123-artifacts-x1",
        bucket_url="s3://fr-dev-abc123-artifacts-x1",
    )
    values.update(overrides)
    return NodeBootstrap(**values)  # type: ignore[arg-type]


def test_user_data_installs_the_pinned_host_key_and_only_it() -> None:
    node = _node()
    doc = parse_user_data(render_user_data(node))
    assert doc["ssh_keys"]["ed25519_private"].strip() == node.host_private_key.strip()
    assert doc["ssh_keys"]["ed25519_public"] == node.host_public_key.strip()
    assert doc["ssh_deletekeys"] is True and doc["ssh_genkeytypes"] == []
    files = {f["path"]: f for f in doc["write_files"]}
    assert files["/etc/fleetrun/pinned_host_key.pub"]["content"].strip() == node.host_public_key.strip()
    assert (
        "HostKey /etc/ssh/ssh_host_ed25519_key" in files["/etc/ssh/sshd_config.d/01-fleetrun.conf"]["content"]
    )


def test_user_data_authorizes_only_the_operator_key() -> None:
    node = _node(ssh_user="trainer")
    doc = parse_user_data(render_user_data(node))
    (user,) = doc["users"]
    assert user["name"] == "trainer" and user["ssh_authorized_keys"] == [node.authorized_key]
    assert user["lock_passwd"] is True and doc["ssh_pwauth"] is False and doc["disable_root"] is True


def test_node_env_carries_rank_and_cluster() -> None:
    doc = parse_user_data(render_user_data(_node()))
    env = {f["path"]: f["content"] for f in doc["write_files"]}["/etc/fleetrun/node.env"]
    assert "FLEETRUN_NODE_RANK=3\n" in env
    # The size of the cluster changes; user data must not (the launcher passes NNODES at run time).
    assert "NUM_NODES" not in env
    assert (
        "FLEETRUN_GPUS_PER_NODE=8\n" in env and "FLEETRUN_BUCKET_URL=s3://fr-dev-abc123-artifacts-x1\n" in env
    )
    assert "FLEETRUN_CHECKPOINTS_URL=s3://fr-dev-abc123-artifacts-x1/checkpoints/fr-dev-abc123\n" in env
    assert doc["runcmd"] == [["/usr/local/sbin/fleetrun-bootstrap"]]


def test_cloud_specific_files_are_written() -> None:
    extra = CloudFile("/etc/default/instance_configs.cfg", "[InstanceSetup]\nset_host_keys = false\n")
    doc = parse_user_data(render_user_data(_node(extra_files=(extra,))))
    files = {f["path"]: f for f in doc["write_files"]}
    assert "set_host_keys = false" in files["/etc/default/instance_configs.cfg"]["content"]


def test_user_data_fits_ec2s_limit() -> None:
    size = len(render_user_data(_node()).encode())
    assert size < AWS_USER_DATA_LIMIT * 0.75, f"user data is {size} bytes; EC2 takes {AWS_USER_DATA_LIMIT}"


def test_sshd_drop_in_raises_fan_out_limits() -> None:
    lines = dict(
        line.split(None, 1)
        for line in SSHD_DROP_IN.read_text().splitlines()
        if line and not line.startswith("#")
    )
    start, rate, full = (int(x) for x in lines["MaxStartups"].split(":"))
    assert start >= 100 and full >= 200 and 0 < rate <= 100
    assert int(lines["MaxSessions"]) >= 100
    assert lines["PasswordAuthentication"] == "no" and lines["PermitRootLogin"] == "no"


def test_bootstrap_script_checks_what_the_issue_asks() -> None:
    script = BOOTSTRAP_SCRIPT.read_text()
    for needle in (
        "nvidia-smi",
        "FLEETRUN_NODE_RANK",
        "/etc/fleetrun/node_rank",
        "import torch",
        "NCCL_SOCKET_IFNAME",
    ):
        assert needle in script
    subprocess.run(["bash", "-n", str(BOOTSTRAP_SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shell_scripts_pass_shellcheck() -> None:
    """Every shell script under images/ (bootstrap, Packer provisioning, the Horovod build)."""
    scripts = sorted(IMAGES.rglob("*.sh"))
    assert BOOTSTRAP_SCRIPT in scripts and PACKER_DIR / "provision.sh" in scripts
    subprocess.run(["shellcheck", *map(str, scripts)], check=True)


def test_baked_image_and_container_definitions() -> None:
    template = (PACKER_DIR / "fleetrun-gpu.pkr.hcl").read_text()
    for path in re.findall(r'"\$\{path\.root\}/([^"]+)"', template):
        assert (PACKER_DIR / path).resolve().is_file(), path
    assert 'source "amazon-ebs"' in template and 'source "googlecompute"' in template
    assert "rm -f /etc/ssh/ssh_host_*" in (PACKER_DIR / "provision.sh").read_text()  # no baked host keys
    dockerfile = (IMAGES / "docker" / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE=(\S+)$", dockerfile, re.M)
    assert base and base.group(1).startswith("pytorch/pytorch:")  # the official PyTorch image
    assert "FROM ${BASE}" in dockerfile
