"""What every launcher shares: per-node environment conventions, the setup script, the launch script.

A launcher subclass only decides the command each node runs (``node_command``) and which nodes
run it. Everything users rely on across launchers (``MASTER_ADDR``, ``NODE_RANK``, ``TF_CONFIG``,
``GLOO_SOCKET_IFNAME``, the run directory, the metrics helper on ``PYTHONPATH``) is set here once.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod

from launch.errors import SpecError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.planning import remote_layout as layout
from launch.planning.container import ContainerRun, launch_lines
from launch.planning.launchers import cloudml, sagemaker
from launch.planning.plan import LaunchPlan, NodePlan, RemoteFile, export_line, home_export_line

TF_PORT = cloudml.TF_PORT
RDZV_PORT_FILE = "rdzv_port"
"""With ``rdzv_port: auto``: the file in the run directory holding the port chosen on the head at
launch time (sent with ``launch.sh`` in the start bundle); every node's launch script reads it."""
ATTEMPT_FILE = "attempt"
"""The attempt number (1-based), sent with ``launch.sh`` in the start bundle of every attempt."""
RESUME_FILE = "resume_from"
"""Optional: a complete checkpoint directory the laptop chose for this node (sent like ``attempt``)."""
CHECKPOINTS = "checkpoints"
"""``$FLEETRUN_CHECKPOINT_DIR``: under the run directory, so it is the same path in every attempt
of a run on a node, is pulled with the run, and goes to the bucket with it."""
# fleetrun's own variables whose values start with $HOME and are expanded by the node's shell.
# Everything else, the playbook's env included, is exported literally.
HOME_RELATIVE_KEYS = frozenset(
    {
        "FLEETRUN_RUN_DIR",
        "FLEETRUN_OUTPUT_DIR",
        "SM_MODEL_DIR",
        "SM_OUTPUT_DIR",
        "SM_OUTPUT_DATA_DIR",
        "FLEETRUN_CHECKPOINT_DIR",
        "TMPDIR",
        "TORCHINDUCTOR_CACHE_DIR",
    }
)


def home_relative_keys(spec: JobSpec) -> frozenset[str]:
    """The keys of ``HOME_RELATIVE_KEYS`` and the synced channels' ``SM_CHANNEL_<NAME>``, less any the
    playbook's ``env`` sets itself (those are its own values, exported literally)."""
    return (
        frozenset(HOME_RELATIVE_KEYS | sagemaker.home_relative_keys(spec) | cloudml.HOME_RELATIVE_KEYS)
        - spec.env.keys()
    )


def sh_quote(value: str) -> str:
    return shlex.quote(value)


def iface_line(host: Host) -> str:
    """Shell that sets ``IFACE`` to the cluster interface: known from the inventory, or the
    interface holding the host's private address (NCCL/Gloo must not pick the wrong one).

    ``ip`` prints IPv6 addresses in their compressed form, which is how inventories keep them."""
    if host.interface:
        return f"IFACE={sh_quote(host.interface)}"
    return (
        f"IFACE=$(ip -o -{6 if ':' in host.private_address else 4} addr show | awk -v ip="
        + sh_quote(host.private_address)
        + " '{split($4, a, \"/\"); if (a[1] == ip) print $2}' | head -n 1)"
    )


def env_export_lines(env: dict[str, str], expanded: frozenset[str] | set[str]) -> list[str]:
    """``export`` lines for ``env``: keys in ``expanded`` hold ``$HOME/<path>`` and keep ``$HOME``
    live; every other value (the playbook's included) is quoted and exported literally."""
    lines = []
    for key, value in env.items():
        if key in expanded and value.startswith("$HOME/"):
            lines.append(home_export_line(key, value.removeprefix("$HOME/")))
        else:
            lines.append(export_line(key, value))
    return lines


def rdzv_port_line(run_id: str) -> str:
    """Shell that exports ``MASTER_PORT`` from the run's port file, refusing anything but digits."""
    path = f'"$HOME/{layout.rundir(run_id)}/{RDZV_PORT_FILE}"'
    return (
        f"MASTER_PORT=$(cat {path} 2>/dev/null || true); "
        "case \"$MASTER_PORT\" in ''|*[!0-9]*) "
        "echo 'fleetrun: no rendezvous port was sent with this launch script' >&2; exit 2;; esac; "
        "export MASTER_PORT"
    )


def attempt_lines(run_id: str) -> list[str]:
    """Shell that exports ``FLEETRUN_ATTEMPT`` (digits only, else 1) and, when the laptop sent one,
    ``FLEETRUN_RESUME_FROM`` (a path relative to the home becomes absolute; an absolute path or a
    bucket URL is kept). Files, not plan text: the plan is made once, attempts come later."""
    run_dir = f'"$HOME/{layout.rundir(run_id)}'
    return [
        f'FLEETRUN_ATTEMPT=$(cat {run_dir}/{ATTEMPT_FILE}" 2>/dev/null || true); '
        "case \"$FLEETRUN_ATTEMPT\" in ''|*[!0-9]*) FLEETRUN_ATTEMPT=1;; esac; export FLEETRUN_ATTEMPT",
        f'if [ -s {run_dir}/{RESUME_FILE}" ]; then FLEETRUN_RESUME_FROM=$(cat {run_dir}/{RESUME_FILE}"); '
        'case "$FLEETRUN_RESUME_FROM" in /*|*://*) ;; *) FLEETRUN_RESUME_FROM="$HOME/$FLEETRUN_RESUME_FROM";; esac; '
        "export FLEETRUN_RESUME_FROM; fi",
    ]


def mkdir_line(spec: JobSpec) -> str:
    """The folders the job writes into, made before it starts (``job_dir`` too, when set; and the
    ``AIP_*`` folders, ``aip_mkdir_line``)."""
    made = 'mkdir -p "$FLEETRUN_OUTPUT_DIR" "$TMPDIR"' + (' "$FLEETRUN_JOB_DIR"' if spec.job_dir else "")
    return f"{made}; {aip_mkdir_line()}"


def aip_mkdir_line() -> str:
    """Shell text making ``AIP_CHECKPOINT_DIR`` and ``AIP_TENSORBOARD_LOG_DIR`` before the trainer
    starts, as ``AIP_MODEL_DIR`` (the outputs folder) is: on Vertex they are bucket prefixes that
    need no creating, and a trainer writes into them at once (``tf.train.CheckpointManager``,
    ``tf.summary.create_file_writer`` on a missing local folder fail or race). A value the playbook
    sets to a URL (``gs://...``) is left alone."""
    return (
        'for _fr_d in "${AIP_CHECKPOINT_DIR:-}" "${AIP_TENSORBOARD_LOG_DIR:-}"; do '
        'case "$_fr_d" in "" | *://*) ;; *) mkdir -p "$_fr_d" ;; esac; done'
    )


def resolved_procs(spec: JobSpec, host: Host) -> int | None:
    """Processes on this host, or None when ``auto`` must be resolved on the node itself."""
    if spec.procs_per_node != "auto":
        return spec.procs_per_node
    count = host.gpu_count
    if count is None:
        return None
    return count if count > 0 else 1


class Launcher(ABC):
    """Turns (job spec, inventory, run id) into a ``LaunchPlan``. Pure: no I/O."""

    name: str = ""
    uses_rdzv_port: bool = True
    """Whether the nodes need the head's rendezvous port (``MASTER_PORT``). horovodrun does not:
    its Gloo rendezvous server picks its own free port on the head, per run."""
    sagemaker_framework_params: dict[str, object] = {}
    """``SM_FRAMEWORK_PARAMS``: the ``sagemaker_*`` parameters SageMaker's estimator sets for the
    distribution this launcher is the counterpart of."""

    @classmethod
    def for_inventory(cls, inventory: Inventory, dry_run: bool = False) -> Launcher:
        """The launcher with whatever I/O its plan needs done up front (keys, scripts).

        Called by the application layer, never by ``plan``, so plans stay pure. With ``dry_run``
        nothing may be created on the operator's machine (no key is generated or written).
        """
        return cls()

    @classmethod
    def check_spec(cls, spec: JobSpec) -> list[tuple[str, str]]:
        """(field, problem) for what this launcher cannot run; checked when the playbook loads."""
        return []

    @abstractmethod
    def node_command(self, spec: JobSpec, inventory: Inventory, node_rank: int, procs: int | None) -> str:
        """Shell command line run on node ``node_rank`` (in the job's environment and workdir).

        Words fleetrun adds are quoted by the launcher; the playbook's entrypoint stays the shell
        text the user wrote.
        """

    def plan(
        self, spec: JobSpec, inventory: Inventory, run_id: str, poweroff_hook: str | None = None
    ) -> LaunchPlan:
        inventory = inventory.first(spec.nodes)
        procs = [resolved_procs(spec, h) for h in inventory.hosts]
        total = None if any(p is None for p in procs) else sum(p for p in procs if p is not None)
        # One setup (hash and script) per interpreter, not per host: the hash reads the
        # requirements file, and a 64-node fleet usually has one interpreter.
        setups: dict[str, tuple[str, str]] = {}
        for python in {spec.python or h.python for h in inventory.hosts}:
            setup_hash = spec.setup_hash(python)
            setups[python] = (setup_hash, setup_script(spec, python, setup_hash))
        # The fleet kind's hook, given by the caller (planning stays pure); by default the lab's,
        # which never powers anything off: a missing hook must never mean a shutdown.
        hook = layout.NO_POWEROFF_HOOK if poweroff_hook is None else poweroff_hook
        files = (RemoteFile(f"{layout.ROOT}/poweroff", hook, 0o755),)
        nodes = []
        for rank, host in enumerate(inventory.hosts):
            env = self.node_env(spec, inventory, run_id, rank, procs[rank], total)
            command = self.node_command(spec, inventory, rank, procs[rank])
            setup_hash, script = setups[spec.python or host.python]
            nodes.append(
                NodePlan(
                    host=host,
                    node_rank=rank,
                    env=env,
                    command=command,
                    launch_script=self.launch_script(
                        spec,
                        host,
                        run_id,
                        env,
                        command,
                        procs[rank],
                        inventory.fleet.rank_launch_lines(host.name),
                    ),
                    setup_script=script,
                    setup_hash=setup_hash,
                    role="head" if rank == 0 else "worker",
                    files=files,
                )
            )
        notes = []
        if total is None:
            notes.append(
                "procs_per_node is 'auto' and some hosts' GPU counts are unknown: nvidia-smi decides on the node"
            )
        if len(nodes) > spec.relay_sync_above:
            notes.append(
                f"code sync: {len(nodes)} nodes > relay_sync_above ({spec.relay_sync_above}): uploaded once to "
                f"{nodes[0].host.name}, which copies it to the other {len(nodes) - 1} over the private network"
            )
        notes += sagemaker.channel_notes(spec)
        return LaunchPlan(
            run_id=run_id,
            job=spec.name,
            launcher=self.name,
            nodes=nodes,
            total_processes=total,
            notes=notes,
            secrets=spec.secret_values(),
            rdzv_port=spec.rdzv_port if self.uses_rdzv_port else None,
            recovery=spec.recovery,
            min_nodes=spec.min_nodes,
            workdir=str(spec.workdir),
            on_end=tuple(spec.on_end),
            before_stop=tuple(spec.before_stop),
        )

    def node_env(
        self,
        spec: JobSpec,
        inventory: Inventory,
        run_id: str,
        rank: int,
        procs: int | None,
        total: int | None,
    ) -> dict[str, str]:
        """The environment conventions of SkyPilot, dstack, Kubeflow and TF multi-worker, at once.

        Values of ``HOME_RELATIVE_KEYS`` are expanded by the node's shell; everything else is literal.
        """
        head = inventory.head
        ips = [h.private_address for h in inventory.hosts]
        run_dir = layout.home(layout.rundir(run_id))
        env = {
            "FLEETRUN_RUN_ID": run_id,
            "FLEETRUN_JOB": spec.name,
            "FLEETRUN_RUN_DIR": run_dir,
            "FLEETRUN_OUTPUT_DIR": f"{run_dir}/{spec.outputs}",
            "FLEETRUN_CHECKPOINT_DIR": f"{run_dir}/{CHECKPOINTS}",
            # Temp files (torchrun's torchelastic_*, tempfile's) in the run directory, removed when
            # the job ends, never left in the node's /tmp; torch.compile's cache kept across runs
            # in fleetrun's own folder (by default it is in /tmp, per user).
            "TMPDIR": f"{run_dir}/{layout.RUN_TMP}",
            "TORCHINDUCTOR_CACHE_DIR": layout.home(layout.INDUCTOR_CACHE),
            "FLEETRUN_NODE_RANK": str(rank),
            "FLEETRUN_NUM_NODES": str(len(ips)),
            "FLEETRUN_NODE_IPS": ",".join(ips),
            "FLEETRUN_HEAD_IP": head.private_address,
            "MASTER_ADDR": head.private_address,
            "NODE_RANK": str(rank),
            "NNODES": str(len(ips)),
        }
        # What a Cloud ML Engine / Vertex trainer reads (TF_CONFIG, CLUSTER_SPEC, AIP_*), per node.
        env.update(cloudml.cloudml_env(spec, ips, rank, run_dir, env["FLEETRUN_CHECKPOINT_DIR"]))
        if spec.total_steps is not None:  # the metrics helper reports progress against it
            env["FLEETRUN_TOTAL_STEPS"] = str(spec.total_steps)
        if total is not None:
            env["WORLD_SIZE"] = str(total)
        if procs is not None:
            env["FLEETRUN_PROCS_PER_NODE"] = str(procs)
        if spec.data_dir:
            env["FLEETRUN_DATA_DIR"] = spec.data_dir
        # What a SageMaker script reads (SM_HOSTS, SM_CHANNEL_<NAME>, SM_HP_<NAME>, ...), per node.
        env.update(sagemaker.sagemaker_env(spec, inventory, rank, run_dir, self.sagemaker_framework_params))
        host = inventory.hosts[rank]
        if host.gpu_indices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in host.gpu_indices)
        if isinstance(spec.rdzv_port, int):
            env["MASTER_PORT"] = str(spec.rdzv_port)
        if spec.profile is not None:  # read by the node helper fleetrun_profile
            env.update(spec.profile.node_env())
        env.update(spec.env)
        return env

    def launch_script(
        self,
        spec: JobSpec,
        host: Host,
        run_id: str,
        env: dict[str, str],
        command: str,
        procs: int | None,
        fleet_launch: tuple[str, str] = ("", ""),
    ) -> str:
        """The POSIX sh script a node runs. Started detached by the node agent, so it outlives SSH.
        ``fleet_launch``: the fleet's lines before the start and words before the command
        (``FleetRef.rank_launch_lines``: a Slurm allocation's ``srun`` step)."""
        lines = [
            "#!/bin/sh",
            f"# fleetrun: job {spec.name}, run {run_id}, node {host.name}",
            "set -e",
        ]
        lines += env_export_lines(env, home_relative_keys(spec))
        lines.append(f'export PYTHONPATH="$HOME/{layout.LIB}${{PYTHONPATH:+:$PYTHONPATH}}"')
        if spec.rdzv_port == "auto" and self.uses_rdzv_port and "MASTER_PORT" not in spec.env:
            lines.append(rdzv_port_line(run_id))
        lines += attempt_lines(run_id)
        lines.append(iface_line(host))
        lines.append('[ -n "$IFACE" ] && export GLOO_SOCKET_IFNAME="$IFACE" NCCL_SOCKET_IFNAME="$IFACE"')
        if procs is None:
            lines.append(
                "NPROC=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); "
                '[ "${NPROC:-0}" -gt 0 ] || NPROC=1; export NPROC FLEETRUN_PROCS_PER_NODE="$NPROC"'
            )
        if spec.container is None:
            lines.append(f'. "$HOME/{layout.envdir(spec.name)}/bin/activate"')
        else:
            # The ranks use the image's Python; the few node-side helpers (SM_TRAINING_ENV) the node's.
            lines.append(f'python() {{ {sh_quote(spec.python or host.python)} "$@"; }}')
        lines.append(mkdir_line(spec))
        lines += sagemaker.runtime_lines(spec)
        lines.append(f'cd "$HOME/{layout.workdir(spec.name)}"')
        before, srun_words = fleet_launch
        if srun_words and spec.container is not None:
            raise SpecError(
                f"inventory field 'slurm.ranks_via': srun does not start a playbook's container (job {spec.name} "
                "has 'container'); use ranks_via: ssh, or run without a container"
            )
        if before:
            lines.append(before)
        if spec.container is None and srun_words:  # the command as one step of the fleet's scheduler
            lines.append(f"exec {srun_words}{sh_quote(sagemaker.exec_env_prefix(spec) + command)}")
        elif spec.container is None:
            lines.append(f"exec {sagemaker.exec_env_prefix(spec)}{command}")
        else:
            mounts = self.container_extra_mounts(spec, int(env["FLEETRUN_NODE_RANK"]))
            lines += container_lines(spec, run_id, env, command, extra_mounts=mounts)
        return "\n".join(lines) + "\n"

    def container_extra_mounts(self, spec: JobSpec, node_rank: int) -> tuple[str, ...]:
        """Folders of node ``node_rank`` its launcher needs inside the image beyond the ranks' own
        (``container_mounts``): none, but for horovodrun's cluster SSH files on the head."""
        return ()


CONTAINER_EXTRA_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "PYTHONPATH",
    "MASTER_PORT",
    "FLEETRUN_ATTEMPT",
    "FLEETRUN_RESUME_FROM",
    "FLEETRUN_CONTAINER_RUNTIME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "NPROC",
    "FLEETRUN_PROCS_PER_NODE",
    "SM_NUM_CPUS",
    "SM_NUM_GPUS",
    "SM_NETWORK_INTERFACE_NAME",
    "SM_TRAINING_ENV",
)
"""Variables the launch script sets on the node (beside the planned ones) that the ranks read."""


def container_mounts(spec: JobSpec, run_id: str) -> tuple[str, ...]:
    """The node's folders the ranks use, each mounted at its own path: the node library, the
    workdir, the run folder (checkpoints, outputs and TMPDIR are inside it), the compile cache,
    the copied channels' folder, and the node-side channel folders."""
    mounts = [
        layout.home(layout.LIB),
        layout.home(layout.workdir(spec.name)),
        layout.home(layout.rundir(run_id)),
        layout.home(layout.INDUCTOR_CACHE),
    ]
    channels = spec.all_channels()
    if any(channel.copied for channel in channels.values()):
        mounts.append(layout.home(sagemaker.channel_dir(spec.name, "")).rstrip("/"))
    mounts += sorted({c.path for c in channels.values() if c.path is not None})
    return tuple(mounts)


def container_lines(
    spec: JobSpec,
    run_id: str,
    env: dict[str, str],
    command: str,
    *,
    extra_env: tuple[str, ...] = (),
    extra_mounts: tuple[str, ...] = (),
    instance: str = "",
) -> list[str]:
    """Launch-script lines that start ``command`` inside the playbook's image (``launch.planning.container``).

    ``extra_env``: more variables passed by name (a Horovod rank's ``HOROVOD_*``); ``extra_mounts``:
    more of the node's folders at the same path (the head's cluster SSH files, for horovodrun);
    ``instance``: ``ContainerRun.instance``, for a node that starts one container per rank."""
    assert spec.container is not None
    names = [*env, *(k for k in CONTAINER_EXTRA_ENV if k not in env)]
    names += [k for k in extra_env if k not in names]
    names += sorted(sagemaker.odd_names_env(spec))
    mounts = (*container_mounts(spec, run_id), *extra_mounts)
    run = ContainerRun(
        run_id=run_id,
        node_rank=int(env["FLEETRUN_NODE_RANK"]),
        spec=spec.container,
        env_names=tuple(names),
        mounts=mounts,
        workdir=layout.home(layout.workdir(spec.name)),
        command=command,
        instance=instance,
    )
    lines = ["mkdir -p " + " ".join(f'"{m}"' for m in mounts if m.startswith("$HOME/"))]
    lines.append("FLEETRUN_NODE_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)")
    return lines + launch_lines(run, sagemaker.exec_env_prefix(spec))


def setup_script(spec: JobSpec, python: str, setup_hash: str) -> str:
    """Build the job's Python environment and run its setup commands, unless nothing changed.

    The environment is a venv with ``--system-site-packages`` built from the node's interpreter,
    so what the machine image provides (torch in a deep-learning image) is used, not reinstalled.
    When that interpreter is itself a venv (the local fleet's image), its site-packages are layered
    in with a ``.pth`` file, since ``--system-site-packages`` would skip them.
    Prints ``FLEETRUN_SETUP=skipped|ran`` and the previous hash so the laptop can say why.
    """
    env_dir = f"$HOME/{layout.envdir(spec.name)}"
    work = f"$HOME/{layout.workdir(spec.name)}"
    lines = [
        "set -e",
        f'ENV="{env_dir}"',
        f"WANT={setup_hash}",
        'OLD=$(cat "$ENV/.fleetrun-setup-hash" 2>/dev/null || true)',
        'echo "FLEETRUN_OLD_HASH=$OLD"',
        'if [ "$OLD" = "$WANT" ] && [ -x "$ENV/bin/python" ]; then echo FLEETRUN_SETUP=skipped; exit 0; fi',
        'rm -f "$ENV/.fleetrun-setup-hash"',
        # Without pip when the base already has it (a few seconds saved per node and run): the
        # venv's `pip` then runs the base's pip module, which installs into this venv.
        f"if {sh_quote(python)} -c 'import pip' 2>/dev/null; then NOPIP=--without-pip; else NOPIP=; fi",
        f'{sh_quote(python)} -m venv --system-site-packages $NOPIP "$ENV"',
        'if [ -n "$NOPIP" ]; then printf \'#!/bin/sh\\nexec "%s/bin/python" -m pip "$@"\\n\' "$ENV" > "$ENV/bin/pip"; '
        'chmod 755 "$ENV/bin/pip"; fi',
        f"BASE_SITE=$({sh_quote(python)} -c 'import sys, sysconfig; "
        'print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")\')',
        'if [ -n "$BASE_SITE" ]; then '
        '"$ENV/bin/python" -c \'import sys, sysconfig; print(sysconfig.get_paths()["purelib"])\' '
        '| { read -r SITE; echo "$BASE_SITE" > "$SITE/fleetrun-base.pth"; }; fi',
        '. "$ENV/bin/activate"',
        f'cd "{work}"',
    ]
    if spec.requirements:
        lines.append(f"python -m pip install --disable-pip-version-check -q -r {sh_quote(spec.requirements)}")
    for command in spec.setup:
        lines.append(command)
    lines.append('echo "$WANT" > "$ENV/.fleetrun-setup-hash"')
    lines.append("echo FLEETRUN_SETUP=ran")
    return "\n".join(lines) + "\n"
