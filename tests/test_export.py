"""``fab export --to pytorchjob``: the manifest, read back through the Training Operator SDK's own
model (its ApiClient's deserializer), matches the plan field by field; the Dockerfile builds what
the manifest names."""

from __future__ import annotations

import json
import os
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
from launch.job.image_reference import image_problem
from launch.job.spec import JobSpec, load_job_spec
from launch.planning import export_pytorchjob as ex
from launch.planning.launchers.torchrun import entrypoint_tail
from launch.rules.recovery import RecoveryPolicy
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
        start = words.index("exec") + 1
        assert words[start : start + 6] == [
            "env",
            "$@",
            "python",
            "-m",
            "torch.distributed.run",
            f"--max-restarts={spec.max_restarts}",
        ], "the odd SM_* names (the script's arguments) are given to env on the exec"
        assert container.command[3] == ex.POD_ARGV0
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
        assert not [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)], "sh drops them"
        assert set(env) == (set(plan.head.env) - left_out) | pod_only
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
    assert policy.max_restarts == 2 and job.spec.nproc_per_node == "2"
    assert policy.n_proc_per_node is None, "issue 32 item 1: the webhook refuses it beside spec.nprocPerNode"


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


# ------------------------------------------------------------------ issue 23: pods that know who they are

WRAPPER = REPO / "images" / "pod" / "fleetrun-pod-env.sh"


def _sagemaker_playbook(tmp_path: Path, extra: str = "") -> JobSpec:
    """A 3-node SageMaker-style playbook: hyperparameters (one sh cannot export), channels of every
    kind (a node folder, a copied folder, a bucket prefix, a name with '-'), recovery, a job dir."""
    (tmp_path / "w").mkdir(exist_ok=True)
    (tmp_path / "data" / "val").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: smexport\nworkdir: w\nentrypoint: python train.py\nnodes: 3\nprocs_per_node: 1\n"
        "hyperparameters: {epochs: 2, batch-size: 32, layers: [64, 32]}\n"
        "channels:\n  training: /datasets/train\n  validation: {local: data/val}\n"
        "  test-set: {bucket: datasets/test}\n"
        "recovery: {max_restarts: 2, grace_s: 45}\njob_dir: job\n" + extra
    )
    return load_job_spec(path)


def pod_template(job: KubeflowOrgV1PyTorchJob, replica: str) -> Any:
    return job.spec.pytorch_replica_specs[replica].template


def evaluate_wrapper(
    tmp_path: Path, container: Any, operator_env: dict[str, str], hostname: str
) -> tuple[int, dict[str, str], str]:
    """Source the entry wrapper as the pod's command does, with the manifest's env (the pod's run
    directory moved under ``tmp_path``) and the operator's variables for one replica; what it exports."""
    run = tmp_path / "pod" / hostname
    env = {e.name: e.value.replace(ex.POD_RUN_DIR, str(run)) for e in container.env}
    env |= operator_env | {
        "HOSTNAME": hostname,
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO / "launch" / "nodelib"),
    }
    proc = subprocess.run(
        ["sh", "-c", f'. "{WRAPPER}" && env', *container.command[3:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return proc.returncode, seen, proc.stderr


def config_dir(seen: dict[str, str]) -> Path:
    return Path(seen["SM_INPUT_CONFIG_DIR"])


def operator_env(job: str, replica: str, index: int, nodes: int, procs: int = 1) -> dict[str, str]:
    """What the Training Operator (kubeflow.org/v1, with ``nprocPerNode``) sets in a fixed job's pod."""
    rank = index + (1 if replica == "worker" else 0)
    return {
        "MASTER_ADDR": f"{job}-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": str(nodes * procs),
        "RANK": str(rank),
        "PET_MASTER_ADDR": f"{job}-master-0",
        "PET_MASTER_PORT": "23456",
        "PET_NNODES": str(nodes),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": str(procs),
    }


def test_a_sagemaker_playbook_exports_pods_that_know_who_they_are(tmp_path: Path) -> None:
    spec = _sagemaker_playbook(tmp_path)
    export = ex.export_pytorchjob(spec, IMAGE, gpus_per_node=0)
    job = round_trip(export.manifest)
    assert job == export.job, "the manifest round-trips through the SDK's models"
    master, worker = pod_template(job, "Master"), pod_template(job, "Worker")
    assert job.spec.pytorch_replica_specs["Worker"].replicas == 2
    (container,) = master.spec.containers
    assert container == worker.spec.containers[0], "one template: nothing per node is baked in"
    env = {e.name: e.value for e in container.env}
    for per_node in ("SM_CURRENT_HOST", "SM_HOSTS", "SM_RESOURCE_CONFIG", "FLEETRUN_NODE_RANK", "TF_CONFIG"):
        assert per_node not in env, f"{per_node} is the pod's own, not the head's"
    assert container.command[2].startswith(f". {ex.POD_ENV_SCRIPT} && ")
    assert "SM_HP_BATCH-SIZE" not in env, "dash would drop it: it is the command's argument instead"
    assert "SM_HP_BATCH-SIZE=32" in container.command[4:]
    assert not [k for k, v in env.items() if "$HOME" in v], "Kubernetes does not expand $HOME"

    # every replica, evaluated with the operator's variables: its own rank and host, one leader
    seen_by = {}
    for replica, index in (("master", 0), ("worker", 0), ("worker", 1)):
        pod = f"smexport-{replica}-{index}"
        code, seen, err = evaluate_wrapper(
            tmp_path, container, operator_env("smexport", replica, index, 3), pod
        )
        assert code == 0, err
        seen_by[pod] = seen
    ranks = [s["FLEETRUN_NODE_RANK"] for s in seen_by.values()]
    hosts = [s["SM_CURRENT_HOST"] for s in seen_by.values()]
    assert ranks == ["0", "1", "2"] and hosts == ["algo-1", "algo-2", "algo-3"]
    for seen in seen_by.values():
        assert json.loads(seen["SM_HOSTS"]) == ["algo-1", "algo-2", "algo-3"]
        resource = json.loads(seen["SM_RESOURCE_CONFIG"])
        assert resource["current_host"] == seen["SM_CURRENT_HOST"]
        assert (resource["current_instance_type"], resource["current_group_name"]) == (
            "local",
            "homogeneousCluster",
        )
        assert resource["instance_groups"] == [
            {
                "hosts": ["algo-1", "algo-2", "algo-3"],
                "instance_group_name": "homogeneousCluster",
                "instance_type": "local",
            }
        ]
        written = json.loads((config_dir(seen) / "resourceconfig.json").read_text())
        assert written == {**resource, "network_interface_name": seen["SM_NETWORK_INTERFACE_NAME"]}
        assert int(seen["SM_NUM_CPUS"]) >= 1 and seen["SM_NUM_GPUS"] == "0"
        assert seen["FLEETRUN_HEAD_IP"] == "smexport-master-0" and seen["NNODES"] == "3"
        training = json.loads(seen["SM_TRAINING_ENV"])
        assert training["current_host"] == seen["SM_CURRENT_HOST"]
        assert training["hyperparameters"]["layers"] == [64, 32]
        config = Path(seen["SM_INPUT_CONFIG_DIR"])
        assert json.loads((config / "hyperparameters.json").read_text())["batch-size"] == "32"
    assert [json.loads(s["SM_TRAINING_ENV"])["is_master"] for s in seen_by.values()] == [True, False, False]

    # channels: a volume and a read-only mount each, where SM_CHANNEL_<NAME> points
    mounts = {m.name: m for m in container.volume_mounts}
    claims = {v.name: v.persistent_volume_claim.claim_name for v in master.spec.volumes}
    assert set(mounts) == set(claims) == {"channel-training", "channel-validation", "channel-test-set"}
    assert all(m.read_only for m in mounts.values())
    assert mounts["channel-training"].mount_path == env["SM_CHANNEL_TRAINING"] == "/datasets/train"
    assert (
        mounts["channel-validation"].mount_path == env["SM_CHANNEL_VALIDATION"] == "/fleetrun/data/validation"
    )
    assert mounts["channel-test-set"].mount_path == "/fleetrun/data/test-set"
    assert "SM_CHANNEL_TEST-SET=/fleetrun/data/test-set" in container.command[4:]
    assert claims["channel-test-set"] == "smexport-test-set"
    for name, claim in claims.items():
        assert any(claim in n and "PersistentVolumeClaim" in n for n in export.notes), name

    # recovery: restarts of every pod, the survivors' grace to checkpoint, and what is not mapped
    assert {r.restart_policy for r in job.spec.pytorch_replica_specs.values()} == {"OnFailure"}
    assert job.spec.run_policy.backoff_limit == 2 * 3, "the operator counts each pod's restarts"
    assert master.spec.termination_grace_period_seconds == 45
    assert any("rank_failed" in n for n in export.notes) and any("confirm_s" in n for n in export.notes)
    # job_dir: made and passed in the pod too
    assert env["FLEETRUN_JOB_DIR"] == f"{ex.POD_RUN_DIR}/job"
    assert 'mkdir -p "$FLEETRUN_OUTPUT_DIR" "$FLEETRUN_JOB_DIR"' in container.command[2]
    assert container.command[2].endswith('--job-dir "$FLEETRUN_JOB_DIR"')


def test_without_recovery_a_failure_is_not_retried(tmp_path: Path) -> None:
    spec = _sagemaker_playbook(tmp_path).model_copy(update={"recovery": RecoveryPolicy()})
    job = round_trip(ex.export_pytorchjob(spec, IMAGE).manifest)
    assert job.spec.run_policy.backoff_limit == 0
    assert {r.restart_policy for r in job.spec.pytorch_replica_specs.values()} == {"Never"}
    assert pod_template(job, "Master").spec.termination_grace_period_seconds is None


def test_the_wrapper_reads_every_operators_variables(tmp_path: Path) -> None:
    """PET_NODE_RANK (operator 1.7+), else RANK (older operators), else the pod's hostname (an
    elastic job, where the rendezvous assigns ranks); nothing usable is one line and exit 2."""
    spec = _sagemaker_playbook(tmp_path)
    (container,) = pod_template(
        round_trip(ex.export_pytorchjob(spec, IMAGE).manifest), "Master"
    ).spec.containers
    old_operator = {"MASTER_ADDR": "smexport-master-0", "RANK": "2", "WORLD_SIZE": "3"}
    code, seen, err = evaluate_wrapper(tmp_path, container, old_operator, "smexport-worker-1")
    assert code == 0 and seen["SM_CURRENT_HOST"] == "algo-3" and seen["NODE_RANK"] == "2", err
    code, seen, err = evaluate_wrapper(tmp_path, container, {}, "smexport-worker-0")
    assert code == 0 and seen["SM_CURRENT_HOST"] == "algo-2", "beside a Master, worker-0 is node 1"
    for bad_env, host, message in (
        ({}, "somepod", "cannot tell this pod's node rank"),
        ({"PET_NODE_RANK": "5", "PET_NNODES": "3"}, "smexport-worker-4", "node rank 5 is not below"),
    ):
        code, _, err = evaluate_wrapper(tmp_path, container, bad_env, host)
        assert code == 2 and err.count("\n") == 1 and message in err, err

    elastic = spec.model_copy(update={"min_nodes": 2})
    export = ex.export_pytorchjob(elastic, IMAGE)
    (container,) = pod_template(round_trip(export.manifest), "Worker").spec.containers
    elastic_env = {
        "PET_NNODES": "2:3",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": "smexport-worker-0:23456",
    }
    views = [evaluate_wrapper(tmp_path, container, elastic_env, f"smexport-worker-{i}") for i in range(3)]
    assert [v[1]["SM_CURRENT_HOST"] for v in views] == ["algo-1", "algo-2", "algo-3"], [v[2] for v in views]
    assert {v[1]["SM_HOSTS"] for v in views} == {'["algo-1","algo-2","algo-3"]'}
    assert export.job.spec.elastic_policy.max_restarts == 0 + 2, "survivors restart torchrun's worker group"
    assert (
        "--max-restarts=2"
        in export.manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
            "command"
        ][2]
    )


def test_the_wrapper_is_in_the_image() -> None:
    dockerfile = (REPO / "images" / "docker" / "Dockerfile").read_text()
    assert f"COPY {ex.POD_ENV_SOURCE} {ex.POD_ENV_SCRIPT}" in dockerfile
    assert (REPO / ex.POD_ENV_SOURCE) == WRAPPER and WRAPPER.is_file()
    assert subprocess.run(["sh", "-n", str(WRAPPER)], check=False).returncode == 0


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/lab/digits:1.0",
        "digits",
        "localhost:5000/team/digits:v2",
        "registry.example.com:443/a/b/c",
        "[2001:db8::1]:5000/digits:1",
        "docker.io/library/python:3.11-slim",
        "ghcr.io/lab/digits@sha256:" + "a" * 64,
        "ghcr.io/lab/digits:1.0@sha256:" + "0123456789abcdef" * 4,
        "a__b/c--d.e:T_1",
    ],
)
def test_image_references_the_registries_take(image: str) -> None:
    assert image_problem(image) is None


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("ghcr.io/Lab/Digits:1", "must be lowercase"),
        (
            "ghcr.io/lab/digits@sha256:abc",
            "a sha256 digest is 64 lowercase hex digits (this one has 3 characters)",
        ),
        ("ghcr.io/lab/digits@sha256:" + "g" * 64, "64 lowercase hex digits"),
        ("ghcr.io/lab/digits@sha256", "is not algorithm:hex"),
        ("ghcr.io/lab/digits@sha256:" + "A" * 64, "64 lowercase hex digits"),
        ("ghcr.io/lab/digits@md5:" + "a" * 32, "digest algorithm 'md5'"),
        ("ghcr.io/lab/digits:", "expected an image reference"),
        ("ghcr.io/lab/digits:-x", "expected an image reference"),
        ("ghcr.io//digits", "expected an image reference"),
        ("-digits", "expected an image reference"),
        ("digits:" + "x" * 129, "expected an image reference"),
        ("a/" + "b" * 260, "longer than 255"),
    ],
)
def test_image_references_kubernetes_would_leave_in_invalid_image_name(image: str, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        ex.export_pytorchjob(load_job_spec(DIGITS), image)


def test_nodes_below_an_elastic_playbooks_min_are_refused(tmp_path: Path) -> None:
    spec = _playbook(tmp_path).model_copy(update={"min_nodes": 2, "nodes": 3})
    with pytest.raises(SpecError, match=r"--nodes 1: the playbook says nodes: 2:3, so it needs at least 2"):
        ex.export_pytorchjob(spec, IMAGE, nodes=1)
    fixed = round_trip(ex.export_pytorchjob(spec, IMAGE, nodes=2).manifest)
    assert fixed.spec.elastic_policy is None and fixed.spec.pytorch_replica_specs["Worker"].replicas == 1
    wider = round_trip(ex.export_pytorchjob(spec, IMAGE, nodes=5).manifest)
    assert (wider.spec.elastic_policy.min_replicas, wider.spec.elastic_policy.max_replicas) == (2, 5)


def test_fab_export_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    playbook = tmp_path / "elastic.yaml"
    playbook.write_text("name: el\nworkdir: w\nentrypoint: python t.py\nnodes: 2:3\n")
    fab = Path(sys.executable).parent / "fab"
    for args, message in (
        (["--image", IMAGE, "--nodes", "1"], "--nodes 1: the playbook says nodes: 2:3"),
        (["--image", IMAGE, "--nodes", "0"], "--nodes: expected 1 to 4096, got 0"),
        (["--image", IMAGE, "--nodes", "-1"], "--nodes: expected 1 to 4096, got -1"),  # issue 32 item 5
        (["--image", IMAGE, "--nodes", "two"], "--nodes: expected a whole number from 1 to 4096"),
        (["--image", IMAGE, "--gpus", "-1"], "--gpus: expected 0 to 1024, got -1"),
        (["--image", "ghcr.io/Lab/Digits:1"], "--image: the repository path must be lowercase"),
    ):
        proc = subprocess.run(
            [str(fab), "export", str(playbook), "--to", "pytorchjob", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith("fleetrun: error: ") and message in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
