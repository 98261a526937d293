"""What the commands do, independent of Fabric's task syntax (tasks and tests call these).

``train`` is the pipeline: load the playbook and the inventory, make the plan (``--dry-run``
prints it and stops), then run it and report. Errors the user can act on are ``FleetrunError``.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from launch.cli.runs import open_records
from launch.errors import SpecError
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.select import load_inventory, local_fleet
from launch.job.builtin import resolve_playbook
from launch.job.inventory import Inventory
from launch.job.spec import JobSpec, load_job_spec
from launch.paths import known_hosts_file
from launch.planning.launchers import launcher_class
from launch.planning.plan import LaunchPlan
from launch.reports.safe_text import clean
from launch.rules.pricing import price_per_node_hour
from launch.rules.stoprules import Teardown, configuration_warnings
from launch.run import lifecycle
from launch.run.reporter import Reporter, RichReporter
from launch.run.run_folder import RunFolder, new_run_id
from launch.run.state import AskKeepRunning, RunOptions
from launch.run.summary import RunResult
from launch.settings import current

__all__ = ["doctor", "load_inventory", "local_fleet", "make_plan", "report", "train"]

DEFAULT_RDZV_PORT = JobSpec.model_fields["rdzv_port"].default


def make_plan(
    spec: JobSpec, inventory: Inventory, run_id: str | None = None, dry_run: bool = False
) -> LaunchPlan:
    """``dry_run``: the launcher creates nothing on this machine (no cluster key is generated)."""
    launcher = launcher_class(spec.launcher).for_inventory(inventory.first(spec.nodes), dry_run=dry_run)
    hook = fleet_kind(inventory.fleet).poweroff_hook()
    return launcher.plan(spec, inventory, run_id or new_run_id(spec.name), poweroff_hook=hook)


def train(
    playbook: str | Path,
    inventory: str | None = None,
    dry_run: bool = False,
    console: Console | None = None,
    poll_interval: float = 1.0,
    teardown: str | None = None,
    ask_on_interrupt: bool = True,
    allow_busy_gpus: bool = False,
    skip_doctor: bool = False,
) -> RunResult | LaunchPlan:
    """The pipeline. ``teardown`` overrides the playbook's (``always``/``on_success``/``never``);
    ``skip_doctor`` launches without the pre-launch checks (``fab doctor``'s cheap part)."""
    console = console or Console()
    playbook = resolve_playbook(playbook)
    spec = load_job_spec(playbook)
    if teardown is not None:
        try:
            policy = Teardown(teardown)
        except ValueError:
            choices = ", ".join(t.value for t in Teardown)
            raise SpecError(f"--teardown {clean(teardown, 100)!r}: expected one of {choices}") from None
        spec = spec.model_copy(update={"teardown": policy})
    inv = load_inventory(inventory, save_keys=not dry_run).first(spec.nodes)
    plan = make_plan(spec, inv, dry_run=dry_run)
    if dry_run:
        console.print(plan.render(), markup=False, highlight=False, soft_wrap=True)
        return plan
    for warning in launch_warnings(spec, inv):
        console.print(Text("warning: ", style="yellow") + Text(clean(warning)))
    records = open_records()
    reporter = RichReporter(console)
    options = RunOptions(
        poll_interval=poll_interval,
        max_parallel=current().fanout,
        allow_busy_gpus=allow_busy_gpus,
        skip_doctor=skip_doctor,
    )
    ask = ask_keep_running_on_terminal(reporter) if ask_on_interrupt else None
    try:
        result = lifecycle.start_run(spec, plan, inv, Path(playbook), records, reporter, options, ask)
    finally:
        records.close()
    report(result, console)
    return result


def doctor(
    playbook: str | Path | None = None,
    inventory: str | None = None,
    console: Console | None = None,
    port: int | None = None,
    verbose: bool = False,
) -> bool:
    """``fab doctor``: every check on every node (the playbook's first ``nodes`` hosts when one is
    given: its port, and whether its setup installs torch). True when nothing would break a job.
    Verdict lines are printed for warnings and errors (every check with ``verbose``), then the table."""
    from launch.reports.doctor_view import print_findings
    from launch.run import doctor as checks
    from launch.transport.ssh import Fleet

    console = console or Console()
    inv = load_inventory(inventory)
    brings_torch = False
    rdzv_port = DEFAULT_RDZV_PORT
    if playbook is not None:
        spec = load_job_spec(playbook)
        inv = inv.first(spec.nodes)
        rdzv_port = spec.rdzv_port
        brings_torch = checks.torch_from_setup(spec.requirements_text(), spec.setup)
    if port is not None:
        rdzv_port = port
    if not isinstance(rdzv_port, int):
        # ``rdzv_port: auto``: each run gets a port the head's kernel hands out from its ephemeral
        # range, so test reachability on one port drawn from that range (Linux's default range)
        rdzv_port = secrets.SystemRandom().randint(32768, 60999)
        console.print(f"rdzv_port is auto: testing port {rdzv_port}, one from the range runs draw from")
    known_hosts = inv.write_known_hosts(known_hosts_file(inv.fingerprint()))
    with Fleet(inv.hosts, known_hosts, max_parallel=current().fanout) as fleet:
        _obs, findings = checks.doctor(fleet, inv.hosts, rdzv_port, brings_torch)
    print_findings(console, findings, [h.name for h in inv.hosts], verbose=verbose)
    return not findings.failed


def launch_warnings(spec: JobSpec, inventory: Inventory) -> list[str]:
    """Configured rules that cannot work on this fleet, judged with the price the watcher's cost
    rule will use (``price_per_node_hour`` of the head's machine type; the playbook's override wins)."""
    return configuration_warnings(spec.stop, price_per_node_hour(inventory.head.instance_type))


def ask_keep_running_on_terminal(reporter: Reporter) -> AskKeepRunning:
    """The Ctrl-C prompt: keep the job (the on-node watchdog guards it) or stop it and wrap up?"""

    def ask(run_id: str) -> bool:
        if not sys.stdin.isatty():
            return False
        reporter.console.print(
            Text("\nInterrupted. ", style="bold")
            + Text(
                f"[k]eep the job running (re-attach with 'fab watch {clean(run_id)}'; the on-node watchdog "
                "keeps enforcing the stop rules) or [s]top it and wrap up? [s] "
            ),
            end="",
        )
        return input().strip().lower().startswith("k")

    return ask


def world_line(world: object) -> Text | None:
    """``world size N: rank@host(addr), ...`` from the job's ``world`` event, whatever its shape."""
    if not isinstance(world, Mapping):
        return None
    ranks = world.get("ranks")
    parts = []
    for r in ranks[:64] if isinstance(ranks, list) else []:
        if isinstance(r, Mapping):
            parts.append(
                f"{clean(r.get('rank'), 20)}@{clean(r.get('host'), 100)}({clean(r.get('addr'), 100)})"
            )
    more = f", ... ({len(ranks) - 64} more)" if isinstance(ranks, list) and len(ranks) > 64 else ""
    return Text(f"  world size {clean(world.get('world_size'), 20)}: {', '.join(parts)}{more}")


def report(result: RunResult, console: Console) -> None:
    """The end of ``fab train`` / ``fab watch``; everything from the run is printed as text."""
    color = "green" if result.ok else "red"
    console.print(
        Text(result.outcome, style=f"bold {color}") + Text(clean(f" ({result.rule}): {result.reason}"))
    )
    line = world_line(result.world)
    if line is not None:
        console.print(line)
    losses = [point.loss for point in RunFolder(result.folder).read_metrics()[1].history]
    if losses:
        step: Any = result.last_metrics.get("step", len(losses))
        console.print(
            Text(
                f"  loss: {losses[0]:.4f} at the first step -> {losses[-1]:.4f} at step "
                f"{clean(step, 30)} ({len(losses)} steps); plot: {result.folder / 'loss.png'}"
            )
        )
    if result.first_step_after_s is not None:
        console.print(f"  first step {result.first_step_after_s:.1f} s after launch")
    codes = ", ".join(f"{k}={v}" for k, v in result.exit_codes.items())
    console.print(Text(clean(f"  exit codes: {codes}")))
    if result.cost_usd is not None:
        console.print(f"  cost (approx.): ${result.cost_usd:,.2f}")
    console.print(Text(clean(f"  teardown: {result.teardown}")))
    if result.traceback:
        console.print(Text(f"  fleetrun error: see {result.folder / result.traceback}", style="red"))
    console.print(Text(clean(f"  run folder: {result.folder}")))
