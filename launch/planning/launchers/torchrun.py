"""torchrun (as ``python -m torch.distributed.run``, which works whichever environment layer
holds torch's console scripts) with a c10d rendezvous at the head node's private address (TorchX's DDP shape).

With ``rank_start: fork`` (the default) the module is ``fleetrun_torchrun`` (the node library, on
the launch script's ``PYTHONPATH``): the same torchrun, whose ranks are forked from its agent once
torch is imported instead of each importing it again. Not in a container (``rank_start``).

Every node runs the same torchrun; ranks are agreed in the rendezvous. ``--local-addr`` pins the
address each agent advertises, so a hostname that resolves to 127.0.1.1 (common on lab machines)
cannot break the rendezvous; ``is_host`` marks which agent hosts the store.

With ``rdzv_port: auto`` the endpoint's port is ``$MASTER_PORT``, read by the launch script from
the port file the runner sent (a port found free on the head just before the start). What torch
cannot do: its ``TCPStore`` server binds the wildcard address (torch has no bind-address option for
the c10d store); every address fleetrun gives torchrun (endpoint, ``--local-addr``) is the private one.
"""

from __future__ import annotations

import re
import shlex

from launch.job.inventory import Inventory, bracketed, host_port
from launch.job.spec import JobSpec, torchrun_problems
from launch.planning.launchers.base import Launcher

PYTHON_PREFIX = re.compile(r"^\s*python3?\s+")
TORCHRUN_MODULES = {"fork": "fleetrun_torchrun", "exec": "torch.distributed.run"}
"""The module a node runs as torchrun, by the playbook's ``rank_start``."""


def entrypoint_tail(entrypoint: str) -> str:
    """torchrun's view of the entrypoint: ``-m pkg.mod args``, ``script.py args`` or ``--no-python cmd``.

    The tail stays shell text, exactly as the user wrote it, so ``$FLEETRUN_OUTPUT_DIR`` and quoting
    in a playbook's entrypoint mean what they would mean in a terminal.
    """
    argv = shlex.split(entrypoint)
    if argv[0] in ("python", "python3") and len(argv) >= 2:
        return PYTHON_PREFIX.sub("", entrypoint, count=1).strip()
    if argv[0].endswith(".py"):
        return entrypoint.strip()
    return "--no-python " + entrypoint.strip()


class TorchrunLauncher(Launcher):
    name = "torchrun"
    sagemaker_framework_params: dict[str, object] = {"sagemaker_torch_distributed_enabled": True}
    """SageMaker's ``torch_distributed`` distribution (torchrun on every node)."""

    @classmethod
    def check_spec(cls, spec: JobSpec) -> list[tuple[str, str]]:
        """``launch.job.spec.torchrun_problems``: checked when the playbook loads."""
        return torchrun_problems(spec)

    def node_command(self, spec: JobSpec, inventory: Inventory, node_rank: int, procs: int | None) -> str:
        head = inventory.head
        host = inventory.hosts[node_rank]
        words = [
            "python",
            "-m",
            TORCHRUN_MODULES[rank_start(spec, bool(inventory.fleet.rank_launch_lines(host.name)[1]))],
            f"--nnodes={nnodes(spec, len(inventory.hosts))}",
            "--nproc-per-node=" + (str(procs) if procs is not None else '"$NPROC"'),
            "--rdzv-backend=c10d",
            "--rdzv-endpoint="
            + (
                host_port(head.private_address, spec.rdzv_port)
                if isinstance(spec.rdzv_port, int)
                else f'{bracketed(head.private_address)}:"$MASTER_PORT"'
            ),
            '--rdzv-id="$FLEETRUN_RUN_ID"',
            f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}",
            f"--local-addr={host.private_address}",
            f"--max-restarts={spec.max_restarts}",
        ]
        return " ".join(words) + " " + entrypoint_tail(spec.entry_command())


def rank_start(spec: JobSpec, scheduled: bool = False) -> str:
    """The playbook's ``rank_start``, but ``exec`` in a container or when a scheduler starts the
    ranks (``scheduled``: Slurm's ``ranks_via: srun``): fleetrun's rank watch does not reach ranks
    that are not under the node's own wrapper, so a failed rank is known there only when its
    torchrun ends, and with forked ranks the torchrun of a node whose rank was killed ended after
    its peers' (their ranks fail on the lost peer at once): ``test_container_runs_fleet`` blamed
    the wrong node."""
    return "exec" if spec.container is not None or scheduled else spec.rank_start


def nnodes(spec: JobSpec, hosts: int) -> str:
    """``--nnodes``: ``MIN:MAX`` for an elastic job (``nodes: MIN:MAX``), else the host count.

    MAX is the hosts of this attempt: an attempt that goes on with the survivors of a lost node
    completes its rendezvous as soon as they have all joined, instead of waiting torchrun's last
    call for a node that will not come."""
    if spec.min_nodes is None:
        return str(hosts)
    return f"{min(spec.min_nodes, hosts)}:{hosts}"
