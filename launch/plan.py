"""A launch plan: exactly what will run on each node, as data.

A launcher turns a job spec plus an inventory into a ``LaunchPlan``; a task runs that plan.
Because the plan is plain data, ``--dry-run`` prints it and tests assert on it without a network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launch.inventory import Host


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: its launch script, and the setup that must precede it."""

    host: Host
    node_rank: int
    env: dict[str, str]
    command: str
    launch_script: str
    setup_script: str
    setup_hash: str
    role: str = "worker"

    def describe(self) -> str:
        return f"{self.host.name} ({self.host.user}@{self.host.address}:{self.host.port}, node rank {self.node_rank}, {self.role})"


@dataclass(frozen=True)
class LaunchPlan:
    """The whole job: run id, nodes (head first), and which launcher made it."""

    run_id: str
    job: str
    launcher: str
    nodes: list[NodePlan]
    total_processes: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def render(self) -> str:
        """The dry-run text: per node, the exact setup and launch scripts that would run."""
        out = [
            f"# fleetrun plan for job {self.job!r}, run {self.run_id}",
            f"# launcher: {self.launcher}; nodes: {len(self.nodes)}; "
            f"processes: {self.total_processes if self.total_processes is not None else 'resolved on the nodes'}",
        ]
        out += [f"# note: {n}" for n in self.notes]
        for node in self.nodes:
            out.append("")
            out.append(f"## {node.describe()}")
            out.append(
                f"### setup (skipped when ~/.fleetrun/envs/{self.job}/.fleetrun-setup-hash = {node.setup_hash})"
            )
            out.append(node.setup_script.rstrip())
            out.append("### launch.sh (started detached by ~/.fleetrun/lib/fleetrun_node.py start)")
            out.append(node.launch_script.rstrip())
            out.append(f"### command: {node.command}")
        return "\n".join(out) + "\n"
