"""A launch plan: exactly what will run on each node, as data.

A launcher turns a job spec plus an inventory into a ``LaunchPlan``; a task runs that plan.
Because the plan is plain data, ``--dry-run`` prints it and tests assert on it without a network.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from launch.job.inventory import Host, host_port
from launch.reports.safe_text import clean
from launch.rules.recovery import RecoveryPolicy, describe_policy

MASK = "***"
"""What ``--dry-run`` and ``plan.txt`` show in place of a secret value."""


def export_line(key: str, value: str) -> str:
    """``export KEY='value'``: how every script fleetrun writes sets a literal variable.

    One function for the launchers and for ``LaunchPlan.render``'s masking, so the text that is
    masked is exactly the text that was written.
    """
    return f"export {key}={shlex.quote(value)}"


def home_export_line(key: str, home_relative: str) -> str:
    """``export KEY="$HOME"/'rest'``: a path under the node user's home, the rest quoted literally."""
    return f'export {key}="$HOME"/{shlex.quote(home_relative)}'


@dataclass(frozen=True)
class RemoteFile:
    """A small file fleetrun writes on a node before setup (path relative to the node user's home).

    ``secret`` files (a cluster-internal private key) are never printed by ``--dry-run``.
    """

    path: str
    content: str
    mode: int = 0o644
    secret: bool = False

    def describe(self) -> str:
        if self.secret:
            return f"~/{self.path} (mode {self.mode:o}, secret: {len(self.content)} bytes, not shown)"
        return f"~/{self.path} (mode {self.mode:o}):\n{self.content.rstrip()}"


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: its launch script, and the setup that must precede it.

    ``launch_script`` is None on nodes whose processes are started by the head node's launcher
    (``horovodrun`` SSHes to the workers itself); fleetrun still syncs, sets up, watches and stops them.
    """

    host: Host
    node_rank: int
    env: dict[str, str]
    command: str | None
    launch_script: str | None
    setup_script: str
    setup_hash: str
    role: str = "worker"
    files: tuple[RemoteFile, ...] = ()

    @property
    def starts_processes(self) -> bool:
        return self.launch_script is not None

    def describe(self) -> str:
        where = f"{self.host.user}@{host_port(self.host.address, self.host.port)}"
        if self.host.proxy_jump is not None:
            where += f" via {self.host.proxy_jump.label}"
        return f"{self.host.name} ({where}, node rank {self.node_rank}, {self.role})"


@dataclass(frozen=True)
class LaunchPlan:
    """The whole job: run id, nodes (head first), and which launcher made it."""

    run_id: str
    job: str
    launcher: str
    nodes: list[NodePlan]
    total_processes: int | None
    notes: list[str] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    """Environment values that ``render`` masks (the nodes still get them): name -> value."""
    rdzv_port: int | str | None = None
    """The head's rendezvous port: a number, ``"auto"`` (chosen free on the head at launch time and
    sent to every starting node as ``rdzv_port``), or None when the launcher needs none."""
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    """What a lost node, a preemption or a failed rank does to the run (the playbook's ``recovery:``)."""
    min_nodes: int | None = None
    """Elastic jobs (``nodes: MIN:MAX``): the fewest nodes a later attempt may run on."""
    workdir: str = ""
    """The folder of this machine sent to every node (the dry run names it, with the data channels)."""
    on_end: tuple[str, ...] = ()
    """The playbook's ``on_end`` commands: run on *this* machine after the run, when allowed."""
    on_end_verdict: str = "run only when allowed for this playbook (--allow-local-hooks)"
    """Whether they will run and why (the caller that knows the user's allowances sets it)."""
    before_stop: tuple[str, ...] = ()
    """The playbook's ``before_stop`` commands: run on every node by its watchdog."""

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def render(self) -> str:
        """The dry-run text: per node, the exact setup and launch scripts that would run.

        Secret values (``secrets``) are replaced by ``***``: this text is printed and kept in ``plan.txt``.
        """
        out = [
            f"# fleetrun plan for job {self.job!r}, run {self.run_id}",
            f"# launcher: {self.launcher}; nodes: {len(self.nodes)}; "
            f"processes: {self.total_processes if self.total_processes is not None else 'resolved on the nodes'}",
        ]
        if self.rdzv_port is not None:
            port = (
                "auto: a free port on the head, chosen at launch"
                if self.rdzv_port == "auto"
                else self.rdzv_port
            )
            out.append(f"# rendezvous port: {port}")
        out.append(f"# recovery: {describe_policy(self.recovery, self.min_nodes, len(self.nodes))}")
        if self.workdir:
            out.append(
                f"# sends: workdir {self.workdir} on this machine, to ~/.fleetrun/work/{self.job} on every node"
            )
        out += [f"# note: {n}" for n in self.notes]
        out += self._hook_lines()
        for node in self.nodes:
            out.append("")
            out.append(f"## {node.describe()}")
            for remote_file in node.files:  # each file under its own header, before the setup's
                out.append(f"### file {remote_file.describe()}")
            out.append(
                f"### setup (skipped when ~/.fleetrun/envs/{self.job}/.fleetrun-setup-hash = {node.setup_hash})"
            )
            out.append(node.setup_script.rstrip())
            if node.launch_script is None:
                out.append(
                    "### launch.sh: none; this node's processes are started by the head node's launcher"
                )
                continue
            out.append("### launch.sh (started detached by ~/.fleetrun/lib/fleetrun_node.py start)")
            out.append(node.launch_script.rstrip())
            out.append(f"### command: {node.command}")
        return self.masked("\n".join(out) + "\n")

    def _hook_lines(self) -> list[str]:
        """Every hook, each line of each command on a comment line of its own, control characters
        shown as ``?``: the playbook is someone's file, and this is where its commands are read."""
        out = []
        for commands, title in (
            (self.on_end, f"# hook on_end, on THIS machine after the run (sh -c): {self.on_end_verdict}"),
            (self.before_stop, "# hook before_stop, on every node when its watchdog ends the run (sh -c):"),
        ):
            if not commands:
                continue
            out.append(title)
            for i, command in enumerate(commands):
                lines = command.split("\n")
                out.append(f"#   [{i}] {clean(lines[0], 8192)}")
                out += [f"#       {clean(line, 8192)}" for line in lines[1:]]
        return out

    def masked(self, text: str) -> str:
        """``text`` with every secret's ``export`` line showing ``***`` instead of the value."""
        for key, value in self.secrets.items():
            text = text.replace(export_line(key, value), f"export {key}={MASK}")
        return text
