"""A playbook as a Kubeflow PyTorchJob: ``fab export PLAYBOOK --to pytorchjob --image IMAGE``.

Pure (no I/O): the manifest is built from the plan the torchrun launcher makes for the same
playbook (its environment conventions, process count and entrypoint), with the Training Operator's
own Python models (the ``kubeflow-training`` package), so a field the operator does not know, or
a required one left out, fails here and not on the cluster.

What maps to what:

* nodes -> one ``Master`` replica and ``nodes - 1`` ``Worker`` replicas (the operator gives the pods
  ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` and torchrun's ``PET_*`` variables, so the
  per-node values of fleetrun's plan, addresses and ranks, are left to it); an elastic playbook
  (``nodes: MIN:MAX``) gets only ``Worker`` replicas and an ``elasticPolicy`` (c10d rendezvous);
  ``--nodes`` below the playbook's MIN is refused, as ``fab train`` refuses too few hosts;
* per-node values (``SM_CURRENT_HOST``, ``SM_HOSTS``, ``FLEETRUN_NODE_RANK``, ``SM_NUM_CPUS``,
  ``SM_TRAINING_ENV`` ...) are never copied from the head's plan into the one pod template: each
  pod derives them at start-up from its own environment, by sourcing the entry wrapper
  ``images/pod/fleetrun-pod-env.sh`` (``POD_ENV_SCRIPT`` in the image) before torchrun: the
  operator's ``PET_NODE_RANK``, else its ``RANK``, else the pod's hostname (``<job>-master-0``,
  ``<job>-worker-N``);
* channels (and ``data_dir``) -> a volume and a read-only mount per channel: a folder on the nodes
  is mounted at the same path, a copied one (``local``/``bucket``) at ``POD_DATA_DIR/<name>``;
  each volume is a PersistentVolumeClaim named ``<job>-<channel>`` that the notes ask for;
* procs_per_node -> ``spec.nprocPerNode`` only (the webhook refuses it beside the deprecated
  ``elasticPolicy.nProcPerNode``); GPUs per node -> ``resources.limits["nvidia.com/gpu"]``;
* entrypoint -> ``python -m torch.distributed.run <entrypoint>`` under ``sh -c``, as fleetrun's
  launch script runs it (the entrypoint stays shell text); the ``SM_*`` names a shell cannot keep
  (``SM_HP_BATCH-SIZE``) are the script's arguments, given to ``env`` where Python starts;
* the job's name must be a DNS-1035 label whose per-pod Service names (``<job>-worker-<index>``)
  fit in 63 characters, as the operator needs;
* env -> the plan's environment (the playbook's ``env`` and fleetrun's conventions:
  ``FLEETRUN_OUTPUT_DIR``/``SM_MODEL_DIR``, ``FLEETRUN_DATA_DIR``, the profile, ...), with the
  node-home paths moved to ``POD_RUN_DIR`` in the container;
* max_restarts -> torchrun's ``--max-restarts`` (and ``elasticPolicy.maxRestarts``);
  ``stop.max_wall_time_s`` -> ``runPolicy.activeDeadlineSeconds``;
* recovery -> ``restartPolicy: OnFailure`` and ``runPolicy.backoffLimit`` of ``max_restarts``
  restarts of every pod (the operator counts each pod's restarts); an elastic job's survivors
  restart torchrun's worker group instead, so ``elasticPolicy.maxRestarts`` (and torchrun's
  ``--max-restarts``) grow by ``recovery.max_restarts``; ``grace_s`` ->
  ``terminationGracePeriodSeconds``. What Kubernetes decides itself (when a node is lost, that a
  lost pod is replaced, that a failed rank is retried like a lost pod) is said in the notes.

The image is ``images/docker/Dockerfile`` built with the playbook's workdir (``POD_WORKDIR``),
fleetrun's node helpers on ``PYTHONPATH`` (``POD_LIB``) and the entry wrapper; ``setup:`` commands
do not run in pods, so they are listed in ``notes`` (bake them into the image). ``--image`` is
checked against the registries' reference grammar (``launch.job.image_reference``), so a name
Kubernetes would leave in ``InvalidImageName`` is refused here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from launch.errors import SpecError
from launch.job.image_reference import image_problem
from launch.job.inventory import Host, Inventory
from launch.job.spec import ENV_NAME_RE, JobSpec
from launch.job.validation import printable
from launch.planning import remote_layout as layout
from launch.planning.launchers.base import aip_mkdir_line
from launch.planning.launchers.sagemaker import channel_dir, odd_names_env
from launch.planning.launchers.torchrun import TorchrunLauncher, entrypoint_tail
from launch.planning.plan import LaunchPlan

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"
"""The Training Operator finds the training container by this name."""
GPU_RESOURCE = "nvidia.com/gpu"
POD_WORKDIR = "/workspace"
"""Where the Dockerfile copies the playbook's workdir (and the container's working directory)."""
POD_LIB = "/opt/fleetrun/lib"
"""Where the Dockerfile copies fleetrun's node helpers (``fleetrun_metrics``, ``fleetrun_profile``)."""
POD_RUN_DIR = "/fleetrun/run"
"""The run directory in the pod (``$FLEETRUN_RUN_DIR``): metrics, outputs, profiles."""
POD_DATA_DIR = "/fleetrun/data"
"""Where a copied channel (``local``/``bucket``) is mounted in the pod: ``POD_DATA_DIR/<channel>``."""
POD_ENV_SCRIPT = "/opt/fleetrun/pod-env.sh"
"""The entry wrapper in the image (``images/pod/fleetrun-pod-env.sh``), sourced before torchrun."""
POD_ENV_SOURCE = "images/pod/fleetrun-pod-env.sh"
OPERATOR_KEYS = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "WORLD_SIZE",
        "FLEETRUN_NODE_RANK",
        "FLEETRUN_NODE_IPS",
        "FLEETRUN_HEAD_IP",
        "TF_CONFIG",
        "CLUSTER_SPEC",
        "CUDA_VISIBLE_DEVICES",
        "SM_CURRENT_HOST",
        "SM_HOSTS",
        "SM_RESOURCE_CONFIG",
    }
)
"""Per-node values of fleetrun's plan: the operator sets them in each pod (or the device plugin
does), or the entry wrapper derives them there from the pod's own environment."""
MACHINE_KEYS = frozenset({"TMPDIR", "TORCHINDUCTOR_CACHE_DIR"})
"""Where a shared machine keeps scratch and caches; a pod has its own /tmp (and Kubernetes would
not expand ``$HOME`` in a value): left to the container."""
K8S_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS-1123 label: what a namespace must be."""
DNS1035_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS-1035 label (a letter first): what the Training Operator's admission webhook requires of a
PyTorchJob's name (``validatePyTorchJob``: ``NameIsDNS1035Label``), and what every Service name is."""
LABEL_MAX = 63
POD_ARGV0 = "fleetrun-pod"
"""``$0`` of the pod's ``sh -c`` script; the arguments after it are ``NAME=VALUE`` pairs for ``env``."""


@dataclass(frozen=True)
class PyTorchJobExport:
    """The manifest (as Kubernetes takes it), the SDK object it came from, and what to tell the user."""

    manifest: dict[str, Any]
    job: Any
    """``kubeflow.training.models.KubeflowOrgV1PyTorchJob``."""
    plan: LaunchPlan
    notes: list[str] = field(default_factory=list)


def elastic_range(spec: JobSpec) -> tuple[int, int] | None:
    """(MIN, MAX) nodes when the playbook is elastic (``nodes: MIN:MAX``, read as ``min_nodes``), else None."""
    low = spec.min_nodes
    if low is not None and low < spec.nodes:
        return low, spec.nodes
    return None


def _pod_host(name: str, gpus: int) -> Host:
    """A pod in the plan's terms: the plan needs hosts, a pod is reached by name, not SSH (no key)."""
    return Host.model_construct(
        name=name,
        address=name,
        private_address=name,
        user="root",
        port=22,
        key=None,
        host_key="",
        gpus=gpus,
        interface=None,
        python="python",
        instance_type=None,
    )


def pod_env(plan: LaunchPlan, spec: JobSpec | None = None) -> dict[str, str]:
    """The plan's environment for every pod, as the manifest's ``env`` holds it: per-node keys
    dropped (the operator and the entry wrapper set them in each pod), node-home paths moved to the
    pod's (run directory, workdir, copied channels). The ``SM_*`` names a shell cannot keep are
    not here: see ``pod_odd_env``."""
    return {k: v for k, v in _pod_env_all(plan, spec).items() if ENV_NAME_RE.fullmatch(k)}


def pod_odd_env(plan: LaunchPlan, spec: JobSpec) -> dict[str, str]:
    """The ``SM_*`` variables whose names are no shell identifier (``SM_HP_BATCH-SIZE``,
    ``SM_CHANNEL_TRAIN-SET``), with the pod's paths. Kubernetes would set them, but the image's
    ``/bin/sh`` (dash) drops such names from its environment before the command runs, so they
    are the pod command's arguments instead, handed to ``env`` wherever Python starts (as
    fleetrun's own launch script re-adds them with ``env`` on its ``exec``)."""
    return {k: v for k, v in _pod_env_all(plan, spec).items() if not ENV_NAME_RE.fullmatch(k)}


def _pod_env_all(plan: LaunchPlan, spec: JobSpec | None) -> dict[str, str]:
    run_dir = layout.home(layout.rundir(plan.run_id))
    moves = {run_dir: POD_RUN_DIR, layout.home(layout.workdir(plan.job)): POD_WORKDIR}
    if spec is not None:
        moves |= {
            layout.home(channel_dir(spec.name, ch)): f"{POD_DATA_DIR}/{ch}" for ch in spec.all_channels()
        }
    source = dict(plan.head.env)
    if spec is not None:
        source |= odd_names_env(spec)
    env = {}
    for key, value in source.items():
        if key in OPERATOR_KEYS or (key in MACHINE_KEYS and value.startswith(layout.home(layout.ROOT))):
            continue  # the operator's, or fleetrun's machine folders (a playbook's own value stays)
        for old, new in moves.items():
            if value == old or value.startswith(old + "/"):
                value = new + value[len(old) :]
                break
        env[key] = value
    env["PYTHONPATH"] = POD_LIB
    return env


def torchrun_restarts(spec: JobSpec) -> int:
    """torchrun's ``--max-restarts`` in the pods: the playbook's, and for an elastic job with
    ``recovery:`` also its restarts (survivors restart the worker group when a pod is lost)."""
    if elastic_range(spec) is not None and spec.recovery.enabled:
        return spec.max_restarts + spec.recovery.max_restarts
    return spec.max_restarts


def pod_command(spec: JobSpec, odd_env: dict[str, str] | None = None) -> list[str]:
    """What the training container runs: the entry wrapper (this pod's own rank, host and
    ``SM_*``), then torchrun, told the rest by the operator's ``PET_*`` env; the entrypoint as
    fleetrun's nodes run it (``entry_command``: with the hyperparameters as args).

    ``odd_env`` (``pod_odd_env``) follows the script as its arguments (``$@``, ``NAME=VALUE``
    each, never parsed by a shell): the wrapper and the ``exec`` pass them to ``env``, so they
    reach ``fleetrun_sagemaker`` and the training script whatever ``/bin/sh`` drops."""
    tail = entrypoint_tail(spec.entry_command())
    words = f"python -m torch.distributed.run --max-restarts={torchrun_restarts(spec)} {tail}"
    folders = '"$FLEETRUN_OUTPUT_DIR"' + (' "$FLEETRUN_JOB_DIR"' if spec.job_dir else "")
    script = f'. {POD_ENV_SCRIPT} && mkdir -p {folders} && {aip_mkdir_line()} && exec env "$@" {words}'
    return ["sh", "-c", script, POD_ARGV0, *(f"{k}={v}" for k, v in sorted((odd_env or {}).items()))]


def _check(spec: JobSpec, image: str, name: str, namespace: str) -> None:
    if spec.launcher != TorchrunLauncher.name:
        raise SpecError(
            f"launcher {spec.launcher!r}: a PyTorchJob runs torchrun; export a torchrun playbook "
            "(Horovod jobs run as an MPIJob)"
        )
    problem = image_problem(image)
    if problem is not None:
        raise SpecError(f"--image: {problem}, got {printable(image, 80)!r}")
    if not DNS1035_RE.fullmatch(name):
        raise SpecError(
            f"name: {printable(name, 80)!r} is not a DNS-1035 label, which the Training Operator requires of "
            "a PyTorchJob (a lowercase letter first, then lowercase letters, digits or '-', at most 63): "
            "give the export a name (--set name=NAME)"
        )
    if not K8S_NAME_RE.fullmatch(namespace):
        raise SpecError(
            f"namespace: {printable(namespace, 80)!r} is not a Kubernetes name (lowercase letters, digits, "
            "'-', at most 63)"
        )


def service_names(name: str, spec: JobSpec) -> list[str]:
    """The Services the operator makes, one per pod, named ``<job>-<type>-<index>`` (its
    ``GenGeneralName``: the replica type lowercased), as ``MASTER_ADDR`` and the rendezvous
    endpoint name them."""
    if elastic_range(spec) is not None:
        return [f"{name}-worker-{i}" for i in range(spec.nodes)]
    return [f"{name}-master-0"] + [f"{name}-worker-{i}" for i in range(spec.nodes - 1)]


def _check_service_names(name: str, spec: JobSpec) -> None:
    """A Service name is a DNS-1035 label of at most 63 characters: a longer one is never
    created, so ``MASTER_ADDR`` never resolves and the job never meets. Refused here."""
    longest = max(service_names(name, spec), key=len)
    if len(longest) > LABEL_MAX:
        room = LABEL_MAX - (len(longest) - len(name))
        raise SpecError(
            f"name: {name!r} makes the Service name {longest!r} ({len(longest)} characters; Kubernetes "
            f"allows {LABEL_MAX}): give a name of at most {room} characters (--set name=NAME)"
        )


def count_option(flag: str, text: str | int | None, low: int, high: int) -> int | None:
    """A whole-number option given as text (``--nodes``, ``--gpus``): None when not given (empty),
    else a number from ``low`` to ``high``; anything else is refused in one line (``-1`` is not
    read as "not given")."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        value = text
    else:
        word = text.strip()
        if not re.fullmatch(r"[+-]?[0-9]{1,7}", word):
            raise SpecError(
                f"{flag}: expected a whole number from {low} to {high}, got {printable(word, 40)!r}"
            )
        value = int(word)
    if not low <= value <= high:
        raise SpecError(f"{flag}: expected {low} to {high}, got {value}")
    return value


def _with_nodes(spec: JobSpec, nodes: int | None) -> JobSpec:
    """The playbook with ``--nodes``: refused where ``fab train`` would refuse the run (fewer nodes
    than an elastic playbook's MIN); an elastic playbook keeps its MIN (``nodes: MIN:--nodes``)."""
    if nodes is None:
        return spec
    if not 1 <= nodes <= 4096:
        raise SpecError(f"--nodes: expected 1 to 4096, got {nodes}")
    if spec.min_nodes is not None and nodes < spec.min_nodes:
        raise SpecError(
            f"--nodes {nodes}: the playbook says nodes: {spec.min_nodes}:{spec.nodes}, so it needs at least "
            f"{spec.min_nodes} nodes (fab train refuses fewer); give --nodes {spec.min_nodes} to {spec.nodes} "
            "or more"
        )
    return spec.model_copy(update={"nodes": nodes})


def _k8s_label(text: str) -> str:
    """``text`` as a DNS label (lowercase letters, digits, '-'), for volume and claim names."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


@dataclass(frozen=True)
class ChannelMount:
    """Where one channel is in the pods, and the placeholder claim that holds it."""

    channel: str
    mount_path: str
    volume: str
    claim: str
    source: str
    """What the claim must hold, for the note."""


def channel_mounts(spec: JobSpec, name: str) -> list[ChannelMount]:
    """One read-only mount per channel (``data_dir`` is the ``training`` channel): a node folder at
    the same path, a copied one at ``POD_DATA_DIR/<channel>``; claims named ``<job>-<channel>``."""
    mounts = []
    used: set[str] = set()
    for channel, source in sorted(spec.all_channels().items()):
        label = _k8s_label(channel)[:40]
        volume = f"channel-{label}"
        while volume in used:  # train-set and train_set are one label
            volume = f"channel-{label}-{len(used)}"
        used.add(volume)
        claim = f"{name}-{volume.removeprefix('channel-')}"[:63].strip("-")
        if source.path is not None:
            mounts.append(
                ChannelMount(channel, source.path, volume, claim, f"what the nodes have at {source.path}")
            )
        else:
            what = (
                f"the folder {source.local}"
                if source.local is not None
                else f"the bucket prefix {source.bucket}"
            )
            mounts.append(
                ChannelMount(channel, f"{POD_DATA_DIR}/{channel}", volume, claim, f"a copy of {what}")
            )
    return mounts


def export_pytorchjob(
    spec: JobSpec,
    image: str,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    namespace: str = "default",
    name: str | None = None,
) -> PyTorchJobExport:
    """Build the PyTorchJob for ``spec``; ``nodes`` and ``gpus_per_node`` override the playbook.

    GPUs per node default to ``procs_per_node`` when it is a number, else 1 (a PyTorchJob's pod
    asks for its GPUs up front; ``auto`` cannot be resolved before a pod runs): pass
    ``gpus_per_node=0`` for a CPU job. Processes per node: ``procs_per_node``, or for ``auto``
    one per GPU (at least one), as fleetrun resolves it on a node.
    """
    # the SDK is imported only by an export (``fleetrun[kubeflow]``)
    from kubeflow.training import ApiClient
    from kubeflow.training import models as m

    name = name or spec.name
    _check(spec, image, name, namespace)
    spec = _with_nodes(spec, nodes)
    _check_service_names(name, spec)
    if gpus_per_node is None:
        gpus_per_node = spec.procs_per_node if isinstance(spec.procs_per_node, int) else 1
    if not 0 <= gpus_per_node <= 1024:
        raise SpecError(f"--gpus: expected 0 to 1024 per node, got {gpus_per_node}")
    procs = spec.procs_per_node if isinstance(spec.procs_per_node, int) else max(gpus_per_node, 1)
    elastic = elastic_range(spec)
    pods = service_names(name, spec)
    inventory = Inventory.model_construct(
        hosts=[_pod_host(p, gpus_per_node) for p in pods], source="pytorchjob"
    )
    fixed = spec.model_copy(update={"procs_per_node": procs})
    plan = TorchrunLauncher().plan(fixed, inventory, run_id=name)

    env = pod_env(plan, spec)
    # job-wide facts the entry wrapper needs where the operator's variables do not say them
    env["SM_NUM_GPUS"] = str(gpus_per_node)
    env["FLEETRUN_WORKER_RANK_OFFSET"] = "0" if elastic else "1"
    mounts = channel_mounts(spec, name)
    limits = {GPU_RESOURCE: str(gpus_per_node)} if gpus_per_node > 0 else None
    container = m.V1Container(
        name=CONTAINER,
        image=image,
        command=pod_command(spec, pod_odd_env(plan, spec)),
        working_dir=POD_WORKDIR,
        env=[m.V1EnvVar(name=k, value=v) for k, v in env.items()],
        resources=m.V1ResourceRequirements(limits=limits),
        volume_mounts=[
            m.V1VolumeMount(name=v.volume, mount_path=v.mount_path, read_only=True) for v in mounts
        ]
        or None,
    )
    volumes = [
        m.V1Volume(
            name=v.volume,
            persistent_volume_claim=m.V1PersistentVolumeClaimVolumeSource(claim_name=v.claim, read_only=True),
        )
        for v in mounts
    ]
    recovery = spec.recovery
    restart_policy = "OnFailure" if spec.max_restarts or recovery.enabled else "Never"
    grace = int(recovery.grace_s) if recovery.enabled else None

    def replica(count: int) -> Any:
        return m.KubeflowOrgV1ReplicaSpec(
            replicas=count,
            restart_policy=restart_policy,
            template=m.V1PodTemplateSpec(
                metadata=m.V1ObjectMeta(labels={"fleetrun/job": spec.name}),
                spec=m.V1PodSpec(
                    containers=[container], volumes=volumes or None, termination_grace_period_seconds=grace
                ),
            ),
        )

    if elastic:
        replicas = {"Worker": replica(elastic[1])}
        policy = m.KubeflowOrgV1ElasticPolicy(
            min_replicas=elastic[0],
            max_replicas=elastic[1],
            rdzv_backend="c10d",
            max_restarts=torchrun_restarts(spec),
        )  # no nProcPerNode here: deprecated, and refused beside spec.nprocPerNode by the webhook
    else:
        replicas = {"Master": replica(1)}
        if spec.nodes > 1:
            replicas["Worker"] = replica(spec.nodes - 1)
        policy = None
    # The operator counts every pod's restarts against backoffLimit: one recovery restarts all pods.
    backoff = recovery.max_restarts * spec.nodes if recovery.enabled else spec.max_restarts
    wall = spec.stop.max_wall_time_s
    job = m.KubeflowOrgV1PyTorchJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=m.V1ObjectMeta(name=name, namespace=namespace, labels={"fleetrun/job": spec.name}),
        spec=m.KubeflowOrgV1PyTorchJobSpec(
            nproc_per_node=str(procs),
            pytorch_replica_specs=replicas,
            elastic_policy=policy,
            run_policy=m.KubeflowOrgV1RunPolicy(
                clean_pod_policy="None",
                backoff_limit=backoff,
                active_deadline_seconds=int(wall) if wall else None,
            ),
        ),
    )
    manifest = ApiClient().sanitize_for_serialization(job)  # the JSON keys Kubernetes reads
    notes = (
        [f"{len(spec.setup)} setup command(s) do not run in the pods: bake them into the image"]
        if spec.setup
        else []
    )
    if spec.procs_per_node == "auto":
        notes.append(
            f"procs_per_node is auto: {procs} process(es) and {gpus_per_node} GPU(s) per pod (--gpus sets both)"
        )
    notes += [
        f"channel {v.channel}: mounted read-only at {v.mount_path} from the PersistentVolumeClaim {v.claim}; "
        f"create it (ReadOnlyMany, so every pod mounts it) holding {v.source}"
        for v in mounts
    ]
    notes += recovery_notes(spec)
    if elastic:
        notes.append(
            "elastic: each pod's SM_CURRENT_HOST is algo-<N+1> for <job>-worker-N; torchrun's rendezvous "
            "assigns the ranks, so a script should elect its leader by RANK == 0 (worker-0 may be gone)"
        )
    notes += [
        f"secret env {k}: its value is in the manifest; prefer a Kubernetes Secret"
        for k in spec.secret_values()
    ]
    return PyTorchJobExport(manifest=manifest, job=job, plan=plan, notes=notes)


def recovery_notes(spec: JobSpec) -> list[str]:
    """What of ``recovery:`` the manifest holds, and what Kubernetes decides instead."""
    policy = spec.recovery
    if not policy.enabled:
        return []
    notes = [
        f"recovery: max_restarts {policy.max_restarts} -> restartPolicy OnFailure, backoffLimit "
        f"{policy.max_restarts * spec.nodes} (the operator counts each of the {spec.nodes} pods' restarts); "
        f"grace_s -> terminationGracePeriodSeconds {int(policy.grace_s)}"
    ]
    if "rank_failed" not in policy.on:
        notes.append(
            "recovery.on leaves out rank_failed, but Kubernetes cannot tell a failed rank from a lost pod: "
            "a rank that fails by itself is restarted too"
        )
    if not policy.replace_lost_nodes:
        notes.append(
            "recovery.replace_lost_nodes: false is not mapped: Kubernetes always replaces a lost pod"
        )
    notes.append(
        "recovery.confirm_s and replace_timeout_s are not mapped: the cluster's node controller decides "
        "when a node is lost, the scheduler how long a replacement takes"
    )
    return notes


def build_command(spec: JobSpec, image: str, context: str, workdir: str) -> str:
    """The ``docker build`` that makes ``image`` for this playbook (``workdir`` relative to ``context``)."""
    return shlex.join(
        [
            "docker",
            "build",
            "-f",
            "images/docker/Dockerfile",
            "--build-arg",
            f"JOB_WORKDIR={workdir}",
            *(["--build-arg", f"REQUIREMENTS={spec.requirements}"] if spec.requirements else []),
            "-t",
            image,
            context,
        ]
    )
