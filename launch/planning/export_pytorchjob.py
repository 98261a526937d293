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
* procs_per_node -> ``nprocPerNode``; GPUs per node -> ``resources.limits["nvidia.com/gpu"]``;
* entrypoint -> ``python -m torch.distributed.run <entrypoint>`` under ``sh -c``, as fleetrun's
  launch script runs it (the entrypoint stays shell text);
* env -> the plan's environment (the playbook's ``env`` and fleetrun's conventions:
  ``FLEETRUN_OUTPUT_DIR``/``SM_MODEL_DIR``, ``FLEETRUN_DATA_DIR``, the profile, ...), with the
  node-home paths moved to ``POD_RUN_DIR`` in the container;
* max_restarts -> torchrun's ``--max-restarts`` (and ``elasticPolicy.maxRestarts``);
  ``stop.max_wall_time_s`` -> ``runPolicy.activeDeadlineSeconds``.

The image is ``images/docker/Dockerfile`` built with the playbook's workdir (``POD_WORKDIR``) and
fleetrun's node helpers on ``PYTHONPATH`` (``POD_LIB``); ``setup:`` commands do not run in pods,
so they are listed in ``notes`` (bake them into the image).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from launch.errors import SpecError
from launch.job.inventory import Host, Inventory
from launch.job.spec import JobSpec
from launch.planning import remote_layout as layout
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
        "CUDA_VISIBLE_DEVICES",
    }
)
MACHINE_KEYS = frozenset({"TMPDIR", "TORCHINDUCTOR_CACHE_DIR"})
"""Where a shared machine keeps scratch and caches; a pod has its own /tmp (and Kubernetes would
not expand ``$HOME`` in a value): left to the container."""
"""Per-node values of fleetrun's plan that the operator sets in each pod (or the device plugin does)."""
K8S_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,499}")


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


def pod_env(plan: LaunchPlan) -> dict[str, str]:
    """The plan's environment for every pod: per-node keys dropped, node-home paths moved to the pod's."""
    run_dir = layout.home(layout.rundir(plan.run_id))
    env = {}
    for key, value in plan.head.env.items():
        if key in OPERATOR_KEYS or (key in MACHINE_KEYS and value.startswith(layout.home(layout.ROOT))):
            continue  # the operator's, or fleetrun's machine folders (a playbook's own value stays)
        if value == run_dir or value.startswith(run_dir + "/"):
            value = POD_RUN_DIR + value[len(run_dir) :]
        env[key] = value
    env["PYTHONPATH"] = POD_LIB
    return env


def pod_command(spec: JobSpec) -> list[str]:
    """What the training container runs: torchrun, told the rest by the operator's ``PET_*`` env;
    the entrypoint as fleetrun's nodes run it (``entry_command``: with the hyperparameters as args)."""
    tail = entrypoint_tail(spec.entry_command())
    words = f"python -m torch.distributed.run --max-restarts={spec.max_restarts} {tail}"
    return ["sh", "-c", f'mkdir -p "$FLEETRUN_OUTPUT_DIR" && exec {words}']


def _check(spec: JobSpec, image: str, name: str, namespace: str) -> None:
    if spec.launcher != TorchrunLauncher.name:
        raise SpecError(
            f"launcher {spec.launcher!r}: a PyTorchJob runs torchrun; export a torchrun playbook "
            "(Horovod jobs run as an MPIJob)"
        )
    if not IMAGE_RE.fullmatch(image):
        raise SpecError(f"--image: expected an image reference like registry/name:tag, got {image[:80]!r}")
    for what, value in (("name", name), ("namespace", namespace)):
        if not K8S_NAME_RE.fullmatch(value):
            raise SpecError(
                f"{what}: {value[:80]!r} is not a Kubernetes name (lowercase letters, digits, '-', at most 63)"
            )


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
    if nodes is not None:
        if not 1 <= nodes <= 4096:
            raise SpecError(f"--nodes: expected 1 to 4096, got {nodes}")
        spec = spec.model_copy(update={"nodes": nodes})
    if gpus_per_node is None:
        gpus_per_node = spec.procs_per_node if isinstance(spec.procs_per_node, int) else 1
    if not 0 <= gpus_per_node <= 1024:
        raise SpecError(f"--gpus: expected 0 to 1024 per node, got {gpus_per_node}")
    procs = spec.procs_per_node if isinstance(spec.procs_per_node, int) else max(gpus_per_node, 1)
    elastic = elastic_range(spec)
    pods = [f"{name}-master-0"] + [f"{name}-worker-{i}" for i in range(spec.nodes - 1)]
    if elastic:
        pods = [f"{name}-worker-{i}" for i in range(spec.nodes)]
    inventory = Inventory.model_construct(
        hosts=[_pod_host(p, gpus_per_node) for p in pods], source="pytorchjob"
    )
    fixed = spec.model_copy(update={"procs_per_node": procs})
    plan = TorchrunLauncher().plan(fixed, inventory, run_id=name)

    env = pod_env(plan)
    limits = {GPU_RESOURCE: str(gpus_per_node)} if gpus_per_node > 0 else None
    container = m.V1Container(
        name=CONTAINER,
        image=image,
        command=pod_command(spec),
        working_dir=POD_WORKDIR,
        env=[m.V1EnvVar(name=k, value=v) for k, v in env.items()],
        resources=m.V1ResourceRequirements(limits=limits),
    )

    def replica(count: int) -> Any:
        return m.KubeflowOrgV1ReplicaSpec(
            replicas=count,
            restart_policy="OnFailure" if spec.max_restarts else "Never",
            template=m.V1PodTemplateSpec(
                metadata=m.V1ObjectMeta(labels={"fleetrun/job": spec.name}),
                spec=m.V1PodSpec(containers=[container]),
            ),
        )

    if elastic:
        replicas = {"Worker": replica(elastic[1])}
        policy = m.KubeflowOrgV1ElasticPolicy(
            min_replicas=elastic[0],
            max_replicas=elastic[1],
            rdzv_backend="c10d",
            max_restarts=spec.max_restarts,
            n_proc_per_node=procs,
        )
    else:
        replicas = {"Master": replica(1)}
        if spec.nodes > 1:
            replicas["Worker"] = replica(spec.nodes - 1)
        policy = None
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
                backoff_limit=spec.max_restarts,
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
    if spec.data_dir:
        notes.append(f"data_dir {spec.data_dir}: mount it into the pods at that path (a volume)")
    notes += [
        f"secret env {k}: its value is in the manifest; prefer a Kubernetes Secret"
        for k in spec.secret_values()
    ]
    return PyTorchJobExport(manifest=manifest, job=job, plan=plan, notes=notes)


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
