"""What the commands do, independent of Fabric's task syntax (tasks and tests call these).

``train`` is the pipeline: load the playbook and the inventory, make the plan (``--dry-run``
prints it and stops), then run it and report. Errors the user can act on are ``FleetrunError``.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from launch.cli.runs import open_records
from launch.errors import SpecError
from launch.fleets.select import load_inventory, local_fleet
from launch.job.inventory import Inventory
from launch.job.spec import JobSpec, load_job_spec
from launch.paths import known_hosts_file
from launch.planning.launchers import launcher_class
from launch.planning.plan import LaunchPlan
from launch.rules.stoprules import configuration_warnings
from launch.run.records import file_sha256, git_commit_of
from launch.run.run_folder import RunFolder, new_run_id
from launch.run.runner import Runner, RunOptions
from launch.run.wrapup import RunResult
from launch.settings import current

__all__ = ["load_inventory", "local_fleet", "make_plan", "report", "train"]


def make_plan(spec: JobSpec, inventory: Inventory, run_id: str | None = None) -> LaunchPlan:
    launcher = launcher_class(spec.launcher).for_inventory(inventory.first(spec.nodes))
    return launcher.plan(spec, inventory, run_id or new_run_id(spec.name))


def train(
    playbook: str | Path,
    inventory: str | None = None,
    dry_run: bool = False,
    console: Console | None = None,
    poll_interval: float = 1.0,
    teardown: str | None = None,
    ask_on_interrupt: bool = True,
) -> RunResult | LaunchPlan:
    """The pipeline. ``teardown`` overrides the playbook's (``always``/``on_success``/``never``)."""
    console = console or Console()
    spec = load_job_spec(playbook)
    if teardown is not None:
        if teardown not in ("always", "on_success", "never"):
            raise SpecError(f"--teardown {teardown!r}: expected always, on_success or never")
        spec = spec.model_copy(update={"teardown": teardown})
    inv = load_inventory(inventory).first(spec.nodes)
    plan = make_plan(spec, inv)
    if dry_run:
        console.print(plan.render(), markup=False, highlight=False, soft_wrap=True)
        return plan
    for warning in configuration_warnings(spec.stop, 0.0):
        console.print(f"[yellow]warning:[/] {warning}")
    known_hosts = inv.write_known_hosts(known_hosts_file(inv.fingerprint()))
    folder = RunFolder.create(plan.run_id)
    records = open_records()
    records.start(
        run_id=plan.run_id,
        playbook_path=str(Path(playbook).resolve()),
        playbook_name=spec.name,
        playbook_hash=file_sha256(playbook),
        git_commit=git_commit_of(spec.workdir),
        inventory=inv.to_yaml_data(),
        launcher=spec.launcher,
        run_dir=str(folder.path),
    )
    console.print(
        f"[bold]fleetrun[/] run {plan.run_id}: job {spec.name} on {len(plan.nodes)} node(s) "
        f"of {inv.source} with {spec.launcher}; run folder {folder.path}"
    )
    options = RunOptions(
        poll_interval=poll_interval, ask_on_interrupt=ask_on_interrupt, max_parallel=current().fanout
    )
    runner = Runner(spec, plan, inv, known_hosts, folder, records, console=console, options=options)
    try:
        result = runner.execute()
    finally:
        records.close()
    report(result, console)
    return result


def report(result: RunResult, console: Console) -> None:
    color = "green" if result.ok else "red"
    console.print(f"[bold {color}]{result.outcome}[/] ({result.rule}): {result.reason}")
    if result.world:
        ranks = ", ".join(f"{r['rank']}@{r['host']}({r['addr']})" for r in result.world.get("ranks", []))
        console.print(f"  world size {result.world.get('world_size')}: {ranks}")
    losses = [point.loss for point in RunFolder(result.folder).read_metrics()[1].history]
    if losses:
        console.print(
            f"  loss: {losses[0]:.4f} at the first step -> {losses[-1]:.4f} at step "
            f"{result.last_metrics.get('step', len(losses))} ({len(losses)} steps); plot: {result.folder / 'loss.png'}"
        )
    if result.first_step_after_s is not None:
        console.print(f"  first step {result.first_step_after_s:.1f} s after launch")
    codes = ", ".join(f"{k}={v}" for k, v in result.exit_codes.items())
    console.print(f"  exit codes: {codes}")
    console.print(f"  teardown: {result.teardown}")
    console.print(f"  run folder: {result.folder}")
