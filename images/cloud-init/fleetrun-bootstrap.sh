#!/bin/bash
# fleetrun node bootstrap: run once by cloud-init (runcmd) on a node's first boot.
#
# cloud-init has already, before sshd started: installed the pinned SSH host key, the operator's
# authorized key, the sshd drop-in (MaxStartups/MaxSessions) and /etc/fleetrun/node.env (cluster
# id, rank, node count, GPUs, bucket). This script checks and finishes the node:
#   1. sshd serves the pinned host key (and picks up the drop-in),
#   2. the GPU driver sees the expected GPUs,
#   3. a Python with torch is on PATH for the login user,
#   4. the node's rank and network interface are written where jobs find them,
# then writes /var/lib/fleetrun/ready. Results are in /var/lib/fleetrun/bootstrap.status
# (key=value lines) and the log in /var/log/fleetrun-bootstrap.log. A failed check is recorded,
# never hidden; the launcher reads the status before starting a job.
set -uo pipefail

ENV_FILE=/etc/fleetrun/node.env
STATE_DIR=/var/lib/fleetrun
STATUS="$STATE_DIR/bootstrap.status"
mkdir -p "$STATE_DIR"
exec > >(tee -a /var/log/fleetrun-bootstrap.log) 2>&1
set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a
: > "$STATUS"
status() { echo "$1=$2" >> "$STATUS"; echo "fleetrun-bootstrap: $1=$2"; }

# -- 1. sshd and the pinned host key ---------------------------------------------------------
key_of() { awk '{print $1" "$2}' "$1" 2>/dev/null; }
expected=$(key_of /etc/fleetrun/pinned_host_key.pub)
if [ "$(key_of /etc/ssh/ssh_host_ed25519_key.pub)" != "$expected" ]; then
    # Something regenerated the host keys after cloud-init installed ours: install them again.
    cloud-init single --name ssh --frequency always || true
fi
if [ "$(key_of /etc/ssh/ssh_host_ed25519_key.pub)" = "$expected" ]; then
    status host_key pinned
else
    status host_key MISMATCH  # the launcher will refuse this node (strict host key checking)
fi
if sshd -t; then
    systemctl try-reload-or-restart ssh 2>/dev/null || systemctl try-reload-or-restart sshd || true
    status sshd ok
else
    status sshd config-error
fi

# Many files open at once for data loaders and fan-out (SkyPilot #3002: ~75 nodes).
cat > /etc/security/limits.d/90-fleetrun.conf <<'LIMITS'
*    soft nofile 1048576
*    hard nofile 1048576
LIMITS

# -- 2. GPUs and driver ----------------------------------------------------------------------
want=${FLEETRUN_GPUS_PER_NODE:-0}
if [ "$want" -gt 0 ]; then
    found=0
    # The driver can still be installing on first boot (GCP's install-nvidia-driver): wait.
    for _ in $(seq 1 60); do
        if command -v nvidia-smi > /dev/null; then
            found=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
            [ "$found" -ge "$want" ] && break
        fi
        sleep 10
    done
    if [ "$found" -eq "$want" ]; then
        status gpus "ok:$found"
        status nvidia_driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
    else
        status gpus "MISMATCH:expected=$want,found=$found"
    fi
else
    status gpus none-expected
fi

# -- 3. Python with torch --------------------------------------------------------------------
# The deep-learning images ship torch in their own environment; use it rather than download
# gigabytes again. Other images get a venv with torch.
py=""
for candidate in /opt/pytorch/bin/python3 /opt/conda/bin/python3 /opt/conda/envs/pytorch/bin/python3 /usr/bin/python3; do
    if [ -x "$candidate" ] && "$candidate" -c 'import torch' 2> /dev/null; then
        py=$candidate
        break
    fi
done
if [ -z "$py" ]; then
    command -v apt-get > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
    if python3 -m venv /opt/fleetrun/venv && /opt/fleetrun/venv/bin/pip install -q torch numpy; then
        py=/opt/fleetrun/venv/bin/python3
    fi
fi
if [ -n "$py" ]; then
    ln -sf "$py" /usr/local/bin/fleetrun-python
    echo "$py" > /etc/fleetrun/python
    # Login and non-interactive SSH sessions (pam_env) find this python3 first.
    bindir=$(dirname "$py")
    if [ "$bindir" != /usr/bin ] && ! grep -q "^PATH=\"$bindir:" /etc/environment; then
        current=$(sed -n 's/^PATH="\(.*\)"$/\1/p' /etc/environment)
        sed -i '/^PATH=/d' /etc/environment
        echo "PATH=\"$bindir:${current:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}\"" >> /etc/environment
    fi
    status python "$py torch=$("$py" -c 'import torch; print(torch.__version__)')"
    # NVML's Python bindings (nvidia-ml-py, pure Python): the GPU health reader reads through NVML
    # first and falls back to nvidia-smi without them (fab doctor says which answered).
    if ! "$py" -c 'import pynvml' 2> /dev/null; then
        "$py" -m pip install -q 'nvidia-ml-py>=12.535' > /dev/null 2>&1 || true
    fi
    if "$py" -c 'import pynvml' 2> /dev/null; then status nvml pynvml; else status nvml MISSING; fi
else
    status python MISSING
fi

# -- 4. Rank, interface, environment for jobs ------------------------------------------------
echo "$FLEETRUN_NODE_RANK" > /etc/fleetrun/node_rank
iface=$(ip -o route get 1.1.1.1 2> /dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") print $(i + 1)}')
if [ -n "$iface" ] && ! grep -q '^FLEETRUN_IFACE=' "$ENV_FILE"; then
    # NCCL and Gloo must use the cluster interface, not docker0 or lo.
    printf 'FLEETRUN_IFACE=%s\nNCCL_SOCKET_IFNAME=%s\nGLOO_SOCKET_IFNAME=%s\n' "$iface" "$iface" "$iface" >> "$ENV_FILE"
fi
sed 's/^/export /' "$ENV_FILE" > /etc/profile.d/fleetrun.sh
status rank "$FLEETRUN_NODE_RANK"
status interface "${iface:-unknown}"

touch "$STATE_DIR/ready"
status finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
