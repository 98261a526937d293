"""A playbook's ``container:`` section: the image every node runs the ranks in.

Most GPU users train in an image (NVIDIA's PyTorch containers, their own image built in CI) so
that every node has the same CUDA, NCCL and PyTorch; SkyPilot's ``image_id: docker:``, Ray's
``docker:`` section and SageMaker's containers give the same. Here the playbook names the image,
the runtime (``auto``: what the node has, podman first, then docker, then apptainer), and extra
runtime flags. fleetrun adds what distributed training needs itself (host networking, the GPUs,
shared memory, its folders mounted at the same paths, its environment), so ``options`` may not
take those away: a flag that would (another network, a name, a detached or restarting
container, the environment on the command line) is refused when the playbook loads, naming it.

``credentials`` names where this machine keeps the registry login (an environment variable or a
file): only the name is in the spec, never the secret, and the plan never shows it.

Pure data, validated with pydantic; ``launch.planning.container`` turns it into the runtime's
command line.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launch.job.image_reference import image_problem
from launch.job.shell_text import CONTROL_CHARS

ContainerRuntime = Literal["auto", "docker", "podman", "apptainer"]
"""The runtimes fleetrun can start ranks with; ``auto`` is decided on each node."""

MAX_OPTIONS = 64
MAX_OPTION_CHARS = 1024
MAX_CREDENTIALS_PATH = 4096
SHM_SIZE_RE = re.compile(r"[1-9][0-9]{0,5}[bkmg]?", re.IGNORECASE)
CREDENTIALS_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

REFUSED_OPTIONS: dict[str, str] = {
    "--network": "fleetrun runs the ranks on the host's network (rendezvous and NCCL/Gloo on the node's interfaces)",
    "--net": "fleetrun runs the ranks on the host's network (rendezvous and NCCL/Gloo on the node's interfaces)",
    "--network-alias": "fleetrun runs the ranks on the host's network",
    "--uts": "fleetrun gives the ranks the node's hostname (a rank names its node, and finds its own address, by it)",
    "--hostname": "fleetrun gives the ranks the node's hostname (a rank names its node, and finds its own address, by it)",
    "-h": "fleetrun gives the ranks the node's hostname (docker's and podman's -h sets another)",
    "--name": "fleetrun names each container after the run, so a stop and the cleanup find exactly its own",
    "--label": "fleetrun labels each container with the run id (the cleanup finds containers by it)",
    "--detach": "fleetrun waits on the container: detached, the ranks' exit codes would be lost",
    "-d": "fleetrun waits on the container: detached, the ranks' exit codes would be lost",
    "--restart": "a restarting container outlives a stop; fleetrun's recovery decides restarts",
    "--tty": "a terminal changes how signals and output reach the ranks",
    "-t": "a terminal changes how signals and output reach the ranks",
    "--entrypoint": "fleetrun runs the job's entrypoint through the launcher",
    "--workdir": "fleetrun runs the ranks in the synced workdir",
    "-w": "fleetrun runs the ranks in the synced workdir",
    "--ipc": "fleetrun shares the host's IPC (use container.shm_size for a sized /dev/shm instead)",
    "--env": "the playbook's env: section passes environment (masked in plans; a flag shows in ps)",
    "-e": "the playbook's env: section passes environment (docker's -e; apptainer's -e drops fleetrun's)",
    "--env-file": "the playbook's env: section passes environment",
    "--cleanenv": "fleetrun's environment (rank, rendezvous, SM_*, TF_CONFIG) must reach the ranks",
    "--contain": "the synced workdir, run and checkpoint folders must be visible inside at the same paths",
    "-c": "apptainer's --contain: the synced workdir and run folders must be visible inside",
    "--containall": "the synced workdir, run and checkpoint folders must be visible inside at the same paths",
    "-C": "apptainer's --containall: the synced workdir and run folders must be visible inside",
}
"""Runtime flags ``options`` may not hold, and why: each would take away something the run needs."""


class RegistryCredentials(BaseModel):
    """Where this machine keeps the registry login for a private image: exactly one of ``env``
    (an environment variable's name) or ``file`` (a path to a file, e.g. a ``config.json`` /
    ``auth.json`` of docker or podman login). Only the name is kept; the value is read at pull
    time and never written into the plan or the run's records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = Field(default=None, max_length=128)
    """The name of an environment variable on this machine holding the login (``user:token`` or a token)."""
    file: str | None = Field(default=None, max_length=MAX_CREDENTIALS_PATH)
    """A file on this machine holding the login (a docker/podman auth file); ``~`` is expanded."""

    @field_validator("env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not CREDENTIALS_ENV_RE.fullmatch(value):
            raise ValueError("expected an environment variable name (letters, digits, '_')")
        return value

    @field_validator("file")
    @classmethod
    def _file_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or CONTROL_CHARS.search(value)):
            raise ValueError("expected a file path on one line")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> RegistryCredentials:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable's name) or file (a path)")
        return self


class ContainerSpec(BaseModel):
    """``container: {image: REF, runtime: auto, options: [...]}``: every rank runs inside ``image``.

    fleetrun adds the flags distributed training needs (host network, the node's GPUs when it has
    some, host IPC or ``shm_size``, its folders at the same paths, its environment by name, a name
    and label with the run id, ``--init``, ``--rm``); ``options`` adds the user's own (a device, a
    capability, a data mount).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(max_length=512)
    """The image reference (``nvcr.io/nvidia/pytorch:24.05-py3``, ``ghcr.io/lab/train@sha256:...``); for apptainer also a ``.sif`` path on the nodes."""
    runtime: ContainerRuntime = "auto"
    """``podman``, ``docker``, ``apptainer``, or ``auto``: the first of those the node has."""
    options: list[str] = Field(default_factory=list, max_length=MAX_OPTIONS)
    """Extra runtime flags, one argument each (``["--device", "/dev/infiniband", "--cap-add=IPC_LOCK"]``); flags fleetrun sets itself are refused."""
    shm_size: str | None = Field(default=None, max_length=8)
    """A sized ``/dev/shm`` (``16g``) instead of sharing the host's IPC (docker and podman; apptainer shares the host's)."""
    credentials: RegistryCredentials | None = None
    """Registry login for a private image: ``{env: NAME}``, ``{file: PATH}``, or the short forms ``$NAME`` / a path."""

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        if value.endswith(".sif") and value.startswith("/") and not CONTROL_CHARS.search(value):
            return value  # apptainer's image file on the nodes
        problem = image_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("options")
    @classmethod
    def _options_keep_what_fleetrun_needs(cls, value: list[str]) -> list[str]:
        for i, option in enumerate(value):
            if CONTROL_CHARS.search(option) or len(option) > MAX_OPTION_CHARS:
                raise ValueError(
                    f"item {i}: one argument on one line (no newline or control character), "
                    f"at most {MAX_OPTION_CHARS} characters"
                )
            if i == 0 and not option.startswith("-"):
                raise ValueError(
                    f"item 0: {option[:80]!r} is not a flag: options are runtime flags (--flag value)"
                )
            if not option.startswith("-"):
                continue
            name = option.split("=", 1)[0]
            if name.startswith("-") and not name.startswith("--") and len(name) > 2:
                name = name[:2]  # -dit, -eFOO=1: the first short flag decides
            reason = REFUSED_OPTIONS.get(name)
            if reason is not None:
                raise ValueError(f"item {i}: {name} is not allowed: {reason}")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, value: str | None) -> str | None:
        if value is not None and not SHM_SIZE_RE.fullmatch(value):
            raise ValueError("expected a size like 16g, 512m (a number and b, k, m or g)")
        return value

    @field_validator("credentials", mode="before")
    @classmethod
    def _credentials_short_form(cls, value: object) -> object:
        """``$NAME`` names an environment variable; another string is a file's path."""
        if isinstance(value, str):
            return {"env": value[1:]} if value.startswith("$") else {"file": value}
        return value
