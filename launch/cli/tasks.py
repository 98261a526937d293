"""Fabric tasks: ``fab -l`` lists them. Thin wrappers over ``launch.cli.app``; no logic lives here.

The launch pipeline is imported inside each task, not here: ``fab`` loads this module for every
command, and a light command (``fab exec`` on 64 nodes) should not pay for importing all of it.
"""

from __future__ import annotations

from typing import Any

from invoke import Collection
from invoke.exceptions import Exit

from launch.cli.daily_tasks import forward, queue, ssh, ssh_config, sweep
from launch.cli.edge import friendly as _friendly
from launch.cli.options import PlaybookOptions, reads_playbook
from launch.cli.task_help import ROOT, task
from launch.settings import current

PLAYBOOK_HELP = "job file, or a built-in playbook's name (`fab examples` copies them out)"


@task(
    help={
        "playbook": PLAYBOOK_HELP,
        "dry-run": "print, per node, exactly what would run; connect to nothing",
        "teardown": "override the playbook: always, on_success or never",
        "allow-busy-gpus": "start even where other users' processes hold the GPUs this run would use",
        "skip-doctor": "launch without the pre-launch checks (rsync, Python, hostname, port in use)",
        "hosts": "run on these hosts of the inventory (names, comma-separated, head first) instead of its first ones",
        "sweep": "record the run as a variant of this sweep, by its id (fab sweep sets it; fab runs --sweep ID lists them)",
        "wait": "wait for the machines, in arrival order among runs waiting for them, instead of refusing busy ones",
    },
)
@_friendly
@reads_playbook(hooks=True)
def train(
    c: Any,
    playbook: str,
    dry_run: bool = False,
    teardown: str = "",
    allow_busy_gpus: bool = False,
    skip_doctor: bool = False,
    hosts: str = "",
    sweep: str = "",
    wait: bool = False,
    *,
    opts: PlaybookOptions,
) -> None:
    """Sync, set up, launch and watch a training job; exit code 0 only if it succeeded.

    Example: fab train playbooks/digits-ddp.yaml --inventory local --set nodes=2 --set hyperparameters.lr=0.01
    """
    from launch.cli import app
    from launch.run.summary import RunResult

    result = app.train(
        playbook,
        inventory=opts.inventory,
        dry_run=dry_run,
        teardown=teardown or None,
        allow_busy_gpus=allow_busy_gpus,
        skip_doctor=skip_doctor,
        overrides=opts.overrides,
        hosts=[h.strip() for h in hosts.split(",") if h.strip()],
        sweep_id=sweep or None,
        wait=wait,
        allow_paths=opts.allow_paths,
        allow_local_hooks=opts.allow_local_hooks,
    )
    if isinstance(result, RunResult) and not result.ok:
        raise Exit(code=1)


@task(
    positional=["playbook"],  # `fab doctor PLAYBOOK --inventory INV`, as the README shows; optional
    help={
        "playbook": "job file (optional): its nodes, rendezvous port and setup are checked for",
        "port": "rendezvous port to check (default: the playbook's, else 29500)",
        "verbose": "a line for every check of every node, not only warnings and errors",
        "collective": "also an all-reduce and matmul test through torchrun, naming a slow node or link",
        "gpu-diag": "also DCGM's diagnostic (dcgmi diag -r N) on every node: 1 takes seconds, 2 about "
        "2 minutes, 3 about 15 (bounded at 2, 10 and 45 minutes); a line per GPU with a failed test",
        "collective-history": "list the saved --collective figures over time, per fleet and node (alone: contacts no node)",
    },
)
@_friendly
@reads_playbook()
def doctor(
    c: Any,
    playbook: str = "",
    port: int = -1,
    verbose: bool = False,
    collective: bool = False,
    gpu_diag: int = 0,
    collective_history: bool = False,
    *,
    opts: PlaybookOptions,
) -> None:
    """Check every node for what would break a multi-node job; exit 1 if anything would."""
    from rich.console import Console

    from launch.cli import app

    if collective_history and not collective:  # a listing only: no inventory, no node
        app.collective_history(Console())
        return
    ok = app.doctor(
        playbook or None,
        inventory=opts.inventory,
        port=None if port == -1 else port,
        verbose=verbose,
        collective=collective,
        overrides=opts.overrides,
        gpu_diag=gpu_diag,
        allow_paths=opts.allow_paths,
    )
    if collective_history:
        app.collective_history(Console())
    if not ok:
        raise Exit(code=1)


@task(help={"playbook": PLAYBOOK_HELP})
@_friendly
@reads_playbook()
def plan(c: Any, playbook: str, *, opts: PlaybookOptions) -> None:
    """Print the launch plan (same as train --dry-run).

    Example: fab plan playbooks/digits-ddp.yaml --set nodes=2 --set env.NCCL_DEBUG=INFO
    """
    from launch.cli import app

    app.train(
        playbook,
        inventory=opts.inventory,
        dry_run=True,
        overrides=opts.overrides,
        allow_paths=opts.allow_paths,
    )


@task(
    help={
        "nodes": "number of nodes",
        "prefix": "name prefix (default fr)",
        "subnet": "198.18.<subnet>.0/24",
        "bastion": "workers on an internal bridge this machine cannot reach; the head is their jump host",
        "mixed": "a sshd port and an interface name of its own on each node",
        "vm": "like cloud VMs: one user and home path on every node, each with its own home and /tmp",
        "uplink": "rate-limit this machine's traffic to the nodes (tc tbf), e.g. 200mbit; nodes talk at full speed",
        "bucket": "an S3-compatible server of the fleet's own (moto) as the nodes' bucket, removed by local.down",
        "spot": "spot-like nodes: a metadata endpoint in each node; fab local.preempt serves a notice",
        "with_slurm": "a real Slurm cluster (slurm-wlm, munge): node 0 its controller and login host, the others its compute nodes",
        "containers": "rootless podman for each node user, the fleet's Python as an image in a shared store (for container: playbooks)",
        "registry": "with --containers: an image registry of the fleet's own on its bridge holding that image; the nodes pull it over the network",
    }
)
@_friendly
def local_up(
    c: Any,
    nodes: int = 3,
    prefix: str = "",
    subnet: int = -1,
    bastion: bool = False,
    mixed: bool = False,
    vm: bool = False,
    uplink: str = "",
    bucket: bool = False,
    spot: bool = False,
    with_slurm: bool = False,
    containers: bool = False,
    registry: bool = False,
) -> None:
    """Start a local fleet: N network-namespace nodes with real sshd (needs root)."""
    from launch.cli import app

    fleet = app.local_fleet(prefix or None, None if subnet < 0 else subnet)
    inventory = fleet.up(
        nodes,
        bastion=bastion,
        mixed=mixed,
        vm=vm,
        uplink_rate=uplink or None,
        bucket=bucket,
        spot_notices=spot,
        slurm=with_slurm,
        containers=containers,
        registry=registry,
    )
    for host in inventory.hosts:
        via = f" via {host.proxy_jump.label}" if host.proxy_jump else ""
        print(f"  {host.name}  {host.user}@{host.address}:{host.port}{via}  {host.host_key[:40]}...")


@task(help={"prefix": "name prefix (default fr)"})
@_friendly
def local_down(c: Any, prefix: str = "") -> None:
    """Stop the local fleet and remove every namespace, link, user, process and file it made."""
    from launch.cli import app

    left = app.local_fleet(prefix or None).down()
    if any(left.values()):
        raise Exit(code=1)


@task(help={"prefix": "name prefix (default fr)"})
@_friendly
def local_status(c: Any, prefix: str = "") -> None:
    """Show the local fleet's nodes and anything of it that exists."""
    from launch.cli import app

    fleet = app.local_fleet(prefix or None)
    for kind, items in fleet.leftovers().items():
        print(f"{kind:>10}: {', '.join(items) if items else '-'}")


@task(
    help={
        "node": "the node to preempt (e.g. frnode1)",
        "in": "seconds until the node is taken (EC2 gives 120, GCE 30)",
        "prefix": "name prefix (default fr)",
    }
)
@_friendly
def local_preempt(c: Any, node: str, in_: float = 120.0, prefix: str = "") -> None:
    """Serve a spot interruption notice to one node of a `local.up --spot` fleet (docs/rehearse-faults.md)."""
    from launch.cli import app
    from launch.fleets.local.spot import serve_notice

    fleet = app.local_fleet(prefix or None)
    serve_notice(fleet, node, in_)
    print(f"{node}: spot notice served; the node is taken in {in_:g} s unless replaced before")


@task(help={"nodes": "number of nodes", "playbook": PLAYBOOK_HELP})
@_friendly
@reads_playbook(inventory=False, hooks=True)
def demo(c: Any, nodes: int = 3, playbook: str = "digits-ddp", *, opts: PlaybookOptions) -> None:
    """The README's demo: local fleet up, train the example across it, fleet down."""
    from launch.cli import app
    from launch.run.summary import RunResult

    fleet = app.local_fleet()
    fleet.up(nodes)
    try:
        result = app.train(
            playbook,
            inventory="local",
            overrides=opts.overrides,
            allow_paths=opts.allow_paths,
            allow_local_hooks=opts.allow_local_hooks,
        )
    finally:
        fleet.down()
    if isinstance(result, RunResult) and not result.ok:
        raise Exit(code=1)


@task(help={"into": "the folder to copy them into (must not exist yet)"})
@_friendly
def examples(c: Any, into: str = "fleetrun-examples") -> None:
    """Copy the built-in playbooks and their example code into a folder, to read, edit and run."""
    import shutil
    from pathlib import Path

    from launch.errors import SpecError
    from launch.job.builtin import builtin_root
    from launch.reports.safe_text import clean

    root = builtin_root()
    if root is None:
        raise SpecError("the built-in playbooks are not installed (a wheel without its data files?)")
    target = Path(into)
    if target.exists():
        raise SpecError(f"--into {clean(into, 200)!r}: already exists; name a new folder")
    from launch.job.spec import TREE_MARKER

    for part in ("playbooks", "examples"):
        shutil.copytree(root / part, target / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # one project: its playbooks may send its examples (a playbook ships only its own tree's files)
    (target / TREE_MARKER).write_text(
        "# fleetrun: this folder is one project (see launch.job.spec.playbook_tree)\n"
    )
    print(
        f"copied to {clean(str(target), 200)}: run `fleetrun train {clean(str(target), 200)}/playbooks/digits-ddp.yaml`"
    )


RUN_FILTER_HELP = {
    "playbook": "only runs of this playbook (its name, or its file name without .yaml)",
    "outcome": "only runs that ended so: succeeded, failed, stopped, interrupted or running",
    "since": "only runs started since: a date (2026-11-20), a date and time, or an age (12h, 3d)",
    "json": "print JSON instead of a table (for scripts)",
}


@task(
    help={
        "limit": "how many runs, newest first",
        **RUN_FILTER_HELP,
        "tensorboard": "link every listed run's TensorBoard files into this folder (tensorboard --logdir it)",
        "sweep": "only the variants of this sweep (its id, as fab sweep printed it)",
    }
)
@_friendly
def runs(
    c: Any,
    limit: int = 20,
    playbook: str = "",
    outcome: str = "",
    since: str = "",
    json: bool = False,
    tensorboard: str = "",
    sweep: str = "",
) -> None:
    """List recorded runs: outcome, stop reason, elapsed time, cost (filters, --json, --tensorboard)."""
    from rich.console import Console

    from launch.cli import experiments

    experiments.list_runs(
        Console(),
        limit=limit,
        playbook=playbook,
        outcome=outcome,
        since=since,
        as_json=json,
        tensorboard=tensorboard,
        sweep=sweep,
    )


@task(
    help={
        "runs": "ids, prefixes or 'last', separated by commas (r1,r2,r3); 'all': every run the filters keep; "
        "'sweep:ID': a sweep's variants, best loss first",
        **RUN_FILTER_HELP,
        "plot": "where to write the overlaid loss plot (PNG; '' for none)",
    },
)
@_friendly
def compare(
    c: Any,
    runs: str,
    playbook: str = "",
    outcome: str = "",
    since: str = "",
    plot: str = "compare-loss.png",
    json: bool = False,
) -> None:
    """Runs side by side: hyperparameters, final and best metrics, duration, cost; one loss plot."""
    from rich.console import Console

    from launch.cli import experiments

    experiments.compare(
        Console(), runs, playbook=playbook, outcome=outcome, since=since, plot=plot, as_json=json
    )


@task(help={"run": "run id, a unique prefix, its short id (as fab runs shows it) or 'last'"})
@_friendly
def show(c: Any, run: str) -> None:
    """Print one run's record: playbook, commit, nodes, exit codes, metrics, artifacts."""
    from rich.console import Console

    from launch.cli import runs as history

    history.show(run, Console())


@task(
    help={
        "run": "run id, a unique prefix, its short id (as fab runs shows it) or 'last'",
        "node": "only this node",
        "follow": "stream every node's log while it runs (node/rank prefix); continues where the last --follow stopped",
        "from-start": "with --follow: from the first line, not where the last --follow stopped",
    }
)
@_friendly
def logs(c: Any, run: str, node: str = "", follow: bool = False, from_start: bool = False) -> None:
    """Per-node logs of a run (pulled copies, or live from the nodes with --follow)."""
    from rich.console import Console

    from launch.cli import runs as history

    history.logs(run, Console(), node=node or None, follow=follow, from_start=from_start)


@task(help={"run": "run id, a unique prefix, its short id (as fab runs shows it) or 'last'"})
@_friendly
def watch(c: Any, run: str) -> None:
    """Re-attach to a run whose watcher was lost; stop, pull and tear down when a rule fires."""
    from rich.console import Console

    from launch.cli import runs as history

    result = history.reattach(run, Console())  # followed to its end: wrap-up, report, on_end
    if not result.ok:
        raise Exit(code=1)


PROJECT_DIR_HELP = "folder of Pulumi.<stack>.yaml (default: $FLEETRUN_PROJECT_DIR, else the current one)"


@task(
    help={
        "stack": "Pulumi stack name (its config is Pulumi.<stack>.yaml)",
        "outputs": "also write outputs JSON here",
        "project-dir": PROJECT_DIR_HELP,
    }
)
@_friendly
def up(c: Any, stack: str, outputs: str = "", project_dir: str = "") -> None:
    """Stand up (or update) a cloud GPU cluster with Pulumi; print its nodes and pinned keys."""
    from pathlib import Path

    from launch.fleets import cloud_stack

    cloud_stack.stack_up(
        stack,
        project_dir=Path(project_dir) if project_dir else None,
        outputs_path=Path(outputs) if outputs else None,
    )


@task(help={"stack": "Pulumi stack name", "project-dir": PROJECT_DIR_HELP})
@_friendly
def down(c: Any, stack: str, project_dir: str = "") -> None:
    """Destroy a cloud cluster (buckets are kept) and confirm that no instance of it remains."""
    from pathlib import Path

    from launch.fleets import cloud_stack

    cloud_stack.stack_down(stack, project_dir=Path(project_dir) if project_dir else None)


@task(help={"run": "run id, a unique prefix, its short id (as fab runs shows it) or 'last'"})
@_friendly
def pull(c: Any, run: str) -> None:
    """Pull a finished run's artifacts again; tear down as the playbook says once all are safe."""
    from rich.console import Console

    from launch.cli import runs as history

    if not history.pull_again(run, Console()).ok:  # a node's pull failed, or the teardown waits
        raise Exit(code=1)


@task(
    name="exec",
    help={
        "command": "shell command to run on every node, e.g. 'nvidia-smi -L'",
        "timeout": "seconds per node before it is reported as failed",
        "parallel": "at most this many nodes at once (default: $FLEETRUN_FANOUT, else 64)",
        "quiet": "print only failures",
    },
)
@_friendly
def exec_(
    c: Any,
    command: str,
    inventory: str = "local",
    timeout: float = 60.0,
    parallel: int = 0,
    quiet: bool = False,
) -> None:
    """Run a shell command on every node (pdsh-style output); exit 1 if any node failed."""
    from launch.fleets.select import load_inventory
    from launch.transport.run_everywhere import run_everywhere

    fanout = current().with_fanout(parallel).fanout
    result = run_everywhere(
        load_inventory(inventory), command, timeout=timeout, max_parallel=fanout, quiet=quiet
    )
    if not result.all_ok:
        raise Exit(code=1)


@task(
    help={
        "playbook": PLAYBOOK_HELP,
        "to": "what to export to: pytorchjob (a Kubeflow Training Operator PyTorchJob)",
        "image": "container image the pods run (default: the playbook's container.image; built from "
        "images/docker/Dockerfile, see its header)",
        "nodes": "override the playbook's node count, 1 or more (default: the playbook's)",
        "gpus": "GPUs per node (default: procs_per_node when a number, else 1; 0 for a CPU job)",
        "namespace": "Kubernetes namespace of the job (default: default)",
        "output": "write the manifest here instead of printing it",
    },
)
@_friendly
@reads_playbook(inventory=False)
def export(
    c: Any,
    playbook: str,
    to: str = "pytorchjob",
    image: str = "",
    nodes: str = "",
    gpus: str = "",
    namespace: str = "default",
    output: str = "",
    *,
    opts: PlaybookOptions,
) -> None:
    """Write a playbook as a Kubeflow PyTorchJob manifest (master + workers, env, GPUs, elastic policy).

    Example: fab export playbooks/digits-ddp.yaml --image IMAGE --set hyperparameters.lr=0.01
    """
    from launch.cli import export as exporting

    exporting.export(
        playbook,
        to=to,
        image=image,
        nodes=nodes,  # text: read (and refused when not 1 or more) by the export, "" is the playbook's
        gpus=gpus,
        namespace=namespace,
        output=output or None,
        overrides=opts.overrides,
        allow_paths=opts.allow_paths,
    )


local = Collection("local")
local.add_task(local_up, "up")
local.add_task(local_down, "down")
local.add_task(local_status, "status")
local.add_task(local_preempt, "preempt")

ns = Collection()
ns.add_task(train)
ns.add_task(plan)
ns.add_task(doctor)
ns.add_task(demo)
ns.add_task(examples)
ns.add_task(up)
ns.add_task(down)
ns.add_task(runs)
ns.add_task(compare)
ns.add_task(show)
ns.add_task(logs)
ns.add_task(watch)
ns.add_task(pull)
ns.add_task(exec_)
ns.add_task(export)
ns.add_task(sweep)
ns.add_task(queue)
ns.add_task(ssh)
ns.add_task(forward)
ns.add_task(ssh_config)
ns.add_collection(local)
ROOT.append(ns)  # what `fab TASK --help` prints from (launch.cli.task_help)
