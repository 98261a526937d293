"""``fab export --to pytorchjob`` against the Training Operator itself, not only its SDK models
(issue 32, items 1-6): the admission webhook's rules, the Service names its controller makes, and
the exported pod command run as a pod runs it (dash as ``/bin/sh``, the operator's variables for
``Master-0`` and ``Worker-0``).

The webhook's rules are transcribed from kubeflow/training-operator
``pkg/webhooks/pytorch/pytorchjob_webhook.go`` (``validatePyTorchJob``, ``validateSpec``,
``validatePyTorchReplicaSpecs``, releases 1.7-1.9) and ``pkg/webhooks/utils/utils.go``
(``ValidateReplicaSpecs``); the Service names from ``pkg/core/utils.go`` (``GenGeneralName``:
``<job>-<lowercased replica type>-<index>``), each a Kubernetes Service name (a DNS-1035 label).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launch.errors import SpecError
from launch.job.spec import JobSpec
from launch.planning import export_pytorchjob as ex
from tests.conftest import REPO
from tests.test_export import IMAGE, WRAPPER, _playbook, _sagemaker_playbook, operator_env, round_trip

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
REPLICA_TYPES = ("Master", "Worker")
DEFAULT_CONTAINER = "pytorch"


def webhook_errors(manifest: dict[str, Any]) -> list[str]:
    """What the operator's validating webhook refuses in ``manifest`` (field paths as it names
    them); empty when ``kubectl apply`` would be admitted."""
    errors = []
    name = manifest["metadata"]["name"]
    if len(name) > 63 or not DNS1035.fullmatch(name):  # NameIsDNS1035Label
        errors.append(f"metadata.name: {name!r} should match a DNS-1035 label")
    spec = manifest["spec"]
    replicas = spec.get("pytorchReplicaSpecs")
    policy = spec.get("elasticPolicy")
    if policy is not None:
        if "Worker" not in (replicas or {}):
            errors.append("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
        if policy.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append("spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode")
    if replicas is None:
        errors.append("spec.pytorchReplicaSpecs: must be required")
    for rtype, rspec in (replicas or {}).items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in REPLICA_TYPES:
            errors.append(f"{path}: not supported")
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: must be specified")
        for index, container in enumerate(containers):
            if not container.get("image"):
                errors.append(f"{path}.template.spec.containers[{index}].image: must be required")
        if not any(c.get("name") == DEFAULT_CONTAINER for c in containers):
            errors.append(f"{path}.template.spec.containers: must have a container named {DEFAULT_CONTAINER}")
        count = (rspec or {}).get("replicas")
        if rtype == "Master" and count != 1:
            errors.append(f"{path}.replicas: must be 1")
        elif rtype != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: must be at least 1")
    return errors


def controller_services(manifest: dict[str, Any]) -> list[str]:
    """The Services the controller makes for the job, one per pod (``GenGeneralName``)."""
    name = manifest["metadata"]["name"]
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    return [f"{name}-{rtype.lower()}-{i}" for rtype, r in replicas.items() for i in range(r["replicas"])]


def exports(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Manifests of every shape the export makes: fixed, one node, elastic, SageMaker-style, CPU."""
    plain = _playbook(tmp_path)
    sagemaker = _sagemaker_playbook(tmp_path)
    return {
        "fixed": ex.export_pytorchjob(plain, IMAGE).manifest,
        "single": ex.export_pytorchjob(plain, IMAGE, nodes=1).manifest,
        "elastic": ex.export_pytorchjob(
            plain.model_copy(update={"min_nodes": 2, "nodes": 4}), IMAGE
        ).manifest,
        "sagemaker": ex.export_pytorchjob(sagemaker, IMAGE, gpus_per_node=0).manifest,
        "elastic-sagemaker": ex.export_pytorchjob(
            sagemaker.model_copy(update={"min_nodes": 2}), IMAGE
        ).manifest,
    }


def test_the_webhook_admits_every_export_shape(tmp_path: Path) -> None:
    for shape, manifest in exports(tmp_path).items():
        assert webhook_errors(manifest) == [], shape
        for service in controller_services(manifest):
            assert len(service) <= 63 and DNS1035.fullmatch(service), (shape, service)
        round_trip(manifest)  # and the SDK's models still read it


def test_the_rules_here_refuse_what_the_webhook_refuses(tmp_path: Path) -> None:
    """The transcription bites: the pair the old export wrote, a digit-first name, two masters."""
    elastic = exports(tmp_path)["elastic"]
    old = json.loads(json.dumps(elastic))
    old["spec"]["elasticPolicy"]["nProcPerNode"] = 2  # what every elastic export held before item 1
    assert webhook_errors(old) == ["spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode"]
    fixed = json.loads(json.dumps(exports(tmp_path)["fixed"]))
    fixed["metadata"]["name"] = "7b-sft"
    fixed["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    assert len(webhook_errors(fixed)) == 2


@pytest.mark.parametrize("name", ["7b-sft", "-sft", "sft-", "Sft"])
def test_a_name_the_operator_refuses_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """Item 2: a DNS-1035 label (a letter first), checked as the webhook checks it."""
    with pytest.raises(SpecError, match=r"is not a DNS-1035 label") as caught:
        ex.export_pytorchjob(_playbook(tmp_path), IMAGE, name=name)
    assert "\n" not in str(caught.value) and "--set name=" in str(caught.value)


def test_the_playbooks_name_is_checked_too_and_set_renames(tmp_path: Path) -> None:
    spec = _playbook(tmp_path).model_copy(update={"name": "7b-sft"})  # a valid fleetrun slug
    with pytest.raises(SpecError, match="'7b-sft' is not a DNS-1035 label"):
        ex.export_pytorchjob(spec, IMAGE)
    renamed = ex.export_pytorchjob(spec.model_copy(update={"name": "sft-7b"}), IMAGE).manifest
    assert renamed["metadata"]["name"] == "sft-7b" and webhook_errors(renamed) == []


def test_a_name_whose_services_exceed_63_characters_is_refused(tmp_path: Path) -> None:
    """Item 3: the operator names each pod's Service ``<job>-<type>-<index>``; one over 63
    characters is never created, so MASTER_ADDR never resolves. The longest fitting name passes."""
    spec = _playbook(tmp_path)  # 3 nodes: tiny-master-0, tiny-worker-0, tiny-worker-1
    longest_ok = "a" * (63 - len("-worker-1"))
    manifest = ex.export_pytorchjob(spec, IMAGE, name=longest_ok).manifest
    assert max(len(s) for s in controller_services(manifest)) == 63 and webhook_errors(manifest) == []
    with pytest.raises(SpecError) as caught:
        ex.export_pytorchjob(spec, IMAGE, name=longest_ok + "a")
    message = str(caught.value)
    assert "\n" not in message and "(64 characters; Kubernetes allows 63)" in message
    assert f"at most {len(longest_ok)} characters" in message
    # 12 nodes: worker-10 is the longest Service name
    with pytest.raises(SpecError, match=r"-worker-10' \(64 characters"):
        ex.export_pytorchjob(spec, IMAGE, nodes=12, name="b" * 54)


def test_fab_export_refuses_a_digit_first_playbook_name(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    playbook = tmp_path / "sft.yaml"
    playbook.write_text("name: 7b-sft\nworkdir: w\nentrypoint: python t.py\nnodes: 2\n")
    fab = Path(sys.executable).parent / "fab"
    argv = [str(fab), "export", str(playbook), "--image", IMAGE]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "'7b-sft' is not a DNS-1035 label" in proc.stderr
    renamed = subprocess.run(
        [*argv, "--set", "name=sft-7b"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert renamed.returncode == 0, renamed.stderr
    assert "name: sft-7b" in renamed.stdout


# ------------------------------------------------------------------ a pod, as the operator starts it

TORCHRUN_STANDIN = """#!{python}
# `python` on the pod's PATH: records what `python -m torch.distributed.run` would start with (its
# environment, which torchrun passes on to every worker, and its arguments); any other use of
# python is the real one (the entry wrapper's `python -m fleetrun_sagemaker`).
import json, os, sys
if sys.argv[1:3] == ["-m", "torch.distributed.run"]:
    with open(os.environ["SEEN_BY_TORCHRUN"], "w") as handle:
        json.dump({{"env": dict(os.environ), "argv": sys.argv[3:]}}, handle)
    sys.exit(0)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def dash() -> str:
    found = shutil.which("dash")
    assert found, "dash (Debian's /bin/sh, as in the image) is needed: apt-get install dash (make setup does)"
    return found


def run_pod(
    tmp_path: Path, manifest: dict[str, Any], replica: str, pod: str, operator: dict[str, str]
) -> dict:
    """The manifest's container command for ``replica``, run by dash with the manifest's env plus
    the operator's for this pod (paths of the image moved under ``tmp_path``); what torchrun got."""
    container = manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]
    root = tmp_path / pod
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    standin = bin_dir / "python"
    standin.write_text(TORCHRUN_STANDIN.format(python=sys.executable))
    standin.chmod(0o755)

    def moved(text: str) -> str:
        text = text.replace(ex.POD_ENV_SCRIPT, str(WRAPPER))
        for path in (ex.POD_RUN_DIR, ex.POD_DATA_DIR):
            text = text.replace(path, str(root) + path)
        return text

    env = {e["name"]: moved(e["value"]) for e in container["env"]}
    env |= operator | {
        "PYTHONUNBUFFERED": "0",  # the operator sets it too
        "HOSTNAME": pod,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "launch" / "nodelib"),
        "SEEN_BY_TORCHRUN": str(root / "seen.json"),
    }
    command = [moved(word) for word in container["command"]]
    assert command[:2] == ["sh", "-c"]
    proc = subprocess.run(
        [dash(), *command[1:]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((root / "seen.json").read_text())
    seen["root"] = str(root)
    return seen


def test_the_exported_pods_run_under_dash_with_the_operators_variables(tmp_path: Path) -> None:
    """Item 4 and 6: Master-0 and Worker-0 of a 3-node job, each started as the operator starts it;
    the SM_* names with '-' reach the training processes, SM_TRAINING_ENV's channel folders are
    filled, each pod knows its own rank, and the AIP_* folders exist before the script (item 8)."""
    spec: JobSpec = _sagemaker_playbook(tmp_path)
    manifest = ex.export_pytorchjob(spec, IMAGE, gpus_per_node=0).manifest
    assert webhook_errors(manifest) == []
    pods = {
        "smexport-master-0": ("Master", operator_env("smexport", "master", 0, 3)),
        "smexport-worker-0": ("Worker", operator_env("smexport", "worker", 0, 3)),
    }
    seen = {pod: run_pod(tmp_path, manifest, replica, pod, env) for pod, (replica, env) in pods.items()}
    for pod, got in seen.items():
        env = got["env"]
        assert env["SM_HP_BATCH-SIZE"] == "32", f"{pod}: dropped by dash on the way"
        assert env["SM_CHANNEL_TEST-SET"] == got["root"] + "/fleetrun/data/test-set"
        training = json.loads(env["SM_TRAINING_ENV"])
        assert training["channel_input_dirs"] == {
            "training": "/datasets/train",
            "validation": got["root"] + "/fleetrun/data/validation",
            "test-set": got["root"] + "/fleetrun/data/test-set",
        }, pod
        assert training["hyperparameters"]["batch-size"] == 32
        assert env["PET_NNODES"] == "3" and env["MASTER_ADDR"] == "smexport-master-0"
        assert os.path.isdir(env["AIP_CHECKPOINT_DIR"]) and os.path.isdir(env["AIP_TENSORBOARD_LOG_DIR"])
        assert os.path.isdir(env["FLEETRUN_OUTPUT_DIR"]) and os.path.isdir(env["FLEETRUN_JOB_DIR"])
        assert got["argv"][:2] == [f"--max-restarts={ex.torchrun_restarts(spec)}", "train.py"]
        assert got["argv"][-2:] == ["--job-dir", env["FLEETRUN_JOB_DIR"]], "expanded by the pod's shell"
    master, worker = (seen[p]["env"] for p in pods)
    assert (master["FLEETRUN_NODE_RANK"], worker["FLEETRUN_NODE_RANK"]) == ("0", "1")
    assert (master["SM_CURRENT_HOST"], worker["SM_CURRENT_HOST"]) == ("algo-1", "algo-2")
    assert json.loads(master["SM_TRAINING_ENV"])["is_master"] is True
    assert json.loads(worker["SM_TRAINING_ENV"])["is_master"] is False
