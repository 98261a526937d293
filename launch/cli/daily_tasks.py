"""Fabric tasks of daily work on a fleet: ``fab sweep``, ``fab ssh``, ``fab forward``, ``fab ssh-config``.

Kept apart from ``launch.cli.tasks`` (which registers them in its collection) so each file stays
short; thin wrappers over ``launch.cli.sweep`` and ``launch.cli.access``, imported inside each task
for the same reason as there (``fab`` loads this module for every command).
"""

from __future__ import annotations

from typing import Any

from invoke.exceptions import Exit

from launch.cli.edge import friendly as _friendly
from launch.cli.options import PlaybookOptions, reads_playbook
from launch.cli.task_help import task


@task(
    iterable=["grid"],
    help={
        "playbook": "job file, or a built-in playbook's name (`fab examples` copies them out)",
        "grid": "a field and its values, name=v1,v2 (repeatable; every combination runs), e.g. hyperparameters.lr=0.1,0.01",
        "random": "run this many (1 or more) of the combinations, drawn at random, instead of all",
        "parallel": "variants at once, each on its own nodes of the inventory (default 1: one after another)",
        "seed": "seed of --random's draw (default: a new draw each time)",
        "max-failures": "stop the whole sweep (as Ctrl-C does) once this many variants failed or stopped (default 0: no limit)",
    },
)
@_friendly
@reads_playbook(hooks=True)
def sweep(
    c: Any,
    playbook: str,
    grid: list[str] | None = None,
    random: str | None = None,  # checked as a count by launch.planning.sweep_plan (None: not given)
    parallel: int = 1,
    seed: int = -1,
    max_failures: int = 0,
    *,
    opts: PlaybookOptions,
) -> None:
    """Run variants of a playbook (a grid of --set values), K at a time on disjoint nodes; one sweep id.

    Example: fab sweep playbooks/digits-ddp.yaml --grid hyperparameters.lr=0.1,0.01 --grid nodes=1,2
             fab sweep job.yaml --grid hyperparameters.lr=0.1,0.05,0.01,0.005 --set nodes=1 --parallel 2
    Then: fab runs --sweep ID; fab compare sweep:ID. Ctrl-C stops the whole sweep.
    (--set, --allow-path and --allow-local-hooks apply to every variant.)
    """
    from launch.cli import sweep as sweeping

    result = sweeping.run_sweep(
        playbook,
        grid or [],
        inventory=opts.inventory,
        sample=random,
        parallel=parallel,
        sets=opts.overrides,
        seed=None if seed < 0 else seed,
        max_failures=max_failures,
        allow_local_hooks=opts.allow_local_hooks,
        allow_paths=opts.allow_paths,
    )
    if any(v.state != "succeeded" for v in result.variants):
        raise Exit(code=1)


ACCESS_TARGET_HELP = (
    "a run (id, prefix or 'last') or an inventory (local, local:<prefix>, stack:<name>, a file)"
)


@task(
    help={
        "target": ACCESS_TARGET_HELP,
        "node": "which node (default: the head, where rank 0 runs)",
        "command": "run this command instead of a shell, e.g. 'nvidia-smi'",
    }
)
@_friendly
def ssh(c: Any, target: str, node: str = "", command: str = "") -> None:
    """A shell (or one command) on a run's node, with the pinned host keys and the jump host.

    Example: fab ssh last --node frnode1 --command 'tail -n 20 ~/.fleetrun/runs/*/node.log'
    (fab keeps its own meaning for '-- CMD', so the command goes in --command)
    """
    from launch.cli import access

    code = access.ssh(target, node=node or None, command=command)
    if code:
        raise Exit(code=code)


@task(
    help={
        "target": ACCESS_TARGET_HELP,
        "port": "the port on the node (its localhost), e.g. 6006 for TensorBoard",
        "node": "which node (default: the head)",
        "local-port": "the port on this machine's 127.0.0.1 (default: the same as PORT)",
    }
)
@_friendly
def forward(c: Any, target: str, port: str, node: str = "", local_port: int = 0) -> None:
    """Forward a port of a run's node to this machine (live TensorBoard, a notebook) until Ctrl-C.

    Example: fab forward last 6006   (then open http://127.0.0.1:6006)
    """
    from launch.cli import access

    code = access.forward(target, port, node=node or None, local_port=local_port)
    if code:
        raise Exit(code=code)


@task(
    name="ssh-config",
    help={
        "target": ACCESS_TARGET_HELP,
        "output": "write the block to this file (mode 600) instead of printing it; Include it from ~/.ssh/config",
        "prefix": "alias of each node: <prefix><node name> (default fleetrun-)",
    },
)
@_friendly
def ssh_config(c: Any, target: str, output: str = "", prefix: str = "fleetrun-") -> None:
    """Write an OpenSSH config block for a run's nodes (pinned keys, ProxyCommand for jumps).

    Example: fab ssh-config last --output ~/.ssh/fleetrun.conf   (then: ssh fleetrun-NODE, or VS Code Remote)
    """
    from launch.cli import access

    access.write_ssh_config(target, output=output, alias_prefix=prefix)


@task(positional=["inventory"])  # `fab queue lab.yaml`, as the docs show; --inventory works too
@_friendly
def queue(c: Any, inventory: str = "local") -> None:
    """Show who holds and who waits for each machine (every run holds its machines; fab train --wait queues in arrival order).

    Example: fab queue --inventory lab.yaml
    """
    from launch.fleets.select import load_inventory
    from launch.paths import known_hosts_file
    from launch.run import queue_turn as queueing

    inv = load_inventory(inventory)
    queueing.show_queue(inv, inv.write_known_hosts(known_hosts_file(inv.fingerprint())))
