"""horovodrun with Gloo (no MPI), started on the head node only; it SSHes to the workers itself.

The shape is SageMaker's ``mpi`` distribution with ``processes_per_host``: one launcher on the
head, ``horovodrun -np <total> -H <ip>:<slots>,...``, over the cluster's private addresses.
fleetrun still syncs, sets up, watches and stops every node; only the head has a launch script.

How a remote rank comes to run in the job's own environment: horovodrun runs, on each host,
``cd <head's cwd>; env <the head's whole environment> HOROVOD_RANK=... <command>``. The head's
environment carries the run id (so ``stop`` finds every rank by ``FLEETRUN_RUN_ID``) and the
playbook's variables, but also the head's ``HOME``, ``PATH``, ``PYTHONPATH`` and run directory,
which are wrong on a worker when its user differs (the local fleet) or its home does. So the
command is a tiny ``sh -c`` that finds the node user's real home from the password database and
runs that node's ``rank.sh`` (a plan file in the run directory): it restores the node's own
fleetrun environment, interface and venv, enters the workdir, runs the playbook's entrypoint,
and keeps a per-rank log. On a worker, a failing rank also records its exit code as the run
directory's ``rc``, so the node agent reports which node failed and with what code.

SSH from the head uses the cluster key (``launch.planning.cluster_ssh``): passed to horovodrun with
``-i``/``-p`` explicitly, and a wrapper first on ``PATH`` that makes host-key checking strict
against the workers' pinned keys. ``--network-interfaces`` skips horovodrun's interface probe
(which would start task services on every host); each rank then sets ``HOROVOD_GLOO_IFACE`` to its
own node's interface, so nodes whose NICs are named differently still work.

With ``container:`` Horovod comes from the image, never from the node (its ranks import
``horovod.torch``, built against the image's torch, so the image must carry it; nothing is built on
the node). horovodrun runs inside the head's container (``launch_script``'s container lines, with
the cluster SSH folder mounted at its own path, so the same wrapper, key and pinned known_hosts are
in force: the image needs an ``ssh`` client). The head's own ranks are horovodrun's children in
that container. A worker's ranks are started by SSH on the worker itself, outside any container:
there each rank's ``rank.sh`` runs the entrypoint through the node's runtime, one container per
rank (``-r$HOROVOD_RANK`` in its name), built by the same ``launch.planning.container`` command as
torchrun's, with horovodrun's variables passed in by name (``RANK_ENV``). Each container carries
the run's label and the rank script records the runtime in the worker's run folder, so a stop,
the watchdog and a failed rank's wrap-up (``fleetrun_node.stop_run``) remove them as torchrun's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from fleetrun_images import runtime_file
from launch.errors import SpecError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec, horovod_problems
from launch.planning import cluster_ssh
from launch.planning import remote_layout as layout
from launch.planning.launchers import sagemaker
from launch.planning.launchers.base import (
    Launcher,
    container_lines,
    env_export_lines,
    home_relative_keys,
    iface_line,
    mkdir_line,
    resolved_procs,
    sh_quote,
)
from launch.planning.plan import LaunchPlan, NodePlan, RemoteFile

INSTALL_SCRIPT = ".fleetrun/horovod/install.sh"
INSTALL_ORIGIN = "images/horovod/install.sh"
START_TIMEOUT_S = 120
GLOO_TIMEOUT_S = 120
# Node-specific variables the head's environment brings along; rank.sh sets them for its node.
NODE_KEYS = ("PATH", "PYTHONPATH", "VIRTUAL_ENV")
RANK_ENV = (
    # horovodrun's, per rank (gloo_run.create_slot_env_vars) and per run (create_run_env_vars)
    "HOROVOD_HOSTNAME",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_CONTROLLER",
    "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_GLOO_IFACE",
    "HOROVOD_GLOO_TIMEOUT_SECONDS",
    # what horovodrun's options set for the ranks (config_parser.set_env_from_args)
    "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HOROVOD_TORUS_ALLREDUCE",
    "HOROVOD_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_LOG_LEVEL",
    "HOROVOD_LOG_HIDE_TIME",
    "HOROVOD_NUM_NCCL_STREAMS",
    "HOROVOD_THREAD_AFFINITY",
    "PYTHONUNBUFFERED",
    # torch.distributed's names, which rank.sh sets from Horovod's
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
)
"""What a worker's rank container gets by name beside the node's own variables: horovodrun hands
them to the rank's shell (on its command line); a container starts with none of its caller's."""
RANK_INSTANCE = "-r$HOROVOD_RANK"
"""The end of a worker's rank container name: one container per rank (``ContainerRun.instance``)."""
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ShippedScript(RemoteFile):
    """A RemoteFile that ``--dry-run`` names by origin and digest instead of printing in full.

    The install script is the same long file on every node; the plan shows where it comes from
    and its hash (which is also part of the setup hash), so the dry run stays readable.
    """

    origin: str = ""

    def describe(self) -> str:
        digest = hashlib.sha256(self.content.encode()).hexdigest()[:12]
        return (
            f"~/{self.path} (mode {self.mode:o}): {self.origin}, {len(self.content)} bytes, sha256 {digest}"
        )


def rank_script_path(run_id: str) -> str:
    return f"{layout.rundir(run_id)}/rank.sh"


def rank_command() -> str:
    """What horovodrun runs for every rank: this node's ``rank.sh`` for this run, found from the real home.

    ``HOME`` came from the head, so the home is looked up by user name (``~user``), not trusted;
    the run id did come from the head, and is the same everywhere. The home is passed on as ``$1``.
    Only where that home has no such script *and* this is a podman or docker container (their
    marker files) is ``HOME`` taken: the head's container (``container:``), whose user is the
    image's root (rootless podman) or a bare uid (docker), and where ``HOME`` is the node user's,
    passed in by the launch script. On a node itself a missing script fails the rank, as before.
    """
    rank_sh = f"{layout.ROOT}/runs/$FLEETRUN_RUN_ID/rank.sh"
    script = (
        'eval "node_home=~$(id -un 2>/dev/null)"; '
        f'if [ ! -f "$node_home/{rank_sh}" ] && {{ [ -f /run/.containerenv ] || [ -f /.dockerenv ]; }}; '
        "then node_home=$HOME; fi; "
        f'exec sh "$node_home/{rank_sh}" "$node_home"'
    )
    return f"sh -c {sh_quote(script)}"


def hosts_arg(hosts: list[Host], procs: list[int | None]) -> str:
    """``-H ip:slots,...`` over private addresses; unknown slots take the head's ``$NPROC``."""
    return ",".join(
        f"{h.private_address}:{p if p is not None else '$NPROC'}" for h, p in zip(hosts, procs, strict=True)
    )


class HorovodLauncher(Launcher):
    """``horovodrun`` on the head over Gloo. Pure: the cluster key and install script are passed in.

    ``app.make_plan`` loads (or creates) the inventory's cluster key and reads
    ``images/horovod/install.sh``; tests pass their own.
    """

    name = "horovod"
    sagemaker_framework_params: dict[str, object] = {"sagemaker_mpi_enabled": True}
    """SageMaker's ``mpi`` distribution, which horovodrun stands in for."""
    # horovodrun's Gloo rendezvous server binds a free port of its own on the head for each run,
    # so concurrent horovod runs on the same machines need nothing from fleetrun's port choice
    uses_rdzv_port = False

    def __init__(self, cluster_key: cluster_ssh.ClusterKey | None = None, install_script: str = "") -> None:
        self.cluster_key = cluster_key
        self.install_script = install_script

    @classmethod
    def check_spec(cls, spec: JobSpec) -> list[tuple[str, str]]:
        """``launch.job.spec.horovod_problems``: checked when the playbook loads."""
        return horovod_problems(spec)

    @classmethod
    def for_inventory(cls, inventory: Inventory, dry_run: bool = False) -> HorovodLauncher:
        return load_horovod_launcher(inventory, dry_run=dry_run)

    # -- the head's command -----------------------------------------------------------------------
    def node_command(self, spec: JobSpec, inventory: Inventory, node_rank: int, procs: int | None) -> str:
        """horovodrun's command line; with ``container:``, the shell text its container runs
        (``in_container``)."""
        command = self.horovodrun_command(spec, inventory)
        return command if spec.container is None else self.in_container(spec, command)

    def in_container(self, spec: JobSpec, command: str) -> str:
        """``command`` as the head's container runs it: what ``head_launch_script`` does on the
        node without a container is done inside (the cluster ``ssh`` wrapper first on ``PATH``, the
        playbook's variables unset), and ``IFACE`` and ``NPROC``, the launch script's own shell
        variables, are taken from what it exported of them (``GLOO_SOCKET_IFNAME``,
        ``FLEETRUN_PROCS_PER_NODE``)."""
        lines = ['IFACE="${GLOO_SOCKET_IFNAME:-}"; NPROC="${FLEETRUN_PROCS_PER_NODE:-1}"']
        private = sorted(k for k in spec.env if not k.startswith("HOROVOD_"))
        if private:
            lines.append("unset " + " ".join(private))
        lines.append(f'export PATH="$HOME/{cluster_ssh.BIN_DIR}:$PATH"')
        lines.append(f"exec {command}")
        return "; ".join(lines)

    def horovodrun_command(self, spec: JobSpec, inventory: Inventory) -> str:
        hosts = inventory.hosts
        all_procs = [resolved_procs(spec, h) for h in hosts]
        if any(p is None for p in all_procs):
            # Unknown GPU counts: every host is taken to match the head (nvidia-smi on the head).
            all_procs = [None] * len(hosts)
            np_arg = f'"$(({len(hosts)} * NPROC))"'
        else:
            np_arg = str(sum(p for p in all_procs if p is not None))
        words = [
            "python",
            "-m",
            "horovod.runner.launch",
            "--gloo",
            "--disable-cache",
            "-np",
            np_arg,
            "-H",
            f'"{hosts_arg(hosts, all_procs)}"' if None in all_procs else hosts_arg(hosts, all_procs),
        ]
        if len(hosts) > 1:
            # With every host local, horovodrun insists on the loopback interface; name none then.
            words += ["--network-interfaces", '"$IFACE"']
        ports = {h.port for h in hosts[1:]}
        if len(ports) == 1:
            # One port for all workers: say it explicitly. Otherwise each Port is in ssh_config.
            words += ["-p", str(ports.pop())]
        if len(hosts) > 1:
            words += ["-i", f'"$HOME/{cluster_ssh.PRIVATE_KEY}"']
        words += [
            "--start-timeout",
            str(START_TIMEOUT_S),
            "--gloo-timeout-seconds",
            str(GLOO_TIMEOUT_S),
            rank_command(),
        ]
        return " ".join(words)

    # -- the plan --------------------------------------------------------------------------------
    def plan(
        self, spec: JobSpec, inventory: Inventory, run_id: str, poweroff_hook: str | None = None
    ) -> LaunchPlan:
        if self.cluster_key is None:
            raise SpecError(
                "the horovod launcher needs the cluster's SSH key; plans are made by launch.cli.app.make_plan"
            )
        inventory = inventory.first(spec.nodes)
        for i, host in enumerate(inventory.hosts):
            if ":" in host.private_address:
                raise SpecError(
                    f"{inventory.source}: field 'hosts[{i}].private_address': horovodrun's -H host:slots "
                    f"cannot carry an IPv6 address ({host.private_address}); use the torchrun launcher "
                    "or IPv4 private addresses"
                )
        base = super().plan(self.setup_spec(spec), inventory, run_id, poweroff_hook)
        head_host = inventory.head
        workers = inventory.hosts[1:]
        head_files = cluster_ssh.head_files(self.cluster_key, workers) if workers else ()
        nodes: list[NodePlan] = []
        for node in base.nodes:
            files: tuple[RemoteFile, ...] = (
                *node.files,
                ShippedScript(INSTALL_SCRIPT, self.install_script, mode=0o755, origin=INSTALL_ORIGIN),
                RemoteFile(rank_script_path(run_id), self.rank_script(spec, node, run_id), mode=0o755),
            )
            if node.node_rank == 0:
                script = node.launch_script or ""
                nodes.append(
                    dataclasses.replace(
                        node,
                        files=files + head_files,
                        # in a container, what head_launch_script adds is in the command (in_container)
                        launch_script=script if spec.container else self.head_launch_script(spec, script),
                    )
                )
            else:
                nodes.append(
                    dataclasses.replace(
                        node,
                        command=None,
                        launch_script=None,
                        files=files,
                        setup_script=cluster_ssh.authorize_script(self.cluster_key, head_host)
                        + node.setup_script,
                    )
                )
        notes = list(base.notes)
        slots = [resolved_procs(spec, h) for h in inventory.hosts]
        notes.append(
            "horovodrun slots: "
            + ", ".join(
                f"{h.name} {h.private_address}:{p if p is not None else '$NPROC'}"
                for h, p in zip(inventory.hosts, slots, strict=True)
            )
            + f" (-np {base.total_processes if base.total_processes is not None else 'nodes x $NPROC'})"
        )
        if base.total_processes is None:
            notes.append("horovodrun gives every host as many slots as the head has GPUs ($NPROC)")
        notes.append(
            f"horovodrun runs on {head_host.name} and SSHes to "
            + (", ".join(f"{h.user}@{h.private_address}" for h in workers) or "no other host")
            + " with the cluster key; workers' host keys pinned in ~/"
            + cluster_ssh.KNOWN_HOSTS
        )
        return dataclasses.replace(base, nodes=nodes, notes=notes)

    def container_extra_mounts(self, spec: JobSpec, node_rank: int) -> tuple[str, ...]:
        """The head's cluster SSH folder (key, pinned known_hosts, config, ``ssh`` wrapper), at its
        own path inside the head's container, where horovodrun SSHes to the workers from."""
        return (layout.home(cluster_ssh.CLUSTER_DIR),) if node_rank == 0 else ()

    def setup_spec(self, spec: JobSpec) -> JobSpec:
        """The spec with Horovod's install as its first setup command.

        Part of the setup hash (the script's own hash is in the line), so a changed install
        script reruns setup; the install itself is a no-op when the environment imports horovod.
        With ``container:`` nothing is installed: Horovod is the image's.
        """
        if spec.container is not None:
            return spec
        digest = hashlib.sha256(self.install_script.encode()).hexdigest()[:12]
        line = f'sh "$HOME/{INSTALL_SCRIPT}" python  # install.sh {digest}'
        return spec.model_copy(update={"setup": [line, *spec.setup]})

    def head_launch_script(self, spec: JobSpec, script: str) -> str:
        """The base launch script with the cluster ``ssh`` wrapper first on horovodrun's PATH.

        horovodrun copies its whole environment onto every remote rank's command line, where any
        user on the worker can read it in ``ps``. The playbook's variables (API keys, say) need
        not travel that way: every rank's ``rank.sh`` exports them itself, so they are unset for
        horovodrun. ``HOROVOD_*`` ones stay, since horovodrun itself reads some of them.
        """
        lines = script.rstrip("\n").split("\n")
        extra = [f'export PATH="$HOME/{cluster_ssh.BIN_DIR}:$PATH"']
        private = sorted(k for k in spec.env if not k.startswith("HOROVOD_"))
        if private:
            extra.append("unset " + " ".join(private))
        return "\n".join([*lines[:-1], *extra, lines[-1]]) + "\n"

    def rank_script(self, spec: JobSpec, node: NodePlan, run_id: str) -> str:
        """The script every rank on ``node`` runs (see the module docstring for why it exists).

        With ``container:`` the head's runs inside the head's container (where horovodrun is), and
        a worker's starts the rank's own container on its node (``rank_container_lines``)."""
        host = node.host
        boxed = spec.container is not None
        inside = boxed and node.node_rank == 0
        lines = [
            "#!/bin/sh",
            f"# fleetrun: one Horovod rank on {host.name} (job {spec.name}, run {run_id}).",
            "# Started by horovodrun with the head's environment; this node's own values are set here.",
            "set -e",
            'HOME="$1"',
            # in the head's container the user has no name of its own; USER came in as the node user's
            "USER=${USER:-$(id -un 2>/dev/null || true)}; LOGNAME=$USER"
            if inside
            else "USER=$(id -un); LOGNAME=$USER",
            "export HOME USER LOGNAME",
            "# Drop the head's fleetrun paths (its venv, its node library) from the inherited search paths.",
            "keep_foreign() {",
            "    out=; old_ifs=$IFS; IFS=:",
            '    for d in $1; do case "$d" in */.fleetrun/*) ;; *) out="${out:+$out:}$d" ;; esac; done',
            '    IFS=$old_ifs; printf "%s" "$out"',
            "}",
            'PATH=$(keep_foreign "$PATH"); PYTHONPATH=$(keep_foreign "${PYTHONPATH:-}")',
            "export PATH PYTHONPATH",
            "unset VIRTUAL_ENV",
        ]
        if boxed and not inside:
            lines.append(f'PATH="${{PATH:+$PATH:}}{HOST_PATH}"  # the head is the image: the runtime is here')
        lines += env_export_lines(node.env, home_relative_keys(spec))
        lines += [
            "# torch.distributed's names for what Horovod assigned, so either API finds its rank.",
            'export RANK="$HOROVOD_RANK" LOCAL_RANK="$HOROVOD_LOCAL_RANK" WORLD_SIZE="$HOROVOD_SIZE"',
            'export LOCAL_WORLD_SIZE="$HOROVOD_LOCAL_SIZE" FLEETRUN_PROCS_PER_NODE="$HOROVOD_LOCAL_SIZE"',
            f'export PYTHONPATH="$HOME/{layout.LIB}${{PYTHONPATH:+:$PYTHONPATH}}"',
        ]
        # in the head's container: the interface the launch script found (the image may lack ip, awk)
        lines.append('IFACE="${GLOO_SOCKET_IFNAME:-}"' if inside else iface_line(host))
        lines += [
            'if [ -n "$IFACE" ]; then',
            '    export HOROVOD_GLOO_IFACE="$IFACE" GLOO_SOCKET_IFNAME="$IFACE" NCCL_SOCKET_IFNAME="$IFACE"',
            "fi",
        ]
        if not boxed:
            lines.append(f'. "$HOME/{layout.envdir(spec.name)}/bin/activate"')
        elif not inside:  # the ranks use the image's Python; the node-side helpers the node's
            lines.append(f'python() {{ {sh_quote(spec.python or host.python)} "$@"; }}')
        lines += [
            f'RUN_DIR="$HOME"/{sh_quote(layout.rundir(run_id))}',
            mkdir_line(spec),
            *sagemaker.runtime_lines(spec),
            f'cd "$HOME/{layout.workdir(spec.name)}"',
            "# The entrypoint as the playbook wrote it; output to horovodrun (the head's log) and a rank log.",
            'RC_FILE="$RUN_DIR/.rank-$HOROVOD_RANK.rc"',
            "set +e",
            "{",
            *(
                self.rank_container_lines(spec, node, run_id)
                if boxed and not inside
                else [sagemaker.exec_env_prefix(spec) + spec.entry_command().strip()]
            ),
            'echo "$?" > "$RC_FILE"',
            '} 2>&1 | tee -a "$RUN_DIR/rank-$HOROVOD_RANK.log"',
            'rc=$(cat "$RC_FILE" 2>/dev/null || echo 1)',
        ]
        if node.node_rank != 0:
            # The head's rc is its launch script's (horovodrun's); a worker's is its first failed rank's.
            lines.append(
                'if [ "$rc" != 0 ] && [ ! -e "$RUN_DIR/rc" ]; then '
                'echo "$rc" > "$RUN_DIR/rc.$HOROVOD_RANK" && mv "$RUN_DIR/rc.$HOROVOD_RANK" "$RUN_DIR/rc"; fi'
            )
        lines.append('exit "$rc"')
        return "\n".join(lines) + "\n"

    def rank_container_lines(self, spec: JobSpec, node: NodePlan, run_id: str) -> list[str]:
        """A worker's rank in its own container: the launch script's container lines (the
        runtime chosen and recorded, the GPU flags, the same mounts and environment), with
        horovodrun's variables passed in and the rank in the container's name. In a subshell, as
        their ``exec`` would otherwise end the rank script before it records the exit code."""
        lines = container_lines(
            spec, run_id, node.env, spec.entry_command().strip(), extra_env=RANK_ENV, instance=RANK_INSTANCE
        )
        return ["(", *lines, ")"]


INSTALL_SCRIPT_SOURCE = runtime_file("horovod/install.sh")  # INSTALL_ORIGIN, as installed


def load_horovod_launcher(inventory: Inventory, dry_run: bool = False) -> HorovodLauncher:
    """The launcher with what its plan ships: the inventory's cluster key and the install script.

    The key is made for this run only and held in memory (``cluster_ssh.new_cluster_key``): nothing
    is written on the laptop, and the wrap-up revokes it on the nodes. A dry run shows a
    placeholder instead (``dry_run_cluster_key``), so no private key is ever printed.
    """
    try:
        install = INSTALL_SCRIPT_SOURCE.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read the Horovod install script {INSTALL_SCRIPT_SOURCE}: {exc}") from None
    if dry_run:
        return HorovodLauncher(dry_run_cluster_key(inventory), install)
    return HorovodLauncher(cluster_ssh.new_cluster_key(inventory), install)


def dry_run_cluster_key(inventory: Inventory) -> cluster_ssh.ClusterKey:
    """A stand-in for a cluster key that does not exist yet: ``--dry-run`` writes no private key.

    The plan shows where the real key goes; its public half reads as a placeholder, so the
    printed authorize script cannot be mistaken for one that would work.
    """
    tag = cluster_ssh.cluster_tag(inventory)
    return cluster_ssh.ClusterKey(
        private_key="(generated for each real run; never by --dry-run)",
        public_key=f"ssh-ed25519 <cluster-key-generated-for-each-run> {tag}",
        tag=tag,
    )
