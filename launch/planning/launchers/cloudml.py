"""The environment a Cloud ML Engine (AI Platform Training) or Vertex AI trainer expects, per node.

A trainer package written for those services finds its cluster in ``TF_CONFIG`` and, on Vertex,
in ``CLUSTER_SPEC``; it writes where ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and
``AIP_TENSORBOARD_LOG_DIR`` say, and the seeds' trainers take ``--job-dir``. What each service
gives node 0 differs, so the playbook's ``tf_config:`` picks the layout:

* ``workers`` (the default, TF's plain multi-worker shape): every node a ``worker``, node N is
  ``worker`` N. No node has a special role: the trainer elects one (``task.index == 0``).
* ``chief`` (Vertex AI, and TF's MultiWorkerMirroredStrategy with a chief): node 0 is the one
  ``chief``, node N > 0 is ``worker`` N-1.
* ``master`` (Cloud ML Engine's runtime before ``useChiefInTfConfig``): node 0 is the
  ``master``, node N > 0 is ``worker`` N-1.

``chief`` and ``master`` carry ``"environment": "cloud"`` as the services write it; the services'
``job`` key (their own job request) has no fleetrun equivalent and is left out. ``CLUSTER_SPEC``
is Vertex's worker-pool view of the same cluster: node 0 is ``workerpool0`` (the primary
replica), the others ``workerpool1``, whatever ``tf_config`` says. Every address is the node's
private address with port 2222, the port the services use. The ``AIP_*`` folders are under the
run directory (pulled back with it): the model is the playbook's ``outputs`` (as
``SM_MODEL_DIR``), checkpoints are fleetrun's ``FLEETRUN_CHECKPOINT_DIR``, TensorBoard logs
``logs/``. Pure: dictionaries only.
"""

from __future__ import annotations

import json

from launch.job.inventory import host_port
from launch.job.spec import JobSpec

TF_PORT = 2222
TENSORBOARD_DIR = "logs"
LEAD_ROLE = {"chief": "chief", "master": "master"}
"""The role node 0 has in each layout that gives it one (``workers`` gives it none)."""


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def tf_config(layout: str, ips: list[str], rank: int) -> dict[str, object]:
    """``TF_CONFIG`` of node ``rank`` in the ``tf_config:`` layout (see the module docstring)."""
    addresses = [host_port(ip, TF_PORT) for ip in ips]
    lead = LEAD_ROLE.get(layout)
    if lead is None:
        return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
    cluster: dict[str, list[str]] = {lead: addresses[:1]}
    if len(addresses) > 1:
        cluster["worker"] = addresses[1:]
    task = {"type": lead, "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
    return {"cluster": cluster, "environment": "cloud", "task": task}


def cluster_spec(ips: list[str], rank: int) -> dict[str, object]:
    """Vertex's ``CLUSTER_SPEC`` of node ``rank``: node 0 is ``workerpool0``, the rest ``workerpool1``."""
    addresses = [host_port(ip, TF_PORT) for ip in ips]
    cluster: dict[str, list[str]] = {"workerpool0": addresses[:1]}
    if len(addresses) > 1:
        cluster["workerpool1"] = addresses[1:]
    task = {"type": "workerpool0", "index": 0} if rank == 0 else {"type": "workerpool1", "index": rank - 1}
    return {"cluster": cluster, "environment": "cloud", "task": task}


def cloudml_env(
    spec: JobSpec, ips: list[str], rank: int, run_dir: str, checkpoint_dir: str
) -> dict[str, str]:
    """``TF_CONFIG``, ``CLUSTER_SPEC``, the ``AIP_*`` folders and ``FLEETRUN_JOB_DIR`` of node ``rank``."""
    env = {
        "TF_CONFIG": _compact(tf_config(spec.tf_config, ips, rank)),
        "CLUSTER_SPEC": _compact(cluster_spec(ips, rank)),
        "AIP_MODEL_DIR": f"{run_dir}/{spec.outputs}",
        "AIP_CHECKPOINT_DIR": checkpoint_dir,
        "AIP_TENSORBOARD_LOG_DIR": f"{run_dir}/{TENSORBOARD_DIR}",
    }
    if spec.job_dir is not None:
        env["FLEETRUN_JOB_DIR"] = f"{run_dir}/{spec.job_dir}"
    return env


HOME_RELATIVE_KEYS = frozenset(
    {"AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "FLEETRUN_JOB_DIR"}
)
"""Keys whose ``$HOME/...`` values the node's shell expands."""
