"""What a run claims on shared machines just before it starts: a free rendezvous port on the head
and the GPUs it will use. Pure: the node-side shell text and the parsing of its answer.

One cheap command per node, right before the start (``launch.run.stages.claim``), prints:

- on the head, with ``rdzv_port: auto``: ``FLEETRUN_RDZV_PORT=<n>``, a port the kernel handed out
  for a socket bound to the head's *private* address with port 0, then released;
- on every node with ``nvidia-smi``: the GPUs (``G index,uuid``) and the compute processes on them
  (``A uuid,pid,used_memory,user``), the user read from ``ps`` on the node;
- ``FLEETRUN_ME=<user>``: the node user, whose own processes never count as busy.

The port is released before torchrun binds it (the small race): another process would have to
bind exactly that port in the second or two between the probe and the start. The kernel hands out
ephemeral ports in turn, so two fleetrun runs probing at the same moment get different ports, and
the loser of a real race fails at once with EADDRINUSE in its node log, never silently joins
another run's rendezvous (the rendezvous id is the run id). A probe at plan time on the laptop
could not know the head's ports at all, and a fixed 29500 collides on the second run every time.

Everything the node prints is untrusted: bounded, parsed strictly, malformed lines ignored.
``FLEETRUN_NVIDIA_SMI`` in the *node's* environment names another nvidia-smi: a stand-in for
tests (fleetrun never sets it; a node user who sets it only misleads their own check).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

MAX_PROBE_LINES = 2048
MAX_GPUS_LISTED = 1024
MAX_APPS_LISTED = 1024
PORT_KEY = "FLEETRUN_RDZV_PORT="
ME_KEY = "FLEETRUN_ME="
_UUID_RE = re.compile(r"[A-Za-z0-9-]{1,96}")
_USER_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}")

PORT_PROBE = (
    "import socket, sys; a = sys.argv[1]; "
    "s = socket.socket(socket.AF_INET6 if ':' in a else socket.AF_INET, socket.SOCK_STREAM); "
    "s.bind((a, 0)); print('" + PORT_KEY + "%d' % s.getsockname()[1]); s.close()"
)

GPU_PROBE = (
    'SMI="${FLEETRUN_NVIDIA_SMI:-nvidia-smi}"; '
    'if command -v "$SMI" >/dev/null 2>&1; then '
    f'"$SMI" --query-gpu=index,uuid --format=csv,noheader 2>/dev/null | head -n {MAX_GPUS_LISTED} '
    "| sed 's/^/G /'; "
    '"$SMI" --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits 2>/dev/null '
    f"| head -n {MAX_APPS_LISTED} | while IFS=, read -r uuid pid mem rest; do "
    'pid=$(printf %s "$pid" | tr -cd 0-9 | cut -c1-10); '
    'user=$(ps -o user= -p "${pid:-0}" 2>/dev/null | head -n 1); '
    'printf "A %s,%s,%s,%s\\n" "$uuid" "$pid" "$mem" "$user"; done; fi'
)


def probe_command(python: str, private_address: str, want_port: bool, want_gpus: bool) -> str:
    """The one command a node runs before the start (``sh`` text; words fleetrun adds are quoted)."""
    parts = [f"echo {ME_KEY}$(id -un)"]
    if want_gpus:
        parts.append(GPU_PROBE)
    if want_port:
        parts.append(f"{shlex.quote(python)} -c {shlex.quote(PORT_PROBE)} {shlex.quote(private_address)}")
    return "; ".join(parts)


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU, as the node's nvidia-smi and ps reported it."""

    gpu_uuid: str
    pid: int
    used_mib: int | None
    user: str


@dataclass(frozen=True)
class ProbeAnswer:
    me: str = ""
    port: int | None = None
    gpus: dict[str, int] = field(default_factory=dict)
    """uuid -> device index"""
    apps: tuple[GpuApp, ...] = ()


def _int(text: str, low: int, high: int) -> int | None:
    text = text.strip()
    if not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if low <= value <= high else None


def parse_probe(text: str) -> ProbeAnswer:
    """The probe's output, strictly: lines that are not exactly what the probe prints are skipped."""
    me, port = "", None
    gpus: dict[str, int] = {}
    apps: list[GpuApp] = []
    for line in text.splitlines()[:MAX_PROBE_LINES]:
        line = line.strip()
        if line.startswith(ME_KEY):
            user = line[len(ME_KEY) :]
            me = user if _USER_RE.fullmatch(user) else ""
        elif line.startswith(PORT_KEY):
            port = _int(line[len(PORT_KEY) :], 1024, 65535)
        elif line.startswith("G "):
            fields = [f.strip() for f in line[2:].split(",")]
            if len(fields) == 2 and _UUID_RE.fullmatch(fields[1]):
                index = _int(fields[0], 0, MAX_GPUS_LISTED - 1)
                if index is not None and len(gpus) < MAX_GPUS_LISTED:
                    gpus[fields[1]] = index
        elif line.startswith("A "):
            fields = [f.strip() for f in line[2:].split(",")]
            if len(fields) != 4 or not _UUID_RE.fullmatch(fields[0]):
                continue
            pid = _int(fields[1], 1, 2**31)
            if pid is None or len(apps) >= MAX_APPS_LISTED:
                continue
            user = fields[3] if _USER_RE.fullmatch(fields[3]) else "(unknown user)"
            apps.append(GpuApp(fields[0], pid, _int(fields[2], 0, 2**40), user))
    return ProbeAnswer(me=me, port=port, gpus=gpus, apps=tuple(apps))


def busy_gpus(answer: ProbeAnswer, wanted: list[int] | None) -> list[str]:
    """One line per process of another user on a GPU this run would use (``wanted``: the host's
    ``gpus: [..]`` indices, None: all of them). A process on a GPU the node did not list counts
    as busy too (unknown index: it may be one of ours)."""
    problems = []
    for app in answer.apps:
        if answer.me and app.user == answer.me:
            continue
        index = answer.gpus.get(app.gpu_uuid)
        if wanted is not None and index is not None and index not in wanted:
            continue
        memory = f"{app.used_mib} MiB" if app.used_mib is not None else "unknown memory"
        where = f"GPU {index}" if index is not None else f"GPU {app.gpu_uuid}"
        problems.append(f"{where} is busy: user {app.user}, pid {app.pid}, {memory}")
    return problems
