#!/bin/bash
# Packer provisioner for the baked fleetrun node image (images/packer/fleetrun-gpu.pkr.hcl).
# Does once, at bake time, what a node would otherwise do at first boot, and leaves the image
# without host keys or cloud-init state, so every instance runs its own cloud-init (which
# installs that node's pinned host key) exactly as on the stock deep-learning image.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# sshd: pinned-host-key-only and fan-out limits (the same drop-in cloud-init writes).
install -m 0644 /tmp/01-fleetrun.conf /etc/ssh/sshd_config.d/01-fleetrun.conf
install -m 0755 /tmp/fleetrun-bootstrap /usr/local/sbin/fleetrun-bootstrap

# Tools the launcher uses on nodes.
apt-get update -q
apt-get install -y -q --no-install-recommends rsync iproute2 procps python3-venv
apt-get clean
rm -rf /var/lib/apt/lists/*

cat > /etc/security/limits.d/90-fleetrun.conf <<'LIMITS'
*    soft nofile 1048576
*    hard nofile 1048576
LIMITS

# GCP: keep the guest agent from replacing the host key cloud-init installs.
if [ -d /etc/default ] && systemctl list-unit-files google-guest-agent.service > /dev/null 2>&1; then
    printf '[InstanceSetup]\nset_host_keys = false\n' > /etc/default/instance_configs.cfg
fi

# The torch-capable Python must be there (the deep-learning images ship it).
found=""
for candidate in /opt/pytorch/bin/python3 /opt/conda/bin/python3 /usr/bin/python3; do
    if [ -x "$candidate" ] && "$candidate" -c 'import torch' 2> /dev/null; then
        found=$candidate
        break
    fi
done
if [ -z "$found" ]; then
    echo "no Python with torch in this image" >&2
    exit 1
fi
echo "torch python: $found"

# NVML's Python bindings for the GPU health reader (NVML first, nvidia-smi its fallback).
if ! "$found" -c 'import pynvml' 2> /dev/null; then
    "$found" -m pip install -q 'nvidia-ml-py>=12.535'
fi

# No host keys and no cloud-init state in the image: each instance gets its own.
rm -f /etc/ssh/ssh_host_*
cloud-init clean --logs
truncate -s 0 /etc/machine-id
