"""``fab export --to pytorchjob``: the manifest, read back through the Training Operator SDK's own
model (its ApiClient's deserializer), matches the plan field by field; the Dockerfile builds what
the manifest names."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeflow.training import ApiClient
from kubeflow.training.models import KubeflowOrgV1PyTorchJob

from launch.errors import SpecError
from launch.job.spec import JobSpec, load_job_spec
from launch.planning import export_pytorchjob as ex
from launch.planning.launchers.torchrun import entrypoint_tail
from tests.conftest import REPO

DIGITS = REPO / "playbooks" / "digits-ddp.yaml"
IMAGE = "ghcr.io/lab/digits:1.0"


class _Response:
    """What ApiClient.deserialize reads: a body, as the cluster's API server would send it."""

    def __init__(self, body: str) -> None:
        self.data = body


def round_trip(manifest: dict[str, Any]) -> KubeflowOrgV1PyTorchJob:
    """The manifest as YAML text, parsed, and deserialized by the SDK into its PyTorchJob model."""
    text = yaml.safe_dump(manifest, sort_keys=False)
    job = ApiClient().deserialize(_Response(json.dumps(yaml.safe_load(text))), "KubeflowOrgV1PyTorchJob")
    assert isinstance(job, KubeflowOrgV1PyTorchJob)
    return job


def _playbook(tmp_path: Path, extra: str = "") -> JobSpec:
    (tmp_path / "w").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: tiny\nworkdir: w\nentrypoint: python train.py --lr 0.1\nnodes: 3\nprocs_per_node: 2\n"
        "max_restarts: 2\nenv: {OMP_NUM_THREADS: '1', HF_TOKEN: hf_x}\nstop: {max_wall_time_s: 7200}\n"
        + extra
    )
    return load_job_spec(path)


def check_against_plan(job: KubeflowOrgV1PyTorchJob, export: ex.PyTorchJobExport, spec: JobSpec) -> None:
    """Every field of the job against the plan it came from."""
    plan = export.plan
    assert job.api_version == "kubeflow.org/v1" and job.kind == "PyTorchJob"
    assert job.metadata.name == spec.name and job.metadata.labels == {"fleetrun/job": spec.name}
    assert len(plan.nodes) == spec.nodes
    procs = plan.total_processes // len(plan.nodes)
    assert job.spec.nproc_per_node == str(procs)
    replicas = job.spec.pytorch_replica_specs
    assert sum(r.replicas for r in replicas.values()) == len(plan.nodes)
    for replica in replicas.values():
        assert replica.restart_policy == ("OnFailure" if spec.max_restarts else "Never")
        assert replica.template.metadata.labels == {"fleetrun/job": spec.name}
        (container,) = replica.template.spec.containers
        assert container.name == "pytorch" and container.image == IMAGE
        assert container.working_dir == ex.POD_WORKDIR
        assert container.command[:2] == ["sh", "-c"]
        words = shlex.split(container.command[2])
        assert words[-len(shlex.split(entrypoint_tail(spec.entrypoint))) :] == shlex.split(
            entrypoint_tail(spec.entrypoint)
        )
        assert ["python", "-m", "torch.distributed.run", f"--max-restarts={spec.max_restarts}"] == words[
            words.index("exec") + 1 : words.index("exec") + 5
        ]
        env = {e.name: e.value for e in container.env}
        run_dir = f"$HOME/.fleetrun/runs/{plan.run_id}"
        workdir = f"$HOME/.fleetrun/work/{plan.job}"  # SM_MODULE_DIR: the code is in the image
        data = f"$HOME/.fleetrun/data/{plan.job}/"  # copied channels: mounted volumes
        left_out = ex.OPERATOR_KEYS | (ex.MACHINE_KEYS - spec.env.keys())
        for key, value in plan.head.env.items():
            if key in left_out:
                assert key not in env, f"{key} is the operator's or the machine's to set"
            elif key != "SM_NUM_GPUS":
                expected = value.replace(run_dir, ex.POD_RUN_DIR).replace(workdir, ex.POD_WORKDIR)
                assert env[key] == expected.replace(data, ex.POD_DATA_DIR + "/"), key
        assert env["PYTHONPATH"] == ex.POD_LIB
        # what the entry wrapper needs besides the operator's variables (issue 23 item 1)
        pod_only = {"PYTHONPATH", "SM_NUM_GPUS", "FLEETRUN_WORKER_RANK_OFFSET"}
        odd = {k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)}
        assert set(env) - odd == (set(plan.head.env) - left_out) | pod_only
        for key, value in spec.env.items():
            assert env[key] == value
    assert job.spec.run_policy.active_deadline_seconds == int(spec.stop.max_wall_time_s or 0) or (
        spec.stop.max_wall_time_s is None and job.spec.run_policy.active_deadline_seconds is None
    )
    assert job.spec.run_policy.backoff_limit == spec.max_restarts
    assert job == export.job, "what was written is what the SDK model held"


def test_the_digits_playbook_round_trips_through_the_sdk() -> None:
    spec = load_job_spec(DIGITS)
    export = ex.export_pytorchjob(spec, IMAGE, gpus_per_node=8)
    job = round_trip(export.manifest)
    check_against_plan(job, export, spec)
    replicas = job.spec.pytorch_replica_specs
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"].replicas == 1 and replicas["Worker"].replicas == spec.nodes - 1
    for replica in replicas.values():
        assert replica.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    assert job.spec.nproc_per_node == "8", "procs_per_node: auto -> one process per GPU"
    assert job.spec.elastic_policy is None
    assert (
        export.manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
            "workingDir"
        ]
        == ex.POD_WORKDIR
    ), "the manifest uses Kubernetes' own (camelCase) keys"


def test_nodes_gpus_and_env_from_the_playbook(tmp_path: Path) -> None:
    spec = _playbook(tmp_path, 'profile: {steps: "5-9", ranks: [0, 2]}\ndata_dir: /data/x\n')
    export = ex.export_pytorchjob(spec, IMAGE, nodes=5, gpus_per_node=0, namespace="research")
    job = round_trip(export.manifest)
    check_against_plan(job, export, spec.model_copy(update={"nodes": 5}))
    assert job.metadata.namespace == "research"
    assert job.spec.pytorch_replica_specs["Worker"].replicas == 4
    assert job.spec.nproc_per_node == "2"
    container = job.spec.pytorch_replica_specs["Master"].template.spec.containers[0]
    assert container.resources.limits is None, "--gpus 0: a CPU job asks for no GPU"
    env = {e.name: e.value for e in container.env}
    assert env["FLEETRUN_PROFILE_STEPS"] == "5-9" and env["FLEETRUN_PROFILE_RANKS"] == "0,2"
    assert env["FLEETRUN_OUTPUT_DIR"] == f"{ex.POD_RUN_DIR}/outputs" == env["SM_MODEL_DIR"]
    assert env["FLEETRUN_DATA_DIR"] == "/data/x" and env["NNODES"] == "5"
    assert "TMPDIR" not in env and "TORCHINDUCTOR_CACHE_DIR" not in env, "the pod's own /tmp"
    assert not [k for k, v in env.items() if "$HOME" in v], "Kubernetes does not expand $HOME"
    assert any("HF_TOKEN" in n for n in export.notes) and any("/data/x" in n for n in export.notes)
    assert export.manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200


def test_gpus_default_to_the_process_count(tmp_path: Path) -> None:
    export = ex.export_pytorchjob(_playbook(tmp_path), IMAGE, nodes=1)
    job = round_trip(export.manifest)
    assert set(job.spec.pytorch_replica_specs) == {"Master"}, "one node: a master alone"
    limits = job.spec.pytorch_replica_specs["Master"].template.spec.containers[0].resources.limits
    assert limits == {"nvidia.com/gpu": "2"}


def test_an_elastic_playbook_gets_workers_and_an_elastic_policy(tmp_path: Path) -> None:
    """``nodes: MIN:MAX`` is read into ``min_nodes`` (the recovery spec); set here the same way."""
    spec = _playbook(tmp_path).model_copy(update={"min_nodes": 2, "nodes": 4})
    assert ex.elastic_range(spec) == (2, 4)
    export = ex.export_pytorchjob(spec, IMAGE)
    job = round_trip(export.manifest)
    check_against_plan(job, export, spec)
    assert set(job.spec.pytorch_replica_specs) == {"Worker"}
    assert job.spec.pytorch_replica_specs["Worker"].replicas == 4
    policy = job.spec.elastic_policy
    assert (policy.min_replicas, policy.max_replicas, policy.rdzv_backend) == (2, 4, "c10d")
    assert policy.max_restarts == 2 and policy.n_proc_per_node == 2


def test_a_fixed_node_count_is_not_elastic(tmp_path: Path) -> None:
    assert ex.elastic_range(_playbook(tmp_path)) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image": "bad image"}, "--image: expected an image reference"),
        ({"image": IMAGE, "namespace": "Research"}, "namespace: 'Research' is not a Kubernetes name"),
        ({"image": IMAGE, "nodes": 0}, "--nodes: expected 1 to 4096"),
        ({"image": IMAGE, "gpus_per_node": 5000}, "--gpus: expected 0 to 1024"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        ex.export_pytorchjob(_playbook(tmp_path), **kwargs)


def test_horovod_playbooks_are_refused() -> None:
    spec = load_job_spec(REPO / "playbooks" / "digits-horovod.yaml")
    with pytest.raises(SpecError, match="a PyTorchJob runs torchrun"):
        ex.export_pytorchjob(spec, IMAGE)


def test_fab_export_writes_a_manifest_the_sdk_reads(tmp_path: Path) -> None:
    out = tmp_path / "digits.yaml"
    fab = Path(sys.executable).parent / "fab"
    argv = [str(fab), "export", str(DIGITS), "--to", "pytorchjob", "--image", IMAGE, "--nodes", "2"]
    proc = subprocess.run(
        [*argv, "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_mode & 0o077 == 0, "the manifest may hold secret env values"
    job = round_trip(yaml.safe_load(out.read_text()))
    spec = load_job_spec(DIGITS).model_copy(update={"nodes": 2})
    check_against_plan(job, ex.export_pytorchjob(spec, IMAGE), spec)
    assert "--build-arg JOB_WORKDIR=examples/digits" in proc.stderr
    bad = subprocess.run(
        [*argv[:3], "--to", "tfjob", "--image", IMAGE], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "--to: expected one of pytorchjob" in bad.stderr


def test_the_dockerfile_builds_what_the_manifest_names() -> None:
    dockerfile = (REPO / "images" / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M) and "ARG BASE=pytorch/pytorch:" in dockerfile
    assert "install torch" not in dockerfile, "torch comes from the official image"
    assert re.search(rf"^WORKDIR {ex.POD_WORKDIR}$", dockerfile, re.M)
    assert f"COPY ${{JOB_WORKDIR}}/ {ex.POD_WORKDIR}/" in dockerfile
    assert f"COPY launch/nodelib/*.py {ex.POD_LIB}/" in dockerfile
    assert f"PYTHONPATH={ex.POD_LIB}" in dockerfile
    assert f"FLEETRUN_RUN_DIR={ex.POD_RUN_DIR}" in dockerfile
    build = ex.build_command(load_job_spec(DIGITS), IMAGE, ".", "examples/digits")
    assert build.startswith(
        "docker build -f images/docker/Dockerfile --build-arg JOB_WORKDIR=examples/digits"
    )
    assert (REPO / "examples" / "digits" / "trainer" / "task.py").is_file()
    ignore = (REPO / "images" / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert ".git" in ignore and "**/.venv" in ignore


def test_the_pods_run_the_entrypoint_with_its_hyperparameters(tmp_path: Path) -> None:
    """The container runs what fleetrun's launch script runs: the hyperparameters as arguments
    after the entrypoint (SageMaker's ``--name value``), not the bare entrypoint."""
    spec = _playbook(tmp_path, "hyperparameters: {epochs: 3, batch-size: 64}\n")
    command = ex.export_pytorchjob(spec, IMAGE).manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "spec"
    ]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"]
    assert entrypoint_tail(spec.entry_command()) in command[2]
    assert "--epochs 3" in command[2] and "--batch-size 64" in command[2]
