"""The command that runs a node's ranks inside the playbook's image (``container:``). Pure: no I/O.

One class per runtime behind one interface (``ContainerRuntime.run_words``): podman and docker
take the same ``run`` flags save for the GPUs and the user; apptainer's ``exec`` has its own
(``--nv``, ``--bind``, ``--env``-less environment passing). What every runtime gets, whatever the
playbook's ``options``:

- the host's network (rendezvous, NCCL/Gloo on the node's own interfaces), its hostname (``--uts
  host``: a rank names its node, and resolves its own address, by it) and the host's IPC (or a
  sized ``/dev/shm``, ``shm_size``), so collectives behave as without a container;
- the node's GPUs, only when the node has some (decided on the node: ``$FLEETRUN_NODE_GPUS``);
- fleetrun's folders at the same paths as outside (workdir, run folder with its checkpoints and
  TMPDIR, node library, compile cache, copied and node-side data channels), so every path in the
  environment means the same inside;
- fleetrun's environment passed by name (``--env NAME``): values come from the runtime's own
  process environment, never the command line, where ``ps`` would show them to other users;
- ``--rm``, a name and a ``fleetrun.run=<run id>`` label (a stop and the cleanup find exactly the
  run's containers, ``fleetrun_node.stop_run``), ``--init`` so a stop's SIGTERM reaches the ranks;
- ``--pull never``: the image is pulled before the start, once per node, where a failure is named.

The words are shell words for the launch script (``"$HOME/..."`` stays live on the node); the
GPU flags come from ``"$@"``, which the script sets from the node's GPU count.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from launch.job.container import ContainerSpec
from launch.nodelib.fleetrun_containers import LABEL, RUNTIME_FILE
from launch.planning import remote_layout as layout
from launch.planning.image_pull import RUNTIME_ORDER, sif_path

RUNTIMES_BY_PREFERENCE = RUNTIME_ORDER
"""What ``runtime: auto`` takes on a node: the first of these it has, the order the image pull
takes (``image_pull.RUNTIME_ORDER``). ``LABEL`` (on every container of a run, the run id its value) and
``RUNTIME_FILE`` (the run folder's note of the runtime used) are the node side's, which finds the
run's containers by them when it stops the run (``fleetrun_containers``)."""


@dataclass(frozen=True)
class ContainerRun:
    """What one node's container is made of; every path a shell word for inside double quotes."""

    run_id: str
    node_rank: int
    spec: ContainerSpec
    env_names: tuple[str, ...]
    """Variables passed in by name; their values are in the launch script's environment."""
    mounts: tuple[str, ...]
    """Host folders mounted at the same path inside (shell text for inside double quotes)."""
    workdir: str
    command: str
    """Shell text run inside by ``sh -c`` (its ``$VAR`` expanded inside, from the passed environment)."""
    instance: str = ""
    """Shell text that tells apart several containers of one node and attempt (Horovod starts one
    per rank: ``-r$HOROVOD_RANK``); empty when the node has one container (torchrun's)."""

    def name(self) -> str:
        """Unique per run, node and attempt (the name's end, after ``$FLEETRUN_ATTEMPT``, is
        ``instance``): a leftover of an earlier attempt never blocks the next."""
        return f"fleetrun-{self.run_id}-n{self.node_rank}-a"


def _dq(text: str) -> str:
    """``text`` (which may hold ``$HOME``) inside double quotes."""
    return f'"{text}"'


def _same_path(path: str) -> str:
    """``path:path`` as one shell word: fleetrun's own folders (``$HOME/...``, names fleetrun
    validated) inside double quotes so ``$HOME`` expands on the node; any other path (a
    playbook's channel folder, the user's text) single-quoted, so no ``$``, backtick or quote in
    it is read by the shell."""
    if path.startswith("$HOME/"):
        return _dq(f"{path}:{path}")
    return shlex.quote(f"{path}:{path}")


class ContainerRuntime(ABC):
    """How one runtime runs ``ContainerRun``; ``run_words`` is the whole command, image included."""

    name: str = ""

    @abstractmethod
    def gpu_flags(self) -> tuple[str, ...]:
        """The flags that give the container every GPU of the node (used only when it has some)."""

    @abstractmethod
    def run_words(self, run: ContainerRun) -> list[str]:
        """Shell words of the command; ``"$@"`` stands where the GPU flags go."""


class _OciRuntime(ContainerRuntime):
    """What docker and podman share: ``run`` with the same flags for network, IPC, mounts and env."""

    def user_flags(self) -> tuple[str, ...]:
        return ()

    def run_words(self, run: ContainerRun) -> list[str]:
        words = [
            self.name,
            "run",
            "--rm",
            "--init",
            "--pull",
            "never",
            "--name",
            _dq(run.name() + "$FLEETRUN_ATTEMPT" + run.instance),
            "--label",
            shlex.quote(f"{LABEL}={run.run_id}"),
            "--network",
            "host",
            "--uts",
            "host",
        ]
        if run.spec.shm_size is not None:
            words += ["--shm-size", shlex.quote(run.spec.shm_size)]
        else:
            words += ["--ipc", "host"]
        words += ['"$@"', *self.user_flags()]
        for mount in run.mounts:
            words += ["--volume", _same_path(mount)]
        words += ["--workdir", _dq(run.workdir)]
        for name in run.env_names:
            words += ["--env", name]
        words += [shlex.quote(option) for option in run.spec.options]
        words += [shlex.quote(run.spec.image), "sh", "-c", shlex.quote(run.command)]
        return words


class PodmanRuntime(_OciRuntime):
    """Rootless podman: the container's root is the node user, so files it writes are the user's.
    GPUs through the NVIDIA Container Toolkit's CDI spec (``nvidia-ctk cdi generate``)."""

    name = "podman"

    def gpu_flags(self) -> tuple[str, ...]:
        return ("--device", "nvidia.com/gpu=all")


class DockerRuntime(_OciRuntime):
    """Docker's daemon runs containers as root: the ranks run as the node user (``--user``) so the
    run folder stays the user's, and its ``--gpus`` flag needs the NVIDIA Container Toolkit."""

    name = "docker"

    def gpu_flags(self) -> tuple[str, ...]:
        return ("--gpus", "all")

    def user_flags(self) -> tuple[str, ...]:
        return ("--user", '"$(id -u):$(id -g)"')


class ApptainerRuntime(ContainerRuntime):
    """``apptainer exec``: no daemon, no network or IPC namespace of its own (host's by default),
    runs as the node user; the ranks are plain processes of the user, found by the stop like any.
    ``--no-home`` plus the folders bound at the same path; the environment is inherited, and
    ``--cleanenv`` is refused in ``options`` (``launch.job.container``)."""

    name = "apptainer"

    def gpu_flags(self) -> tuple[str, ...]:
        return ("--nv",)

    def run_words(self, run: ContainerRun) -> list[str]:
        # a registry image runs from the SIF file the pull stage made of it (``sif_path``), not
        # ``docker://`` again, which would convert it anew and ask the registry at every start
        image = run.spec.image
        image_word = shlex.quote(image) if image.startswith("/") else _dq(layout.home(sif_path(image)))
        words = ["apptainer", "exec", '"$@"', "--no-home"]
        for mount in run.mounts:
            words += ["--bind", _same_path(mount)]
        words += ["--pwd", _dq(run.workdir)]
        words += [shlex.quote(option) for option in run.spec.options]
        words += [image_word, "sh", "-c", shlex.quote(run.command)]
        return words


RUNTIMES: dict[str, ContainerRuntime] = {
    runtime.name: runtime for runtime in (PodmanRuntime(), DockerRuntime(), ApptainerRuntime())
}


def launch_lines(run: ContainerRun, prefix: str = "") -> list[str]:
    """Launch-script lines that pick the runtime (``auto``: the first the node has), record it in
    the run folder (``RUNTIME_FILE``), set the GPU flags from ``$FLEETRUN_NODE_GPUS`` and exec the
    runtime's command (``prefix``: an ``env NAME=VALUE`` for names sh cannot export)."""
    wanted = run.spec.runtime
    names: Sequence[str] = RUNTIMES_BY_PREFERENCE if wanted == "auto" else (wanted,)
    lines = ["FLEETRUN_CONTAINER_RUNTIME="]
    for name in names:
        lines.append(
            f'[ -n "$FLEETRUN_CONTAINER_RUNTIME" ] || ! command -v {name} >/dev/null 2>&1 '
            f"|| FLEETRUN_CONTAINER_RUNTIME={name}"
        )
    lines.append(
        '[ -n "$FLEETRUN_CONTAINER_RUNTIME" ] || { echo "fleetrun: no container runtime on this node '
        f'(looked for {", ".join(names)})" >&2; exit 127; }}'
    )
    lines.append('echo "$FLEETRUN_CONTAINER_RUNTIME" > "$FLEETRUN_RUN_DIR/' + RUNTIME_FILE + '"')
    lines.append("export FLEETRUN_CONTAINER_RUNTIME")
    lines.append('case "$FLEETRUN_CONTAINER_RUNTIME" in')
    for name in names:
        runtime = RUNTIMES[name]
        gpu = " ".join(runtime.gpu_flags())
        lines.append(f"  {name})")
        lines.append(f'    if [ "${{FLEETRUN_NODE_GPUS:-0}}" -gt 0 ]; then set -- {gpu}; else set --; fi')
        lines.append(f"    exec {prefix}" + " ".join(runtime.run_words(run)) + " ;;")
    lines.append("esac")
    return lines
