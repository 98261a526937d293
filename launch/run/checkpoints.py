"""Before a later attempt starts: make the newest complete checkpoint reachable from every node.

With a bucket, the checkpoint helper on the nodes downloads it (``fleetrun_checkpoint.latest``).
Without one (the local fleet, lab machines), the only copies are on the nodes that wrote them,
and rank 0 of the next attempt may land on a fresh replacement node or on a survivor that never
held one (rank 0 writes; its node may be the one lost). So the laptop asks every node of the next
attempt which complete checkpoints it holds (a manifest whose file sizes match), takes the newest
one anywhere, copies it (rsync through this machine, hardened like the pull) to the nodes that
lack it, under a temporary name renamed into place, and tells every node to resume from it
(``FLEETRUN_RESUME_FROM``). Sharded checkpoints (``rank-<R>/`` parts) are left to the bucket.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

from launch.errors import HostError
from launch.job.inventory import Host
from launch.planning import remote_layout as layout
from launch.planning.launchers.base import CHECKPOINTS
from launch.reports.safe_text import clean
from launch.run.artifacts import rsync_error, rsync_pull
from launch.transport.openssh import jump_slot
from launch.transport.ssh import Fleet, NodeConnection, openssh_command

MAX_STEPS = 1000
LIST_SCRIPT = r"""
import json, os, sys
root = os.path.expanduser(sys.argv[1])
found = []
try:
    names = os.listdir(root)
except OSError:
    names = []
for name in names:
    if not name.startswith("step-") or not name[5:].isdigit():
        continue
    path = os.path.join(root, name)
    try:
        with open(os.path.join(path, "MANIFEST.json"), "rb") as fh:
            manifest = json.loads(fh.read(1 << 20))
        files = manifest["files"]
        ok = bool(files) and all(
            "/" not in f and f not in (".", "..")
            and os.path.getsize(os.path.join(path, f)) == int(info["size"])
            for f, info in files.items()
        )
        if ok and int(manifest["step"]) == int(name[5:]):
            found.append(int(name[5:]))
    except Exception:
        pass
print(json.dumps(sorted(found, reverse=True)[:1000]))
"""


def checkpoint_dir(run_id: str) -> str:
    """The run's checkpoint directory on a node, relative to the node user's home."""
    return f"{layout.rundir(run_id)}/{CHECKPOINTS}"


def parse_steps(text: str) -> list[int]:
    """A node's answer (untrusted): a JSON list of step numbers, newest first; anything else: []."""
    lines = text.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else []
    except ValueError:
        return []
    if not isinstance(data, list):
        return []
    return [s for s in data[:MAX_STEPS] if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 10**18]


def complete_steps(fleet: Fleet, hosts: list[Host], run_id: str) -> dict[str, list[int]]:
    """Complete checkpoint steps per node (a node that does not answer holds none)."""
    script = f"-c {shlex.quote(LIST_SCRIPT)} {shlex.quote('~/' + checkpoint_dir(run_id))}"

    def ask(conn: NodeConnection) -> list[int]:
        # the inventory's interpreter, as the doctor and the claim use (the node agent still runs python3)
        result = conn.run(f"{shlex.quote(conn.host.python)} {script}", timeout=60)
        return parse_steps(result.stdout[-65536:]) if result.ok else []

    answers = fleet.map(ask, hosts=hosts, deadline=90)
    return {name: r if isinstance(r, list) else [] for name, r in answers.items()}


def newest(steps: dict[str, list[int]]) -> tuple[int, str] | None:
    """(step, a node holding it) of the newest complete checkpoint anywhere."""
    best: tuple[int, str] | None = None
    for node, found in sorted(steps.items()):
        if found and (best is None or max(found) > best[0]):
            best = (max(found), node)
    return best


def spread_latest(
    fleet: Fleet, hosts: list[Host], run_id: str, known_hosts: Path, staging: Path
) -> tuple[str | None, str]:
    """Copy the newest complete checkpoint to every node of ``hosts`` that lacks it.

    Returns (its path relative to the home, for ``FLEETRUN_RESUME_FROM``, or None when there is
    none) and a sentence for the operator. A node the copy fails on raises ``HostError``."""
    steps = complete_steps(fleet, hosts, run_id)
    found = newest(steps)
    if found is None:
        return None, "no complete checkpoint on any node: the next attempt starts from the beginning"
    step, holder = found
    remote = f"{checkpoint_dir(run_id)}/step-{step}"
    lacking = [h for h in hosts if step not in steps.get(h.name, [])]
    if not lacking:
        return remote, f"every node holds checkpoint step {step}"
    by_name = {h.name: h for h in hosts}
    local = staging / f"step-{step}"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    rsync_pull(by_name[holder], remote, local, known_hosts, what=f"could not copy checkpoint step {step}")

    def push(conn: NodeConnection) -> None:
        host = conn.host
        incoming = f"{checkpoint_dir(run_id)}/.incoming-step-{step}"
        prepared = conn.run(
            f'mkdir -p "$HOME/{incoming}" && chmod 700 "$HOME/{layout.rundir(run_id)}"', timeout=60
        )
        if not prepared.ok:
            raise HostError(host.name, f"cannot prepare {incoming}: {clean(prepared.stderr[-200:])}")
        argv = [
            "rsync",
            "-a",
            "--no-devices",
            "--no-specials",
            "--chmod=Du=rwx,go=,Fu=rw,go=",
            "-e",
            shlex.join(openssh_command(host, known_hosts)),
            f"{local}/",
            host.rsync_target(f"{incoming}/"),
        ]
        try:
            with jump_slot(host):
                sent = subprocess.run(
                    argv, capture_output=True, text=True, errors="replace", timeout=3600, check=False
                )
        except subprocess.TimeoutExpired:
            raise HostError(host.name, f"sending checkpoint step {step} timed out") from None
        if sent.returncode != 0:
            raise HostError(
                host.name,
                f"could not send checkpoint step {step}: {clean(rsync_error(sent.stderr, sent.returncode), 300)}",
            )
        moved = conn.run(f'rm -rf "$HOME/{remote}" && mv "$HOME/{incoming}" "$HOME/{remote}"', timeout=60)
        if not moved.ok:
            raise HostError(
                host.name, f"cannot move checkpoint step {step} into place: {clean(moved.stderr[-200:])}"
            )

    try:
        results = fleet.map(push, hosts=lacking, deadline=3700)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    for res in results.values():
        if isinstance(res, BaseException):
            raise res
    names = ", ".join(h.name for h in lacking)
    return remote, f"checkpoint step {step} copied from {holder} to {names} (no bucket holds it)"
