"""A run's front door: from a command's request to a started run, then the life cycle.

Every command that starts a run (``fab train``, and ``fab sweep`` for each variant, which is one
``fab train`` of the playbook with its ``--set`` items) comes through here, so a run's edges are
decided in one place: the playbook read with its overrides and its teardown (``--teardown``; a
sweep's variant has its playbook's, and keeps the fleet for the sweep's other variants while
they need it: ``launch.run.sweeps``), the inventory cut to ``--hosts``, the host keys pinned once for the
whole inventory (spares included: the host choice, the queue turn and the stages all read that
one file), the host choice (with spares, the first healthy hosts: ``doctor.hosts_for_run``), the
plan, the ``on_end`` verdict and the launch warnings (``prepare``). ``launch`` then hands the run
to ``launch.run.lifecycle.start_run``: the queue turn, the stages, the wrap-up (teardown or
keep-warm), the report and the hooks. The command itself only prints a dry run's plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.errors import SpecError
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.select import load_inventory
from launch.job.builtin import resolve_playbook
from launch.job.inventory import Inventory
from launch.job.overrides import overrides_record, parse_overrides
from launch.job.spec import JobSpec, load_job_spec
from launch.job.validation import printable
from launch.paths import fleetrun_home, known_hosts_file
from launch.planning.image_pull import registry_of
from launch.planning.launchers import launcher_class
from launch.planning.plan import LaunchPlan
from launch.reports.safe_text import clean
from launch.rules.pricing import price_per_node_hour
from launch.rules.stoprules import Teardown, configuration_warnings
from launch.run import lifecycle, warm
from launch.run.doctor import HostChoice, hosts_for_run
from launch.run.hooks import LocalHooks, local_hooks_verdict, skipped_line
from launch.run.records import RunRecords
from launch.run.registry_login import read_login
from launch.run.reporter import Reporter
from launch.run.run_folder import new_run_id
from launch.run.state import AskKeepRunning, RunOptions
from launch.run.summary import RunSummary
from launch.run.waiting import waiting
from launch.settings import current

__all__ = [
    "PreparedRun",
    "RunRequest",
    "check_channels_fit_the_fleet",
    "check_profiled_ranks_exist",
    "check_registry_login",
    "launch",
    "launch_warnings",
    "make_plan",
    "only_hosts",
    "prepare",
    "run",
]


@dataclass(frozen=True)
class RunRequest:
    """What a command asks for: one run of a playbook, as ``fab train``'s options say it.

    ``teardown`` overrides the playbook's (``always``/``on_success``/``never``); ``overrides``:
    ``--set key=value`` items, recorded with the run; ``hosts``: run on these hosts of the
    inventory (by name, head first) instead of its first ones; ``sweep_id``: the ``fab sweep``
    this run is a variant of (recorded; its end leaves the fleet to the sweep's other variants
    while they need it); ``wait``: queue for the
    machines in arrival order instead of starting at once; ``skip_doctor``: launch without the
    pre-launch checks; ``allow_local_hooks``: the playbook's ``on_end`` may run on this machine."""

    playbook: str | Path
    inventory: str | None = None
    overrides: tuple[str, ...] = ()
    teardown: str | None = None
    hosts: tuple[str, ...] = ()
    sweep_id: str | None = None
    wait: bool = False
    allow_busy_gpus: bool = False
    skip_doctor: bool = False
    allow_paths: tuple[Path, ...] = ()
    allow_local_hooks: bool = False
    poll_interval: float = 1.0

    @classmethod
    def of(cls, playbook: str | Path, **fields: Any) -> RunRequest:
        """The request from keyword options as a caller holds them (lists, ``None`` for unset);
        an unknown name is a ``TypeError``, as for any call."""
        for name in ("overrides", "hosts", "allow_paths"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls(playbook, **{k: v for k, v in fields.items() if v is not None})


@dataclass(frozen=True)
class PreparedRun:
    """A run decided and planned, nothing started: what ``launch`` starts (or a dry run prints)."""

    request: RunRequest
    playbook: Path
    spec: JobSpec
    plan: LaunchPlan
    inventory: Inventory
    """The hosts the job gets (the host choice made, when the inventory has spares)."""
    known_hosts: Path | None
    """The run's pinned host keys (None for a dry run: nothing is written)."""
    choice: HostChoice | None
    local_hooks: LocalHooks


def make_plan(
    spec: JobSpec, inventory: Inventory, run_id: str | None = None, dry_run: bool = False
) -> LaunchPlan:
    """``dry_run``: the launcher creates nothing on this machine (no cluster key is generated)."""
    launcher = launcher_class(spec.launcher).for_inventory(inventory.first(spec.nodes), dry_run=dry_run)
    hook = fleet_kind(inventory.fleet).poweroff_hook()
    return launcher.plan(spec, inventory, run_id or new_run_id(spec.name), poweroff_hook=hook)


def teardown_policy(spec: JobSpec, teardown: str | None) -> JobSpec:
    """The run's teardown: ``--teardown`` over the playbook's. A sweep's variant has its
    playbook's, as any run: while the sweep still needs the fleet, its end keeps it for the
    other variants (``launch.run.sweeps``)."""
    if teardown is None:
        return spec
    try:
        policy = Teardown(teardown)
    except ValueError:
        choices = ", ".join(t.value for t in Teardown)
        raise SpecError(f"--teardown {clean(teardown, 100)!r}: expected one of {choices}") from None
    if policy is Teardown.NEVER and spec.keep_warm_s is not None:
        # the playbook alone is checked when it loads (launch.job.coherence); the option comes after
        raise SpecError(
            f"--teardown never: the playbook's field 'keep_warm_s' ({spec.keep_warm_s:g} s) keeps the fleet "
            "warm and then tears it down, but never leaves it running with nothing to end it: use "
            "--teardown always (or on_success), or remove keep_warm_s"
        )
    return spec.model_copy(update={"teardown": policy})


def prepare(request: RunRequest, reporter: Reporter, dry_run: bool = False) -> PreparedRun:
    """The run's playbook, hosts and plan; the launch warnings said (not for a dry run).
    Bad input raises ``SpecError`` before anything is connected to."""
    playbook = resolve_playbook(request.playbook)
    changes = parse_overrides(request.overrides)
    spec = load_job_spec(playbook, changes, allowed=request.allow_paths)
    spec = teardown_policy(spec, request.teardown)
    every_host = only_hosts(load_inventory(request.inventory, save_keys=not dry_run), request.hosts)
    if dry_run:
        return _decide(request, reporter, playbook, spec, every_host, dry_run=True)
    # a scheduler's machines are asked for now (Slurm: --wait waits in its queue); a run that
    # ends before its start gives them back (its teardown does it otherwise)
    kind = fleet_kind(every_host.fleet)
    with waiting(reporter, f"machines for {spec.name} from {kind.describe()}") as say:
        every_host = kind.acquire(every_host, spec.nodes, spec.name, say, request.wait)
    try:
        return _decide(request, reporter, playbook, spec, every_host, dry_run=False)
    except BaseException:
        fleet_kind(every_host.fleet).release(lambda line: reporter.say(line))
        raise


def _decide(
    request: RunRequest,
    reporter: Reporter,
    playbook: Path,
    spec: JobSpec,
    every_host: Inventory,
    *,
    dry_run: bool,
) -> PreparedRun:
    """The host choice, the plan and the checks of a run whose machines are known."""
    say = lambda line: reporter.say((line, "yellow"))  # noqa: E731
    inv, choice = every_host.first(spec.nodes), None
    known_hosts = (
        None if dry_run else every_host.write_known_hosts(known_hosts_file(every_host.fingerprint()))
    )
    if known_hosts is not None and not request.skip_doctor and len(every_host.hosts) > spec.nodes:
        port = spec.rdzv_port if isinstance(spec.rdzv_port, int) else 0
        inv, choice = hosts_for_run(every_host, spec.nodes, port, known_hosts, say, current().fanout)
    check_channels_fit_the_fleet(spec, inv, playbook)
    plan = make_plan(spec, inv, dry_run=dry_run)
    check_profiled_ranks_exist(spec, plan.total_processes, playbook)
    local_hooks = local_hooks_verdict(playbook, spec, request.allow_local_hooks, record=not dry_run)
    plan = dataclasses.replace(plan, on_end_verdict=local_hooks.why)
    if not dry_run:
        check_registry_login(spec, playbook)
        for warning in launch_warnings(spec, inv):
            reporter.say(("warning: ", "yellow"), warning)
        if not local_hooks.allowed and spec.on_end:  # said now, not only 9 hours later when skipped
            reporter.say(("warning: ", "yellow"), skipped_line(len(spec.on_end), local_hooks.playbook))
    return PreparedRun(request, playbook, spec, plan, inv, known_hosts, choice, local_hooks)


def run(
    request: RunRequest, reporter: Reporter, ask: AskKeepRunning | None, *, dry_run: bool = False
) -> RunSummary | LaunchPlan:
    """One run of a request, front door to last hook: ``prepare``, then ``launch`` with the run
    records under ``FLEETRUN_HOME``. The playbook read here goes down to the nodes from here
    (never back up to the command). A dry run prints the plan (``--dry-run``) and returns it."""
    prepared = prepare(request, reporter, dry_run=dry_run)
    if dry_run:
        reporter.console.print(prepared.plan.render(), markup=False, highlight=False, soft_wrap=True)
        return prepared.plan
    with RunRecords(fleetrun_home() / "runs.db") as records:
        return launch(prepared, records, reporter, ask)


def launch(
    prepared: PreparedRun, records: RunRecords, reporter: Reporter, ask: AskKeepRunning | None
) -> RunSummary:
    """Start the prepared run and follow it to its end (``lifecycle.start_run``): the queue turn,
    the stages, the wrap-up, the report and the ``on_end`` hooks."""
    request = prepared.request
    assert prepared.known_hosts is not None, "a dry run is not launched"
    options = RunOptions(
        poll_interval=request.poll_interval,
        max_parallel=current().fanout,
        allow_busy_gpus=request.allow_busy_gpus,
        skip_doctor=request.skip_doctor,
        spares=prepared.choice.spares if prepared.choice is not None else (),
    )
    return lifecycle.start_run(
        prepared.spec,
        prepared.plan,
        prepared.inventory,
        prepared.playbook,
        records,
        reporter,
        options,
        ask,
        known_hosts=prepared.known_hosts,
        overrides=overrides_record(parse_overrides(request.overrides)),
        sweep_id=request.sweep_id,
        wait=request.wait,
        choice=prepared.choice,
        local_hooks=prepared.local_hooks,
    )


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
    if spec.container is not None and spec.container.credentials is not None:
        read_login(spec.container.credentials, registry_of(spec.container.image), playbook)


def check_profiled_ranks_exist(spec: JobSpec, world_size: int | None, playbook: str | Path) -> None:
    """``profile.ranks`` past the job's processes: the playbook alone cannot tell when
    ``procs_per_node`` is ``auto``; the plan can when every host's GPU count is known."""
    if world_size is None or spec.profile is None:
        return
    missing = [r for r in spec.profile.ranks if r >= world_size]
    if missing:
        raise SpecError(
            f"{printable(Path(playbook), 400)}: field 'profile.ranks': rank(s) {', '.join(map(str, missing))} "
            f"do not exist: on this fleet the job has {world_size} process(es) (ranks 0-{world_size - 1})"
        )


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
    rule will use (``price_per_node_hour`` of the head's machine type; the playbook's override wins),
    and a ``keep_warm_s`` this fleet's kind cannot honour (only machines that can power themselves
    off are kept warm: a local fleet's, a cloud stack's)."""
    warnings = configuration_warnings(spec.stop, price_per_node_hour(inventory.head.instance_type))
    kind = fleet_kind(inventory.fleet)
    if spec.keep_warm_s and not warm.applies(inventory, spec.keep_warm_s):
        warnings.append(
            f"keep_warm_s {spec.keep_warm_s:g}: a {clean(kind.name, 40)} fleet is not kept warm (only a local "
            f"fleet or a cloud stack's machines power themselves off at a deadline); its teardown "
            f"({Teardown(spec.teardown).value}) applies as the playbook says"
        )
    return warnings
