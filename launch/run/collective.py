"""``fab doctor --collective``: all-reduce and matmul through torchrun on groups of nodes.

The test script (``launch/nodelib/fleetrun_collective.py``) is written to each node's
``~/.fleetrun/`` over the doctor's own connections, then every node of a group runs
``python -m torch.distributed.run`` (the launcher ``fab train`` uses for torchrun jobs: static
rendezvous on the group's first node, one process per node; gloo on CPU, NCCL on GPU). Groups
measured at the same time use ports from the job's rendezvous port up. Where to look next is
decided by ``launch.rules.collective`` (bisection); this module only runs and collects.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from importlib import resources

from launch.job.inventory import Host
from launch.rules.collective import CollectiveReport, Group, GroupResult, locate, parse_result
from launch.transport.ssh import Fleet, NodeConnection

SCRIPT = ".fleetrun/fleetrun_collective.py"
GROUP_TIMEOUT_S = 240.0


def install_script(fleet: Fleet, hosts: Sequence[Host]) -> dict[str, str]:
    """The test script onto every node; errors by node name."""
    source = resources.files("launch.nodelib").joinpath("fleetrun_collective.py").read_bytes()

    def put(conn: NodeConnection) -> None:
        result = conn.run_with_input(
            f'mkdir -p "$HOME/.fleetrun" && cat > "$HOME/{SCRIPT}"', source, timeout=30
        )
        if not result.ok:
            raise RuntimeError(result.stderr.strip()[-300:] or f"exit {result.exit_code}")

    results = fleet.map(put, hosts=list(hosts), deadline=60)
    return {n: str(r) for n, r in results.items() if isinstance(r, BaseException)}


def group_command(host: Host, group: Sequence[Host], rank: int, port: int, env: Mapping[str, str]) -> str:
    head = group[0]
    address = head.private_address or head.address
    exports = {**env}
    if host.interface:
        exports.setdefault("GLOO_SOCKET_IFNAME", host.interface)
        exports.setdefault("NCCL_SOCKET_IFNAME", host.interface)
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(exports.items()))
    argv = [
        host.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(group)}",
        "--nproc-per-node=1",
        f"--node-rank={rank}",
        f"--master-addr={address}",
        f"--master-port={port}",
        "--max-restarts=0",
        f"$HOME/{SCRIPT}",
    ]
    quoted = " ".join(a if a.startswith("$HOME") else shlex.quote(a) for a in argv)
    return f'cd "$HOME" && env {prefix} {quoted} 2>&1'.replace("env  ", "env ")


def measurer(fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """The ``measure`` callback of ``locate``: run groups at once, each on its own port."""
    by_name = {h.name: h for h in hosts}

    def measure(groups: Sequence[Group]) -> dict[Group, GroupResult]:
        commands: dict[str, str] = {}
        heads: dict[str, Group] = {}
        for i, group in enumerate(groups):
            members = [by_name[n] for n in group]
            heads[members[0].name] = group
            for rank, host in enumerate(members):
                commands[host.name] = group_command(host, members, rank, port + i, env or {})
        results = fleet.map(
            lambda c: c.run(commands[c.host.name], timeout=GROUP_TIMEOUT_S),
            hosts=[by_name[n] for n in commands],
            deadline=GROUP_TIMEOUT_S + 30,
        )
        found: dict[Group, GroupResult] = {}
        for head, group in heads.items():
            value = results.get(head)
            if isinstance(value, BaseException) or value is None:
                found[group] = GroupResult(None, error=str(value)[:300])
                continue
            result = parse_result(value.stdout)
            if result.busbw_gbps is None:
                tail = " / ".join(value.stdout.strip().splitlines()[-2:])[-300:]
                result = GroupResult(None, error=f"{result.error} (exit {value.exit_code}: {tail})")
            found[group] = result
        return found

    return measure


def check(
    fleet: Fleet, hosts: Sequence[Host], port: int, env: Mapping[str, str] | None = None
) -> tuple[CollectiveReport, float]:
    """Install the script, measure the fleet, bisect to the slow node; the report and seconds."""
    started = time.monotonic()
    errors = install_script(fleet, hosts)
    usable = [h for h in hosts if h.name not in errors]
    report = locate([h.name for h in usable], measurer(fleet, usable, port, env))
    return report, time.monotonic() - started
