"""What the commands do, independent of Fabric's task syntax (tasks and tests call these).

``train`` is the pipeline: load the playbook and the inventory, make the plan (``--dry-run``
prints it and stops), then run it and report. Errors the user can act on are ``FleetrunError``.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from launch.cli.queue import take_machines
from launch.cli.runs import open_records
from launch.errors import SpecError
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.select import load_inventory, local_fleet
from launch.job.builtin import resolve_playbook
from launch.job.inventory import Inventory
from launch.job.overrides import overrides_record, parse_overrides
from launch.job.spec import JobSpec, load_job_spec
from launch.job.validation import printable
from launch.paths import known_hosts_file
from launch.planning.launchers import launcher_class
from launch.planning.plan import LaunchPlan
from launch.reports.safe_text import clean
from launch.rules.preflight import errors_by_node, pick_hosts
from launch.rules.pricing import price_per_node_hour
from launch.rules.stoprules import Teardown, configuration_warnings
from launch.run import lifecycle
from launch.run.doctor import hosts_for_run
from launch.run.hooks import local_hooks_verdict, run_on_end, save_on_end, skipped_line
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


def check_channels_fit_the_fleet(spec: JobSpec, inventory: Inventory, playbook: str | Path) -> None:
    """A ``{bucket: prefix}`` data channel needs a fleet with a bucket (a cloud stack's): on lab
    machines or the local fleet it is refused here, before the plan is printed or anything is
    connected to, not after every node was reached and synced."""
    kind = fleet_kind(inventory.fleet)
    for name, channel in sorted(spec.channels.items()):
        if channel.bucket is not None and kind.bucket_download_argv(channel.bucket) is None:
            raise SpecError(
                f"{printable(Path(playbook), 400)}: field 'channels.{clean(name, 100)}.bucket': "
                f"the channel is copied from the fleet's bucket, and inventory {clean(inventory.source, 400)} "
                "has no bucket (only a cloud stack's fleet has one); use a folder on the nodes (path:) "
                "or one on this machine (local:)"
            )


def check_registry_login(spec: JobSpec, playbook: str | Path) -> None:
    """``container.credentials`` read now, before any machine is held or touched: unset or
    malformed is a one-line error naming the playbook and the field (exit 2). The pull stage
    reads them again where it sends them (``launch.run.stages.pull_image``)."""
    from launch.planning.image_pull import registry_of
    from launch.run.registry_login import read_login

    if spec.container is not None and spec.container.credentials is not None:
        read_login(spec.container.credentials, registry_of(spec.container.image), playbook)


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
    overrides: Sequence[str] = (),
    hosts: Sequence[str] = (),
    sweep_id: str | None = None,
    wait: bool = False,
    allow_paths: tuple[Path, ...] = (),
    allow_local_hooks: bool = False,
) -> RunResult | LaunchPlan:
    """The pipeline. ``teardown`` overrides the playbook's (``always``/``on_success``/``never``);
    ``skip_doctor`` launches without the pre-launch checks (``fab doctor``'s cheap part);
    ``overrides``: ``--set key=value`` items (``launch.job.overrides``), recorded with the run;
    ``hosts``: run on these hosts of the inventory (by name, head first) instead of its first ones;
    ``sweep_id``: the ``fab sweep`` this run is a variant of (recorded); ``wait``: queue for the
    machines in arrival order instead of starting at once (``launch.cli.queue``);
    ``allow_local_hooks``: the playbook's ``on_end`` may run on this machine (``launch.run.hooks``)."""
    console = console or Console()
    playbook = resolve_playbook(playbook)
    changes = parse_overrides(overrides)
    spec = load_job_spec(playbook, changes, allowed=allow_paths)
    if teardown is not None:
        try:
            policy = Teardown(teardown)
        except ValueError:
            choices = ", ".join(t.value for t in Teardown)
            raise SpecError(f"--teardown {clean(teardown, 100)!r}: expected one of {choices}") from None
        spec = spec.model_copy(update={"teardown": policy})
    every_host = only_hosts(load_inventory(inventory, save_keys=not dry_run), hosts)
    if not dry_run:  # a scheduler's machines are asked for now (Slurm: --wait waits in its queue)
        every_host = fleet_kind(every_host.fleet).acquire(
            every_host, spec.nodes, spec.name, lambda line: console.print(Text(clean(line))), wait
        )
    started = False
    try:
        inv, choice = every_host.first(spec.nodes), None
        # the run's host keys, pinned once for the whole inventory (spares included): the host
        # choice, the queue and the life cycle all read this one file
        known_hosts = (
            None if dry_run else every_host.write_known_hosts(known_hosts_file(every_host.fingerprint()))
        )
        if known_hosts is not None and not skip_doctor and len(every_host.hosts) > spec.nodes:
            port = spec.rdzv_port if isinstance(spec.rdzv_port, int) else 0
            say_skipped = lambda line: console.print(Text(line, style="yellow"))  # noqa: E731
            inv, choice = hosts_for_run(
                every_host, spec.nodes, port, known_hosts, say_skipped, current().fanout
            )
        check_channels_fit_the_fleet(spec, inv, playbook)
        plan = make_plan(spec, inv, dry_run=dry_run)
        check_profiled_ranks_exist(spec, plan.total_processes, playbook)
        local_hooks = local_hooks_verdict(Path(playbook), spec, allow_local_hooks, record=not dry_run)
        plan = dataclasses.replace(plan, on_end_verdict=local_hooks.why)
        if dry_run:
            console.print(plan.render(), markup=False, highlight=False, soft_wrap=True)
            return plan
        check_registry_login(spec, playbook)
        for warning in launch_warnings(spec, inv):
            console.print(Text("warning: ", style="yellow") + Text(clean(warning)))
        if not local_hooks.allowed:  # said now, not only 9 hours later when they are skipped
            console.print(
                Text("warning: ", style="yellow") + Text(skipped_line(len(spec.on_end), local_hooks.playbook))
            )
        assert known_hosts is not None  # pinned above: not a dry run
        # every run holds its machines (launch.cli.queue): refused when another run holds them, or with
        # --wait queued behind it; its entries are kept fresh until it ended (then removed)
        hold = take_machines(
            inv, known_hosts, plan.run_id, wait, allow_busy_gpus, lambda line: console.print(Text(line))
        )
        folder = RunFolder.create(plan.run_id)
        if choice is not None:  # which hosts the job got, which were skipped and why, the spares
            folder.write_json("hosts.json", choice.record())
        save_on_end(folder.path, spec, local_hooks)
        records = open_records()
        reporter = RichReporter(console)
        options = RunOptions(
            poll_interval=poll_interval,
            max_parallel=current().fanout,
            allow_busy_gpus=allow_busy_gpus,
            skip_doctor=skip_doctor,
            spares=choice.spares if choice is not None else (),
        )
        ask = ask_keep_running_on_terminal(reporter) if ask_on_interrupt else None
        started = True  # from here the run's wrap-up gives the machines back (its teardown)
        try:
            result = lifecycle.start_run(
                spec,
                plan,
                inv,
                Path(playbook),
                records,
                reporter,
                options,
                ask,
                folder=folder,
                known_hosts=known_hosts,
                overrides=overrides_record(changes),
                sweep_id=sweep_id,
            )
        finally:
            records.close()
            hold.release()
    finally:
        if not started and not dry_run:  # ended before the start: what was acquired goes back
            fleet_kind(every_host.fleet).release(lambda line: console.print(Text(clean(line))))
    report(result, console)
    line = missing_profile_ranks_line(spec, result.world)
    if line is not None:
        console.print(Text("  profile: ", style="yellow") + Text(line))
    end_hooks(result, console)
    return result


def _profiled_past(spec: JobSpec, world_size: int) -> list[int]:
    return [r for r in spec.profile.ranks if r >= world_size] if spec.profile is not None else []


def check_profiled_ranks_exist(spec: JobSpec, world_size: int | None, playbook: str | Path) -> None:
    """``profile.ranks`` past the job's processes: the playbook alone cannot tell when
    ``procs_per_node`` is ``auto``; the plan can when every host's GPU count is known."""
    if world_size is None:
        return
    missing = _profiled_past(spec, world_size)
    if missing:
        raise SpecError(
            f"{printable(Path(playbook), 400)}: field 'profile.ranks': rank(s) {', '.join(map(str, missing))} "
            f"do not exist: on this fleet the job has {world_size} process(es) (ranks 0-{world_size - 1})"
        )


def missing_profile_ranks_line(spec: JobSpec, world: object) -> str | None:
    """After the run, once the nodes said the world size (``procs_per_node: auto`` resolved on
    the nodes): why no trace came from a profiled rank that never existed."""
    size = world.get("world_size") if isinstance(world, Mapping) else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    missing = _profiled_past(spec, size)
    if not missing:
        return None
    return (
        f"no trace from rank(s) {', '.join(map(str, missing))} (profile.ranks): the job ran "
        f"{size} process(es), ranks 0-{size - 1}"
    )


def end_hooks(result: RunResult, console: Console) -> None:
    """The playbook's ``on_end`` commands, now that the run is recorded (``launch.run.hooks``)."""
    run_on_end(result.folder, say=lambda line: console.print(Text(line, style="yellow")))


def doctor(
    playbook: str | Path | None = None,
    inventory: str | None = None,
    console: Console | None = None,
    port: int | None = None,
    verbose: bool = False,
    collective: bool = False,
    overrides: Sequence[str] = (),
    gpu_diag: int = 0,
    allow_paths: tuple[Path, ...] = (),
) -> bool:
    """``fab doctor``: every check on every node (the playbook's first ``nodes`` hosts when one is
    given: its port, and whether its setup installs torch). True when nothing would break a job.
    Verdict lines are printed for warnings and errors (every check with ``verbose``), then the table.
    ``gpu_diag`` (1, 2 or 3): then DCGM's diagnostic ``dcgmi diag -r N`` on every reachable node
    at once, a line per GPU with a failed test. ``collective``: then an all-reduce and matmul test
    through torchrun on the hosts a job would get, in one launch: the fleet, then a ring of pairs
    that names the slow node or link (``launch.run.collective``), kept under the runs folder."""
    from launch.reports.doctor_view import print_findings
    from launch.run import doctor as checks
    from launch.transport.ssh import Fleet

    console = console or Console()
    if port is not None and not 1 <= port <= 65535:
        # checked before anything is read or connected to: Python's socket would raise OverflowError
        raise SpecError(f"--port {port}: expected a TCP port, 1 to 65535")
    if overrides and playbook is None:
        raise SpecError(
            "--set changes a playbook's field: name the playbook too (fab doctor --playbook FILE --set ...)"
        )
    if gpu_diag and gpu_diag not in checks.DIAG_LEVELS:
        raise SpecError(f"--gpu-diag {gpu_diag}: expected 1 (seconds), 2 (about 2 minutes) or 3 (about 15)")
    inv = load_inventory(inventory)
    fleet_ok = True
    for level, line in fleet_kind(inv.fleet).health():  # a scheduler's login host and partition
        style = {"ok": "green", "warning": "yellow"}.get(level, "bold red")
        console.print(Text(f"{level:<7} ", style=style) + Text(clean(line, 600)))
        fleet_ok = fleet_ok and level != "error"
    brings_torch = False
    rdzv_port = DEFAULT_RDZV_PORT
    nodes = None
    container = None
    if playbook is not None:
        spec = load_job_spec(playbook, parse_overrides(overrides), allowed=allow_paths)
        nodes = spec.nodes
        inv = inv if len(inv.hosts) > spec.nodes else inv.first(spec.nodes)
        rdzv_port = spec.rdzv_port
        brings_torch = checks.torch_from_setup(spec.requirements_text(), spec.setup)
        container = checks.ContainerCheck.of(spec)
    if port is not None:
        rdzv_port = port
    if not isinstance(rdzv_port, int):
        # ``rdzv_port: auto``: each run gets a port the head's kernel hands out from its ephemeral
        # range, so test reachability on one port drawn from that range (Linux's default range)
        rdzv_port = secrets.SystemRandom().randint(32768, 60999)
        console.print(f"rdzv_port is auto: testing port {rdzv_port}, one from the range runs draw from")
    known_hosts = inv.write_known_hosts(known_hosts_file(inv.fingerprint()))
    with Fleet(inv.hosts, known_hosts, max_parallel=current().fanout) as fleet:
        observations, findings = checks.doctor(fleet, inv.hosts, rdzv_port, brings_torch, container)
        if gpu_diag:
            diag_check(
                console,
                fleet,
                [h for h, o in zip(inv.hosts, observations, strict=True) if o.error is None],
                findings,
                gpu_diag,
                [h.name for h in inv.hosts],
            )
        if collective:
            collective_check(console, fleet, inv.hosts, findings, nodes, rdzv_port)
    print_findings(console, findings, [h.name for h in inv.hosts], verbose=verbose)
    if nodes is not None and len(inv.hosts) > nodes:
        # spares: a job needs only ``nodes`` healthy hosts; the others' errors do not fail it
        chosen, excluded = pick_hosts([h.name for h in inv.hosts], errors_by_node(findings), nodes)
        for name, why in excluded.items():
            console.print(Text(clean(f"a job would skip {name}: {why}", 600)))
        if not chosen:
            console.print(Text(f"fewer than {nodes} healthy hosts: a job would not start", style="bold red"))
            return False
        console.print(Text(clean(f"a job of {nodes} node(s) would get: {', '.join(chosen)}", 2000)))
        return fleet_ok
    return fleet_ok and not findings.failed


def diag_check(
    console: Console, fleet: Any, hosts: list[Any], findings: Any, level: int, order: list[str]
) -> None:
    """``fab doctor --gpu-diag LEVEL`` on the reachable hosts, its lines added to the findings."""
    from launch.rules.preflight import check_gpu_diag
    from launch.run import doctor as checks

    if not hosts:
        return
    bound = checks.diag_timeout(level)
    console.print(
        f"gpu diag: dcgmi diag -r {level} on {len(hosts)} node(s) at once (at most {bound / 60:.0f} min) ..."
    )
    check_gpu_diag(findings, checks.gpu_diag(fleet, hosts, level), order)


def collective_check(
    console: Console, fleet: Any, hosts: list[Any], findings: Any, nodes: int | None, port: int
) -> None:
    """``fab doctor --collective`` on the hosts a job would get (reachable, no error), its lines
    added to the doctor's findings and its figures saved as ``collective/<time>.json`` in the runs
    folder; then compared with the results saved before (``launch.rules.collective.compare_history``):
    a fleet or node figure far under its history's median is a warning."""
    import os
    import time

    from launch.paths import runs_dir
    from launch.rules.collective import verdict_lines
    from launch.run import collective as test

    # the hosts a job would get; without a playbook, every host without an error (two at least)
    names = [h.name for h in hosts]
    chosen, _excluded = pick_hosts(names, errors_by_node(findings), nodes or len(hosts), None if nodes else 2)
    usable = [h for h in hosts if h.name in chosen]
    if len(usable) < 2:
        console.print(Text("collective: fewer than two healthy nodes, nothing to measure", style="yellow"))
        return
    console.print(f"collective: all-reduce and matmul on {len(usable)} nodes through torchrun ...")
    sizes = {
        k: v
        for k in ("FLEETRUN_COLLECTIVE_MB", "FLEETRUN_COLLECTIVE_REPS", "FLEETRUN_COLLECTIVE_CONFIRM_REPS")
        if (v := os.environ.get(k, ""))
    }
    sizes = {k: v for k, v in sizes.items() if v.replace(".", "", 1).isdigit() and len(v) < 10}
    report, seconds = test.check(fleet, usable, port, sizes)
    level = {"ok": "ok", "warn": "warn", "error": "error"}
    for node, lv, message in verdict_lines(report):
        if node == "fleet":
            console.print(
                Text(clean(f"collective fleet: {message}", 600), style="red" if lv == "error" else "")
            )
            if lv == "error":
                findings.add(usable[0].name, "collective", level[lv], message)
        else:
            findings.add(node, "collective", level[lv], message)
    path, compared, notes = test.keep_and_compare(
        runs_dir() / "collective", report, [h.name for h in usable], seconds, time.time()
    )
    for finding in compared:
        text = f"fleet {finding.message}" if finding.fleet else finding.message
        if finding.level == "warn":  # the fleet's figure goes with the first node, as its error does
            findings.add(usable[0].name if finding.fleet else finding.node, "collective", "warn", text)
        else:
            console.print(Text(clean(f"collective history: {finding.node}: {finding.message}", 600)))
    for note in notes:
        console.print(Text(clean(f"collective history: {note}", 600), style="yellow"))
    console.print(
        Text(
            clean(
                f"collective: {seconds:.1f} s, {len(report.measured)} measurement(s); figures in {path}", 600
            )
        )
    )


def collective_history(console: Console) -> None:
    """``fab doctor --collective-history``: the saved collective results over time, per fleet and
    per node, each against the median of the runs before it. Nothing is contacted."""
    from launch.paths import runs_dir
    from launch.reports.collective_view import history_view
    from launch.run.collective import read_history

    folder = runs_dir() / "collective"
    history = read_history(folder)
    for note in history.bounded_notes():
        console.print(Text(clean(note, 600), style="yellow"))
    if history.older_left_out:
        console.print(Text(f"{history.older_left_out} older result(s) in {clean(folder, 300)} not read"))
    console.print(history_view([r for _p, r in history.results]))


def only_hosts(inventory: Inventory, names: Sequence[str]) -> Inventory:
    """The inventory cut to the named hosts, in the order named (``--hosts``; a sweep's slot)."""
    if not names:
        return inventory
    by_name = {h.name: h for h in inventory.hosts}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SpecError(
            f"--hosts: {clean(unknown[0], 100)!r} is not a host of inventory {clean(inventory.source, 200)} "
            f"(it has {', '.join(list(by_name)[:20])})"
        )
    return inventory.model_copy(update={"hosts": [by_name[n] for n in dict.fromkeys(names)]})


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


def teardown_words(teardown: object) -> str:
    """``skipped (teardown: never, ...)``, not ``skipped: skipped (...)``: a decision's reason
    often starts with its state already."""
    state, message = getattr(teardown, "state", None), getattr(teardown, "message", None)
    if isinstance(message, str) and state is not None and message.startswith(str(state.value)):
        return message
    return str(teardown)


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
    console.print(Text(clean(f"  teardown: {teardown_words(result.teardown)}")))
    if result.traceback:
        console.print(Text(f"  fleetrun error: see {result.folder / result.traceback}", style="red"))
    console.print(Text(clean(f"  run folder: {result.folder}")))
