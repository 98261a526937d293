"""The job spec: what a playbook (``playbooks/*.yaml``) asks fleetrun to run.

Pure data, validated with pydantic. Modelled on SkyPilot's task YAML and the managed services'
job configs: a name, the code to ship (``workdir``), how to prepare a node (``setup``,
``requirements``), what to run (``entrypoint``) and how to spread it (``launcher``, ``nodes``,
``procs_per_node``). Paths in a playbook are relative to the playbook file, so a playbook
works the same from any current directory.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launch.errors import SpecError
from launch.job.validation import describe_validation_error, load_yaml_mapping
from launch.rules.stoprules import StopRules, Teardown

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JobSpec(BaseModel):
    """A training job, independent of where it runs.

    Fields:
        name: slug naming the job; also names its remote workdir and Python environment.
        workdir: local directory synced to every node (``.gitignore`` honoured, ``.git`` never shipped).
        setup: shell commands run once per node in the job's environment, skipped while unchanged.
        requirements: a pip requirements file inside ``workdir``, installed during setup.
        entrypoint: the command each training process runs, e.g. ``python -m trainer.task --epochs 3``.
        launcher: ``torchrun`` (c10d rendezvous) or ``horovod``.
        nodes: how many machines of the inventory to use (the first ``nodes`` hosts, head first).
        procs_per_node: processes per node, or ``auto``: GPUs on the node (``nvidia-smi``), else 1.
        env: extra environment variables for every process.
        outputs: directory, relative to the node's run directory, where the job writes artifacts
            (exported as ``FLEETRUN_OUTPUT_DIR`` and ``SM_MODEL_DIR``); pulled back after the run.
        data_dir: path on the nodes holding training data (exported as ``FLEETRUN_DATA_DIR`` and
            ``SM_CHANNEL_TRAINING``).
        python: interpreter on the nodes that the job's environment is built from; defaults to
            the inventory host's ``python``.
        rdzv_port: TCP port of the rendezvous on the head node.
        max_restarts: torchrun worker-group restarts before the run counts as failed.
        stop: stop rules (NaN loss, stall, plateau, wall time, cost, ...); see ``launch.rules.stoprules``.
        teardown: after the run, ``always`` remove the fleet, only ``on_success``, or ``never``.
            Artifacts are pulled first; a failed pull blocks the teardown.
        relay_sync_above: with more nodes than this, code is uploaded to the head once and the
            head copies it to the workers over the private network (``launch.transport.sync_relay``),
            instead of one upload per node from the laptop.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    workdir: Path
    setup: list[str] = Field(default_factory=list)
    requirements: str | None = None
    entrypoint: str
    launcher: Literal["torchrun", "horovod"] = "torchrun"
    nodes: int = Field(default=1, ge=1, le=4096)
    procs_per_node: int | Literal["auto"] = "auto"
    env: dict[str, str] = Field(default_factory=dict)
    outputs: str = "outputs"
    data_dir: str | None = None
    python: str | None = None
    rdzv_port: int = Field(default=29500, ge=1024, le=65535)
    max_restarts: int = Field(default=0, ge=0, le=100)
    stop: StopRules = Field(default_factory=StopRules)
    teardown: Teardown = Teardown.ALWAYS
    relay_sync_above: int = Field(default=16, ge=1)

    @field_validator("name")
    @classmethod
    def _name_is_slug(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("expected a lowercase slug (letters, digits, '-'; at most 63 characters)")
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_as_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [line for line in value.splitlines() if line.strip()]
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_parses(cls, value: str) -> str:
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"expected a shell command line ({exc})") from None
        if not argv:
            raise ValueError("expected a command, got an empty string")
        return value

    @field_validator("procs_per_node", mode="before")
    @classmethod
    def _procs_positive(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError("expected an integer >= 1 or 'auto'")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs_relative(cls, value: str) -> str:
        p = Path(value)
        if p.is_absolute() or ".." in p.parts or not value.strip():
            raise ValueError("expected a relative path inside the run directory (no '..')")
        return value

    def requirements_text(self) -> str:
        """Contents of the requirements file (part of the setup hash), or '' when none."""
        if not self.requirements:
            return ""
        return (self.workdir / self.requirements).read_text()

    def setup_hash(self, python: str) -> str:
        """What decides whether a node's environment must be rebuilt.

        Ray skips setup when its hash is unchanged; SkyPilot reruns it every launch and its users
        complain. The hash covers the interpreter, the requirements file's contents and the setup
        commands, and nothing else, so editing training code never triggers a reinstall.
        """
        digest = hashlib.sha256()
        for part in (
            "fleetrun-env-v2",
            python,
            self.requirements or "",
            self.requirements_text(),
            *self.setup,
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()[:16]


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a playbook; every problem names the file and the field."""
    path = Path(path)
    data = load_yaml_mapping(path, "playbook")
    workdir = data.get("workdir")
    if isinstance(workdir, str):
        data["workdir"] = (path.parent / Path(workdir).expanduser()).resolve()
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(str(path), exc)) from None
    if not spec.workdir.is_dir():
        raise SpecError(f"{path}: field 'workdir': directory {spec.workdir} does not exist")
    if spec.requirements and not (spec.workdir / spec.requirements).is_file():
        raise SpecError(
            f"{path}: field 'requirements': {spec.requirements} not found in workdir {spec.workdir}"
        )
    return spec
