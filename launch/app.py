"""What the commands do, independent of Fabric's task syntax (tasks and tests call these).

``train`` is the pipeline: load the playbook and the inventory, make the plan (``--dry-run``
prints it and stops), then run it and report. Errors the user can act on are ``FleetrunError``.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from launch.errors import SpecError
from launch.inventory import Inventory
from launch.launchers import get_launcher
from launch.localfleet import LocalFleet
from launch.paths import known_hosts_file
from launch.plan import LaunchPlan
from launch.run_folder import RunFolder, new_run_id
from launch.runner import Runner, RunResult
from launch.spec import JobSpec, load_job_spec

DEFAULT_LOCAL_PREFIX = "fr"


def local_fleet(prefix: str | None = None, subnet: int | None = None) -> LocalFleet:
    prefix = prefix or os.environ.get("FLEETRUN_LOCAL_PREFIX") or DEFAULT_LOCAL_PREFIX
    if subnet is None:
        subnet = int(os.environ.get("FLEETRUN_LOCAL_SUBNET", "0"))
    return LocalFleet(prefix=prefix, subnet=subnet)


def load_inventory(selector: str | None) -> Inventory:
    """``local`` / ``local:<prefix>`` (default), ``stack:<name>``, a ``.json`` of stack outputs, or a YAML inventory."""
    selector = selector or "local"
    if selector == "local" or selector.startswith("local:"):
        prefix = selector.split(":", 1)[1] if ":" in selector else None
        return local_fleet(prefix).inventory()
    if selector.startswith("stack:"):
        from launch.cloud_stack import stack_inventory  # lazy: only cloud users need Pulumi

        return stack_inventory(selector.split(":", 1)[1])
    path = Path(selector)
    if not path.exists():
        raise SpecError(
            f"inventory {selector!r}: no such file (expected 'local', 'stack:<name>', a .json or .yaml file)"
        )
    if path.suffix == ".json":
        return Inventory.from_stack_outputs_file(path)
    return Inventory.from_static_yaml(path)


def make_plan(spec: JobSpec, inventory: Inventory, run_id: str | None = None) -> LaunchPlan:
    launcher = get_launcher(spec.launcher)
    return launcher.plan(spec, inventory, run_id or new_run_id(spec.name))


def train(
    playbook: str | Path,
    inventory: str | None = None,
    dry_run: bool = False,
    console: Console | None = None,
    poll_interval: float = 1.0,
) -> RunResult | LaunchPlan:
    console = console or Console()
    spec = load_job_spec(playbook)
    inv = load_inventory(inventory).first(spec.nodes)
    plan = make_plan(spec, inv)
    if dry_run:
        console.print(plan.render(), markup=False, highlight=False, soft_wrap=True)
        return plan
    known_hosts = inv.write_known_hosts(known_hosts_file(inv.fingerprint()))
    folder = RunFolder.create(plan.run_id)
    console.print(
        f"[bold]fleetrun[/] run {plan.run_id}: job {spec.name} on {len(plan.nodes)} node(s) "
        f"of {inv.source} with {spec.launcher}; run folder {folder.path}"
    )
    runner = Runner(spec, plan, known_hosts, folder, console=console, poll_interval=poll_interval)
    result = runner.execute()
    report(result, console)
    return result


def report(result: RunResult, console: Console) -> None:
    color = "green" if result.ok else "red"
    console.print(f"[bold {color}]{result.outcome}[/]: {result.reason}")
    if result.world:
        ranks = ", ".join(f"{r['rank']}@{r['host']}({r['addr']})" for r in result.world.get("ranks", []))
        console.print(f"  world size {result.world.get('world_size')}: {ranks}")
    if result.last_metrics:
        console.print(
            f"  last step {result.last_metrics.get('step')}: loss {result.last_metrics.get('loss')}"
        )
    if result.first_step_after_s is not None:
        console.print(f"  first step {result.first_step_after_s:.1f} s after launch")
    codes = ", ".join(f"{k}={v}" for k, v in result.exit_codes.items())
    console.print(f"  exit codes: {codes}")
    console.print(f"  run folder: {result.folder}")
