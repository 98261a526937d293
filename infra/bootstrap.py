"""Each node's cloud-init user data, rendered from the files in ``images/cloud-init/`` (package data).

Pure (PyYAML only): the Pulumi program calls ``render_user_data`` inside an ``apply`` once the
node's generated host key is known (rendering text there is fine; creating resources is not).

Why cloud-init carries the host key: cloud-init installs ``ssh_keys`` before sshd first starts,
so the very first connection already meets the key that ``pulumi up`` exported and ``launch``
pinned in known_hosts. No trust on first use, ever. The cost: the private host key sits in the
instance's user data (readable from the instance metadata service on the node, and by cloud
principals allowed to read instance attributes) and in the Pulumi state as a secret.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetrun_images import runtime_file

IMAGES_DIR = runtime_file("cloud-init")  # images/cloud-init, as installed
BOOTSTRAP_SCRIPT = IMAGES_DIR / "fleetrun-bootstrap.sh"
SSHD_DROP_IN = IMAGES_DIR / "sshd-fleetrun.conf"
AWS_USER_DATA_LIMIT = 16 * 1024
"""EC2 refuses user data above 16 KB (before base64); GCP metadata allows 256 KB."""


@dataclass(frozen=True)
class CloudFile:
    """A file the node needs that only one cloud knows about (e.g. GCP guest-agent settings)."""

    path: str
    content: str
    permissions: str = "0644"


@dataclass(frozen=True)
class NodeBootstrap:
    cluster_id: str
    cloud: str
    node_name: str
    rank: int
    gpus: int
    ssh_user: str
    authorized_key: str
    host_private_key: str
    host_public_key: str
    bucket: str
    bucket_url: str
    """The bucket as tools address it (``s3://name``, ``gs://name``)."""
    extra_files: tuple[CloudFile, ...] = ()


# libyaml's emitter when PyYAML has it (10x faster: user data is rendered once per node).
_BaseDumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _LiteralDumper(_BaseDumper):  # type: ignore[valid-type, misc]
    """Dumps multi-line strings as ``|`` blocks, so the user data stays readable on the node."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_representer)


@functools.cache
def _image_file(path: Path) -> str:
    return path.read_text()


def node_env(b: NodeBootstrap) -> str:
    """``/etc/fleetrun/node.env``: what a job on this node may need to know about the cluster.

    Only what never changes for this node. The cluster's size is deliberately absent: user data
    is read once, at first boot, and changing it rewrites the instance (AWS stops and starts it,
    which a one-time spot instance cannot survive), so anything that depends on the node count
    would restart every node when the cluster grows. The launcher passes the size at run time
    (``NNODES``, ``WORLD_SIZE``, ``FLEETRUN_NODE_IPS``).
    """
    values = {
        "FLEETRUN_CLUSTER_ID": b.cluster_id,
        "FLEETRUN_CLOUD": b.cloud,
        "FLEETRUN_NODE_NAME": b.node_name,
        "FLEETRUN_NODE_RANK": str(b.rank),
        "FLEETRUN_GPUS_PER_NODE": str(b.gpus),
        "FLEETRUN_SSH_USER": b.ssh_user,
        "FLEETRUN_BUCKET": b.bucket,
        "FLEETRUN_BUCKET_URL": b.bucket_url,
        # One bucket, three prefixes: inputs, checkpoints and metrics of this cluster's jobs.
        "FLEETRUN_DATA_URL": f"{b.bucket_url}/data",
        "FLEETRUN_CHECKPOINTS_URL": f"{b.bucket_url}/checkpoints/{b.cluster_id}",
        "FLEETRUN_METRICS_URL": f"{b.bucket_url}/metrics/{b.cluster_id}",
    }
    return "".join(f"{k}={v}\n" for k, v in values.items())


def cloud_config(b: NodeBootstrap) -> dict[str, Any]:
    """The cloud-config document as data (tests inspect it; ``render_user_data`` dumps it)."""
    host_public = " ".join(b.host_public_key.split()[:2])
    files = [
        {
            "path": "/etc/ssh/sshd_config.d/01-fleetrun.conf",
            "content": _image_file(SSHD_DROP_IN),
            "permissions": "0644",
        },
        {"path": "/etc/fleetrun/node.env", "content": node_env(b), "permissions": "0644"},
        {"path": "/etc/fleetrun/pinned_host_key.pub", "content": host_public + "\n", "permissions": "0644"},
        {
            "path": "/usr/local/sbin/fleetrun-bootstrap",
            "content": _image_file(BOOTSTRAP_SCRIPT),
            "permissions": "0755",
        },
        *({"path": f.path, "content": f.content, "permissions": f.permissions} for f in b.extra_files),
    ]
    return {
        # The pinned host key, installed before sshd starts; no other host key is generated.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {
            "ed25519_private": b.host_private_key.strip() + "\n",
            "ed25519_public": host_public,
        },
        "ssh_pwauth": False,
        "disable_root": True,
        "users": [
            {
                "name": b.ssh_user,
                "groups": ["adm", "sudo"],
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "shell": "/bin/bash",
                "lock_passwd": True,
                "ssh_authorized_keys": [b.authorized_key.strip()],
            }
        ],
        "write_files": files,
        "runcmd": [["/usr/local/sbin/fleetrun-bootstrap"]],
    }


def render_user_data(b: NodeBootstrap) -> str:
    text = "#cloud-config\n" + yaml.dump(cloud_config(b), Dumper=_LiteralDumper, sort_keys=False, width=4096)
    return text


def parse_user_data(text: str) -> dict[str, Any]:
    """The cloud-config document back from rendered user data (for tests and debugging)."""
    if not text.startswith("#cloud-config\n"):
        raise ValueError("user data does not start with #cloud-config")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("user data is not a cloud-config mapping")
    return data
