"""The job spec: what a playbook (``playbooks/*.yaml``) asks fleetrun to run.

Pure data, validated with pydantic. Modelled on SkyPilot's task YAML and the managed services'
job configs: a name, the code to ship (``workdir``), how to prepare a node (``setup``,
``requirements``), what to run (``entrypoint``) and how to spread it (``launcher``, ``nodes``,
``procs_per_node``). Paths in a playbook are relative to the playbook file, so a playbook
works the same from any current directory.
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from launch.errors import SpecError
from launch.job.builtin import resolve_playbook
from launch.job.cloudml import JOB_DIR_ARGS, JobDir, TfConfigLayout
from launch.job.coherence import contradictions
from launch.job.container import ContainerSpec
from launch.job.hooks import DEFAULT_HOOK_TIMEOUT_S, HookCommands, HookTimeout
from launch.job.overrides import Override, apply_overrides, describe_errors
from launch.job.profiling import ProfileSpec
from launch.job.sagemaker import (
    MAX_CHANNELS,
    MAX_HYPERPARAMETERS,
    Channel,
    Hyperparameters,
    HyperparameterValue,
    channel_from_yaml,
    check_channel_names,
    check_hyperparameters,
    hyperparameter_args,
)
from launch.job.shell_text import CONTROL_CHARS, control_operators
from launch.job.validation import printable, read_bytes_bounded, read_text_bounded, yaml_mapping
from launch.rules.recovery import RecoveryPolicy
from launch.rules.stoprules import StopRules, Teardown

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
ELASTIC_RE = re.compile(r"([0-9]{1,4}):([0-9]{1,4})")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
OUTPUTS_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
SECRET_NAME_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
"""Environment names whose values are masked in ``--dry-run`` and ``plan.txt``."""

MAX_COMMAND_CHARS = 8192
MAX_SETUP_LINES = 256
MAX_ENV_VARS = 512
MAX_ENV_VALUE_CHARS = 65536
MAX_PATH_CHARS = 4096
MAX_DURATION_S = 366 * 24 * 3600.0
"""Longest timeout a stop rule may have (a year): past that, a number is a typo, and ``1e400`` is inf."""
MAX_MONEY = 1e9


def _no_controls(value: str, what: str) -> str:
    if CONTROL_CHARS.search(value):
        raise ValueError(f"{what} must not contain control characters (newline, NUL, ESC, ...)")
    return value


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a credential."""
    return SECRET_NAME_RE.search(name) is not None


class JobSpec(BaseModel):
    """A training job, independent of where it runs.

    Fields:
        name: slug naming the job; also names its remote workdir and Python environment.
        workdir: local directory synced to every node (``.gitignore`` honoured, ``.git`` never shipped).
        setup: shell commands run once per node in the job's environment, skipped while unchanged.
        requirements: a pip requirements file inside ``workdir``, installed during setup.
        entrypoint: the command each training process runs, e.g. ``python -m trainer.task --epochs 3``.
        launcher: ``torchrun`` (c10d rendezvous) or ``horovod``.
        nodes: how many machines of the inventory to use (the first ``nodes`` hosts, head first),
            or ``MIN:MAX`` (elastic: start on MAX, and with ``recovery:`` go on with at least MIN
            survivors; torchrun gets ``--nnodes=MIN:MAX``). Read as ``nodes`` = MAX, ``min_nodes`` = MIN.
        min_nodes: set from ``nodes: MIN:MAX``; None for a fixed node count.
        procs_per_node: processes per node, or ``auto``: GPUs on the node (``nvidia-smi``), else 1.
        env: extra environment variables for every process.
        secret_env: names in ``env`` whose values are masked (``***``) in ``--dry-run`` and ``plan.txt``;
            names containing TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL are masked without being listed.
            The nodes still get the real values.
        outputs: directory, relative to the node's run directory, where the job writes artifacts
            (exported as ``FLEETRUN_OUTPUT_DIR`` and ``SM_MODEL_DIR``); pulled back after the run.
        data_dir: path on the nodes holding training data (exported as ``FLEETRUN_DATA_DIR`` and
            ``SM_CHANNEL_TRAINING``).
        profile: ``torch.profiler`` for a range of steps on some ranks (``ProfileSpec``); traces
            land in each node's run directory under ``profile/`` and are pulled with it.
        python: interpreter on the nodes that the job's environment is built from; defaults to
            the inventory host's ``python``.
        rdzv_port: TCP port of the rendezvous on the head node, or ``auto`` (the default): a port
            free on the head, chosen there at launch time, so two runs on the same machines never
            share one (a fixed 29500 is the EADDRINUSE of pytorch#126510).
        max_restarts: torchrun worker-group restarts before the run counts as failed.
        rank_start: how torchrun starts a node's ranks: ``fork`` (the default) forks each from
            torchrun's agent once it has imported torch, so a rank does not import torch again
            (2-3 s of CPU per rank at every start and every recovery); ``exec`` starts each as a
            new interpreter, torchrun's own way. A non-Python entrypoint, a job with
            ``container`` and Slurm's ``ranks_via: srun`` always get ``exec``.
            See ``launch/nodelib/fleetrun_torchrun.py`` for what a forked rank is given.
        stop: stop rules (NaN loss, stall, plateau, wall time, cost, ...); see ``launch.rules.stoprules``.
        recovery: what a lost node, a preemption or a failed rank does to the run: by default it
            ends it; see ``launch.rules.recovery.RecoveryPolicy``.
        teardown: after the run, ``always`` remove the fleet, only ``on_success``, or ``never``.
            Artifacts are pulled first; a failed pull blocks the teardown.
        relay_sync_above: with more nodes than this, code is uploaded to the head once and the
            head copies it to the workers over the private network (``launch.transport.sync_relay``),
            instead of one upload per node from the laptop.
        hyperparameters: name -> scalar, passed as SageMaker passes them: ``--name value``
            arguments after the entrypoint, and ``SM_HPS``/``SM_HP_<NAME>`` (``launch.job.sagemaker``);
            recorded with the run for ``fab compare``.
        channels: name -> a folder on every node (``/data/x`` or ``{path: /data/x}``) or a folder on
            this machine (``{local: dir}``, relative to the playbook, copied to every node before
            the start); exported as ``SM_CHANNEL_<NAME>`` and listed in ``SM_CHANNELS``.
        tf_config: ``TF_CONFIG``'s layout, as the service a trainer was written for gives it:
            ``workers`` (every node a worker), ``chief`` (node 0 the chief, Vertex AI and TF's
            MultiWorkerMirroredStrategy) or ``master`` (node 0 the master, Cloud ML Engine); see
            ``launch.job.cloudml``.
        job_dir: a folder inside the node's run directory passed to the entrypoint as
            ``--job-dir`` (and ``FLEETRUN_JOB_DIR``), Cloud ML Engine's convention; its contents come
            back with the run.
        on_end: commands run on this machine once the run is recorded, ``summary.json`` on stdin and
            the outcome in ``FLEETRUN_OUTCOME`` (a webhook, a mail); a failing or hanging one never
            changes the outcome (``launch.job.hooks``). They run only for a playbook whose exact
            bytes were allowed once with ``fab train --allow-local-hooks`` (a playbook is untrusted
            input: a file a colleague sent); otherwise they are skipped, saying so.
        before_stop: commands each node's watchdog runs before it stops, uploads and powers off,
            when it ends the run with the laptop gone; bounded like ``on_end``.
        hook_timeout_s: the longest one hook command may run before its process group is killed.
        total_steps: for progress and ETA (``FLEETRUN_TOTAL_STEPS``, read by the metrics helper).
        keep_warm_s: on stack and local fleets, instead of tearing down keep the nodes this many
            seconds for the next run, each node's watchdog powering it off when none claims it;
            the laptop tears the fleet down then too, and on a stack the cloud ends the instances
            5 minutes later (docs/cloud.md, "A kept-warm fleet's lifetime").
        container: run the ranks inside an image on every node (``image``, ``runtime``: auto,
            podman, docker or apptainer, extra ``options``, ``shm_size``, ``credentials``); see
            ``launch.job.container``. Without it the ranks run in the job's virtualenv. With
            ``launcher: horovod`` the image must carry Horovod and an ssh client (horovodrun runs in
            the head's container).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _source_sha256: str = PrivateAttr(default="")
    """SHA-256 of the playbook bytes this spec was parsed from (``load_job_spec``); "" otherwise."""

    name: str
    workdir: Path
    setup: list[str] = Field(default_factory=list, max_length=MAX_SETUP_LINES)
    requirements: str | None = None
    entrypoint: str = Field(max_length=MAX_COMMAND_CHARS)
    launcher: Literal["torchrun", "horovod"] = "torchrun"
    nodes: int = Field(default=1, ge=1, le=4096)
    min_nodes: int | None = Field(default=None, ge=1, le=4096)
    procs_per_node: int | Literal["auto"] = "auto"
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    secret_env: list[str] = Field(default_factory=list, max_length=MAX_ENV_VARS)
    outputs: str = Field(default="outputs", max_length=255)
    data_dir: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    profile: ProfileSpec | None = None
    python: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    rdzv_port: int | Literal["auto"] = "auto"
    max_restarts: int = Field(default=0, ge=0, le=100)
    rank_start: Literal["fork", "exec"] = "fork"
    stop: StopRules = Field(default_factory=StopRules)
    recovery: RecoveryPolicy = Field(default_factory=RecoveryPolicy)
    teardown: Teardown = Teardown.ALWAYS
    relay_sync_above: int = Field(default=16, ge=1, le=100_000)
    # -- SageMaker-style inputs (launch.job.sagemaker) --
    hyperparameters: Hyperparameters = Field(default_factory=dict, max_length=MAX_HYPERPARAMETERS)
    channels: dict[str, Channel] = Field(default_factory=dict, max_length=MAX_CHANNELS)
    tf_config: TfConfigLayout = "workers"
    job_dir: JobDir = None
    on_end: HookCommands = Field(default_factory=list)
    before_stop: HookCommands = Field(default_factory=list)
    hook_timeout_s: HookTimeout = DEFAULT_HOOK_TIMEOUT_S
    total_steps: int | None = Field(default=None, ge=1, le=10**12)
    keep_warm_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)  # launch.run.warm
    container: ContainerSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _elastic_nodes(cls, data: object) -> object:
        """``nodes: "2:3"`` (YAML reads ``2:3`` as a string) is ``min_nodes: 2, nodes: 3``."""
        if isinstance(data, dict) and isinstance(data.get("nodes"), str):
            match = ELASTIC_RE.fullmatch(data["nodes"].strip())
            if match is not None:
                if "min_nodes" in data:
                    raise ValueError("field 'min_nodes': give either nodes: MIN:MAX or min_nodes, not both")
                low, high = int(match.group(1)), int(match.group(2))
                if not 1 <= low <= high:  # said of 'nodes', the field the user wrote
                    raise ValueError(f"field 'nodes': MIN:MAX needs 1 <= MIN <= MAX, got {low}:{high}")
                data = {**data, "min_nodes": low, "nodes": high}
        return data

    @model_validator(mode="after")
    def _settings_agree(self) -> JobSpec:
        """Settings of different sections that cannot take effect together (``launch.job.coherence``)."""
        for field, problem in contradictions(
            self.stop, self.recovery, teardown=self.teardown, keep_warm_s=self.keep_warm_s
        ):
            raise ValueError(f"field '{field}': {problem}")
        return self

    @model_validator(mode="after")
    def _container_fits(self) -> JobSpec:
        """What cannot run inside an image yet: the requirements go into the image itself."""
        if self.container is not None and self.requirements:
            raise ValueError(
                "field 'requirements': with container: the ranks use the image's Python; install the "
                "requirements in the image (setup: commands still run on the node, outside the image)"
            )
        return self

    @field_validator("min_nodes")
    @classmethod
    def _min_at_most_max(cls, value: int | None, info: ValidationInfo) -> int | None:
        nodes = info.data.get("nodes")
        if value is not None and isinstance(nodes, int) and value > nodes:
            raise ValueError(f"expected at most nodes ({nodes}), got {value}")
        return value

    @field_validator("teardown", mode="before")
    @classmethod
    def _teardown(cls, value: object) -> object:
        """The playbook names the policy as a string; strict validation wants the enum itself."""
        if isinstance(value, str):
            try:
                return Teardown(value)
            except ValueError:
                raise ValueError(f"expected one of {', '.join(t.value for t in Teardown)}") from None
        return value

    @field_validator("name")
    @classmethod
    def _name_is_slug(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError("expected a lowercase slug (letters, digits, '-'; at most 63 characters)")
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_as_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [line for line in value.splitlines() if line.strip()]
        return value

    @field_validator("setup")
    @classmethod
    def _setup_lines(cls, value: list[str]) -> list[str]:
        for i, line in enumerate(value):
            if "\0" in line or len(line) > MAX_COMMAND_CHARS:
                raise ValueError(
                    f"line {i}: expected shell text without NUL, at most {MAX_COMMAND_CHARS} characters"
                )
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_parses(cls, value: str) -> str:
        _no_controls(value, "the entrypoint is one command line; it")
        operators = control_operators(value)
        if operators:
            raise ValueError(
                f"shell control operator {operators[0]!r} in the entrypoint: fleetrun judges the run by the "
                "entrypoint's exit code (with '| tee' that is tee's, so a failed rank reads as success); "
                "put pipelines, '&&', ';' and '&' in a script and make the entrypoint run it (sh run.sh)"
            )
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
        if value == "auto" and isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024:
            return value
        raise ValueError("expected an integer from 1 to 1024 or 'auto'")

    @field_validator("rdzv_port", mode="before")
    @classmethod
    def _rdzv_port(cls, value: object) -> object:
        if value == "auto" and isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 1024 <= value <= 65535:
            return value
        raise ValueError("expected a TCP port from 1024 to 65535 or 'auto'")

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(
                    f"{printable(key, 80)!r} is not a valid environment variable name (letters, digits, '_')"
                )
            if "\0" in item or len(item) > MAX_ENV_VALUE_CHARS:
                raise ValueError(
                    f"{key}: a value must hold no NUL byte and at most {MAX_ENV_VALUE_CHARS} characters"
                )
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        env = info.data.get("env", {})
        for name in value:
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"{printable(name, 80)!r} is not a valid environment variable name")
            if name not in env:
                # A misspelt name would leave the real variable unmasked: say so instead.
                raise ValueError(f"{name!r} is not in env (a misspelling would leave the real one unmasked)")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs_relative(cls, value: str) -> str:
        parts = value.split("/")
        if not OUTPUTS_RE.fullmatch(value) or any(part in (".", "..") for part in parts):
            raise ValueError(
                "expected a relative path inside the run directory: letters, digits, '.', '_', '-' and '/' "
                "(no '..', not absolute)"
            )
        return value

    @field_validator("data_dir", "python", "requirements")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None:
            _no_controls(value, "a path")
            if not value.strip():
                raise ValueError("expected a non-empty path")
        return value

    @field_validator("profile")
    @classmethod
    def _profile_ranks_exist(cls, value: ProfileSpec | None, info: ValidationInfo) -> ProfileSpec | None:
        """A rank past the job's processes would never be profiled: said now, when it is known."""
        nodes, procs = info.data.get("nodes"), info.data.get("procs_per_node")
        if value is not None and isinstance(nodes, int) and isinstance(procs, int):
            world = nodes * procs
            if max(value.ranks) >= world:
                raise ValueError(
                    f"ranks: rank {max(value.ranks)} does not exist: the job has {world} processes (ranks 0-{world - 1})"
                )
        return value

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, value: StopRules) -> StopRules:
        for name, item in value.model_dump().items():
            if not isinstance(item, float | int) or isinstance(item, bool):
                continue
            bound = MAX_MONEY if name in ("max_cost_usd", "price_per_node_hour") else MAX_DURATION_S
            if name == "plateau_patience":
                bound = 1e9
            if name == "gpu_idle_percent":
                bound = 100.0
            if not math.isfinite(item) or item > bound:
                raise ValueError(f"{name}: expected a finite number at most {bound:g}, got {item!r}")
        return value

    # -- SageMaker-style inputs: hyperparameters and channels --------------------------------------
    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters(cls, value: dict[str, HyperparameterValue]) -> dict[str, HyperparameterValue]:
        for name in value:
            if is_secret_name(name.replace("-", "_")):
                # Hyperparameters are recorded, compared and printed; credentials belong in env.
                raise ValueError(
                    f"{name[:80]!r} looks like a credential: hyperparameters are recorded with the run and "
                    "shown by fab compare; pass it through env (masked in plans) instead"
                )
        return check_hyperparameters(value)

    @field_validator("channels", mode="before")
    @classmethod
    def _channels_short_form(cls, value: object) -> object:
        if isinstance(value, dict):
            return {key: channel_from_yaml(item) for key, item in value.items()}
        return value

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: dict[str, Channel], info: ValidationInfo) -> dict[str, Channel]:
        check_channel_names(value)
        if info.data.get("data_dir") and any(name.lower() == "training" for name in value):
            raise ValueError(
                "data_dir is the 'training' channel (SM_CHANNEL_TRAINING): give it under channels or "
                "as data_dir, not both"
            )
        return value

    def source_sha256(self) -> str:
        """SHA-256 of the exact bytes ``load_job_spec`` parsed (what a hook allowance is for); ""
        for a spec built another way. Not a second read of the file: that could be another file."""
        return self._source_sha256

    def all_channels(self) -> dict[str, Channel]:
        """The channels, with ``data_dir`` as the ``training`` channel (what it always was)."""
        if self.data_dir and not self.channels:
            return {"training": Channel(path=self.data_dir)}
        if self.data_dir:
            return {"training": Channel(path=self.data_dir), **self.channels}
        return dict(self.channels)

    def entry_command(self) -> str:
        """The entrypoint as the nodes run it: the playbook's text, then the hyperparameters as
        SageMaker passes them (``--name value``, each word quoted), then ``--job-dir`` if set."""
        command = self.entrypoint.rstrip() + " " + shlex.join(hyperparameter_args(self.hyperparameters))
        return command.rstrip() + (JOB_DIR_ARGS if self.job_dir is not None else "")

    def secret_values(self) -> dict[str, str]:
        """The playbook's environment values that plans must never print (``secret_env`` or a secret-looking name)."""
        listed = set(self.secret_env)
        return {k: v for k, v in self.env.items() if k in listed or is_secret_name(k)}

    def requirements_text(self) -> str:
        """Contents of the requirements file (part of the setup hash), or '' when none."""
        if not self.requirements:
            return ""
        return read_text_bounded(self.workdir / self.requirements, "requirements")

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


def load_job_spec(
    path: str | Path, overrides: Sequence[Override] = (), allowed: tuple[Path, ...] = ()
) -> JobSpec:
    """Read and validate a playbook; every problem names the file and the field.
    ``overrides`` (``--set``, ``launch.job.overrides``) go into the data before validation.

    Validated strictly (``procs_per_node: yes`` is not 1, ``nodes: "3"`` is not 3), then the
    checks that need the file system: the workdir is a real directory that is not ``/`` or the
    home directory (the whole of it would be synced to every node), the requirements file is
    inside it, and the launcher's own limits (``launcher.check_spec``). ``workdir`` and
    ``channels.*.local`` must lie in the playbook's own tree (``check_shipped_paths``) or under one
    of ``allowed`` (paths the user named on the command line).
    """
    path = resolve_playbook(path)
    shown = printable(path, 400)
    raw = read_bytes_bounded(path, "playbook")
    data = yaml_mapping(raw, path, "playbook")
    data = apply_overrides(data, overrides, str(path)) if overrides else data
    workdir = data.get("workdir")
    if isinstance(workdir, str):
        if not workdir.strip() or CONTROL_CHARS.search(workdir) or len(workdir) > MAX_PATH_CHARS:
            raise SpecError(f"{shown}: field 'workdir': expected a directory path, got {workdir[:80]!r}")
        try:
            data["workdir"] = (path.parent / Path(workdir).expanduser()).resolve()
        except (OSError, RuntimeError) as exc:
            raise SpecError(
                f"{shown}: field 'workdir': cannot resolve {workdir[:80]!r}: {printable(exc)}"
            ) from None
    _resolve_local_channels(data, path, shown)
    try:
        spec = JobSpec.model_validate(data, strict=True)
    except ValidationError as exc:
        raise SpecError(describe_errors(str(path), exc, overrides)) from None
    where = printable(spec.workdir, 400)
    if not spec.workdir.is_dir():
        raise SpecError(f"{shown}: field 'workdir': directory {where} does not exist")
    if spec.workdir in (Path("/"), Path.home().resolve()):
        raise SpecError(
            f"{shown}: field 'workdir': {where} is the root or home directory; it would be synced whole "
            "to every node: point it at the project's directory"
        )
    try:
        str(spec.workdir).encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(f"{shown}: field 'workdir': the path {where} is not valid UTF-8") from None
    if spec.requirements:
        _check_requirements(spec, shown)
    for name, channel in spec.channels.items():
        if channel.local is not None and not Path(channel.local).is_dir():
            raise SpecError(
                f"{shown}: field 'channels.{name}.local': directory {printable(channel.local, 400)} does not exist"
            )
    check_shipped_paths(spec, path, shown, allowed)
    for field, problem in LAUNCHER_PROBLEMS[spec.launcher](spec):
        raise SpecError(f"{shown}: field '{field}': {problem}")
    spec._source_sha256 = hashlib.sha256(raw).hexdigest()
    return spec


def _check_requirements(spec: JobSpec, shown: str) -> None:
    """The requirements file must be a readable UTF-8 file inside the workdir (it is synced with it)."""
    assert spec.requirements is not None
    requirements = Path(spec.requirements)
    target = (spec.workdir / requirements).resolve()
    if requirements.is_absolute() or not target.is_relative_to(spec.workdir):
        raise SpecError(
            f"{shown}: field 'requirements': {printable(spec.requirements)!r} is outside workdir "
            f"{printable(spec.workdir, 400)}; only the workdir is synced to the nodes"
        )
    if not target.is_file():
        raise SpecError(
            f"{shown}: field 'requirements': {printable(spec.requirements)} not found in workdir "
            f"{printable(spec.workdir, 400)}"
        )
    try:
        spec.requirements_text()
    except SpecError as exc:
        raise SpecError(f"{shown}: field 'requirements': {exc}") from None


def _resolve_local_channels(data: dict[str, object], path: Path, shown: str) -> None:
    """``channels.<name>.local`` is relative to the playbook, like ``workdir``: made absolute here,
    before validation, so the model holds the folder that will be synced (not the root or home)."""
    channels = data.get("channels")
    if not isinstance(channels, dict):
        return
    for name, channel in channels.items():
        if not isinstance(channel, dict) or not isinstance(channel.get("local"), str):
            continue
        local = channel["local"]
        where = f"{shown}: field 'channels.{printable(name, 80)}.local'"
        if not local.strip() or CONTROL_CHARS.search(local) or len(local) > MAX_PATH_CHARS:
            raise SpecError(f"{where}: expected a directory path, got {local[:80]!r}")
        try:
            resolved = (path.parent / Path(local).expanduser()).resolve()
        except (OSError, RuntimeError) as exc:
            raise SpecError(f"{where}: cannot resolve {local[:80]!r}: {printable(exc)}") from None
        if resolved in (Path("/"), Path.home().resolve()):
            raise SpecError(
                f"{where}: {printable(resolved, 400)} is the root or home directory; it would be copied whole"
            )
        channels[name] = {**channel, "local": str(resolved)}


TREE_MARKER = ".fleetrun-tree"
"""A file marking a folder as a project's root, like a git checkout: ``fleetrun examples --into``
writes one, so its ``playbooks/`` may send its ``examples/``."""


def playbook_tree(playbook: Path) -> Path:
    """The tree a playbook may ship files from: the built-in playbooks' folder for a built-in,
    else the git checkout (or the folder marked with ``TREE_MARKER``) holding the playbook (not
    when that is ``/`` or the home directory, as with a dotfiles repository), else the playbook's
    own directory."""
    from launch.job.builtin import builtin_root

    where = playbook.resolve().parent
    root = builtin_root()
    if root is not None and where.is_relative_to(root.resolve() / "playbooks"):
        return root.resolve()
    for folder in (where, *where.parents):
        if (folder / ".git").exists() or (folder / TREE_MARKER).is_file():
            if folder not in (Path("/"), Path.home().resolve()):
                return folder
            break
    return where


def check_shipped_paths(spec: JobSpec, playbook: Path, shown: str, allowed: tuple[Path, ...] = ()) -> None:
    """Refuse a ``workdir`` or ``channels.*.local`` outside the playbook's own tree.

    Whatever those name is copied from this machine to every node. A playbook is often someone
    else's file (a colleague's, a repository's): ``workdir: /etc/ssh`` or ``~/.config`` would ship
    this machine's secrets to machines the playbook's author may read. Only the user can widen
    that, by naming the path on the command line (``--allow-path``). fleetrun's own example and
    test code (``examples/``, and ``tests/`` in a checkout, beside the built-in playbooks) holds
    nothing of the user's and may always be sent."""
    from launch.job.builtin import EXAMPLES_DIR, builtin_root

    tree = playbook_tree(playbook)
    roots = [tree, *(Path(a).expanduser().resolve() for a in allowed)]
    shipped = builtin_root()
    if shipped is not None:
        roots += [shipped.resolve() / EXAMPLES_DIR, shipped.resolve() / "tests"]
    fields = [("workdir", spec.workdir)]
    fields += [
        (f"channels.{name}.local", Path(c.local)) for name, c in spec.channels.items() if c.local is not None
    ]
    for field, value in fields:
        target = Path(value).resolve()
        if not any(target.is_relative_to(root) for root in roots):
            raise SpecError(
                f"{shown}: field '{printable(field, 120)}': {printable(target, 400)} is outside the playbook's "
                f"tree {printable(tree, 400)}; a playbook may only send its own files to the nodes. If you mean "
                f"to send it, name it on the command line: --allow-path {printable(target, 400)}"
            )


# -- what each launcher cannot run (its ``Launcher.check_spec`` in ``launch.planning.launchers``) --
# Checked when the playbook loads; here, with the spec, so loading needs nothing above ``job``.
def torchrun_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """torchrun runs a script or a module: ``python -c CODE`` and interpreter options cannot pass.

    ``python -c 'print(1)'`` would become ``torchrun ... -c 'print(1)'``, which torchrun
    refuses on every node with exit code 2; ``python -u x.py`` likewise (``-u`` is not a
    torchrun option).
    """
    argv = shlex.split(spec.entrypoint)
    if argv[0] not in ("python", "python3") or len(argv) < 2 or not argv[1].startswith("-"):
        return []
    if argv[1] == "-m":
        return []
    if argv[1] == "-c":
        reason = (
            "torchrun runs a Python script or module (-m), not 'python -c CODE'; put the code in a script"
        )
    else:
        reason = (
            f"torchrun runs a Python script or module (-m) and takes no interpreter option like "
            f"{argv[1][:20]!r}; set it through env (PYTHONUNBUFFERED=1, PYTHONOPTIMIZE, ...) instead"
        )
    return [("entrypoint", reason)]


def horovod_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """horovodrun is not elastic: ``nodes: MIN:MAX`` needs torchrun. (In a container it runs:
    ``launch.planning.launchers.horovod``.)"""
    if spec.min_nodes is not None:
        return [
            ("nodes", "nodes: MIN:MAX (elastic) needs launcher: torchrun; horovodrun here is not elastic")
        ]
    return []


LAUNCHER_PROBLEMS: dict[str, Callable[[JobSpec], list[tuple[str, str]]]] = {
    "torchrun": torchrun_problems,
    "horovod": horovod_problems,
}
"""(field, problem) per launcher name (``JobSpec.launcher``)."""
