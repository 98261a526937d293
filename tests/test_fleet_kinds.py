"""Fleet kinds: trusted and untrusted inventories, per-kind hooks and uploads, the teardown decision,
and no kind or cloud switch outside ``launch/fleets/kinds``. Pure, no root."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from launch.cli import app
from launch.errors import FleetrunError, SpecError
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.base import TeardownState
from launch.fleets.kinds.refs import LabFleet, LocalFleetRef, StackFleetRef
from launch.fleets.kinds.registry import fleet_kind
from launch.fleets.select import load_inventory
from launch.job.inventory import Inventory
from launch.run.summary import TeardownAction, decide_teardown
from tests.fakefleet import fake_inventory

REPO = Path(__file__).resolve().parent.parent


def lab_yaml(tmp_path: Path, extra: dict[str, object] | None = None) -> Path:
    data: dict[str, object] = {
        "hosts": [h.model_dump(mode="json", exclude_none=True) for h in fake_inventory(2).hosts],
        **(extra or {}),
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_lab_inventory_is_always_a_lab_fleet(tmp_path: Path) -> None:
    inventory = load_inventory(str(lab_yaml(tmp_path)))
    assert inventory.fleet == LabFleet() and [h.name for h in inventory.hosts] == ["n0", "n1"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("teardown", "pulumi-stack"),
        ("stack", "prod"),
        ("cluster_id", "gpu"),
        ("bucket", "b"),
        ("cloud", "aws"),
        ("fleet", {"kind": "local", "prefix": "gpu"}),
    ],
)
def test_lab_inventory_refuses_fleet_keys(tmp_path: Path, key: str, value: object) -> None:
    path = lab_yaml(tmp_path, {key: value})
    with pytest.raises(SpecError) as info:
        load_inventory(str(path))
    message = str(info.value)
    assert (
        message.startswith(f"{path}: field {key!r}: not allowed in a lab inventory") and "\n" not in message
    )


def test_copy_of_the_local_fleets_inventory_is_refused_as_a_lab_template(tmp_path: Path) -> None:
    own = fake_inventory(2, fleet=LocalFleetRef(prefix="fr"))
    copy = tmp_path / "copied.yaml"
    copy.write_text(yaml.safe_dump(own.to_yaml_data(), sort_keys=False))  # as LocalFleet.up writes it
    with pytest.raises(SpecError, match=rf"{re.escape(str(copy))}: field 'fleet': not allowed"):
        load_inventory(str(copy))
    playbook = tmp_path / "job.yaml"
    playbook.write_text(yaml.safe_dump({"name": "j", "workdir": str(tmp_path), "entrypoint": "python t.py"}))
    with pytest.raises(SpecError, match="not allowed in a lab inventory"):
        app.train(playbook, inventory=str(copy), dry_run=True)


def test_local_selector_reads_only_the_fleets_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))
    state = tmp_path / "localfleet" / "ab"
    state.mkdir(parents=True)
    own = fake_inventory(2, fleet=LocalFleetRef(prefix="ab"))
    (state / "inventory.yaml").write_text(yaml.safe_dump(own.to_yaml_data(), sort_keys=False))
    assert load_inventory("local:ab").fleet == LocalFleetRef(prefix="ab")
    other = fake_inventory(2, fleet=LocalFleetRef(prefix="zz"))
    (state / "inventory.yaml").write_text(yaml.safe_dump(other.to_yaml_data(), sort_keys=False))
    with pytest.raises(FleetrunError, match="does not describe local fleet 'ab'"):
        load_inventory("local:ab")


def test_kinds_hooks_and_uploads() -> None:
    lab = fleet_kind(LabFleet())
    local = fleet_kind(LocalFleetRef(prefix="fr"))
    aws = fleet_kind(StackFleetRef(cluster_id="c", cloud="aws", bucket="bkt"))
    gcp = fleet_kind(StackFleetRef(cluster_id="c", cloud="gcp", bucket="bkt"))
    bucketless = fleet_kind(StackFleetRef(cluster_id="c", cloud="aws"))
    assert not lab.can_power_off and "shutdown" not in lab.poweroff_hook()
    assert "poweroff-request" in local.poweroff_hook()
    assert aws.poweroff_hook() == CLOUDS["aws"].poweroff_hook() and "shutdown -h now" in aws.poweroff_hook()
    assert gcp.poweroff_hook() == CLOUDS["gcp"].poweroff_hook() and "instances/" in gcp.poweroff_hook()
    assert lab.bucket_upload_argv("d") is None and local.bucket_upload_argv("d") is None
    assert bucketless.bucket_upload_argv("d") is None
    assert aws.bucket_upload_argv("runs/r/n") == [
        "aws",
        "s3",
        "sync",
        "--only-show-errors",
        "{src}",
        "s3://bkt/runs/r/n",
    ]
    assert gcp.bucket_upload_argv("runs/r/n") == [
        "gcloud",
        "storage",
        "rsync",
        "--recursive",
        "{src}",
        "gs://bkt/runs/r/n",
    ]
    assert aws.tags() == {"fleetrun:cluster": "c"} and gcp.tags() == {"fleetrun-cluster": "c"}
    assert lab.tear_down(print).state is TeardownState.KEPT


@pytest.mark.parametrize(
    ("fleet", "marker"),
    [
        (LabFleet(), "not powered off"),
        (LocalFleetRef(prefix="fr"), "poweroff-request"),
        (StackFleetRef(cluster_id="c", cloud="gcp"), "shutdown -h now"),
    ],
)
def test_plan_installs_the_kinds_poweroff_hook(tmp_path: Path, fleet: object, marker: str) -> None:
    from launch.job.spec import JobSpec

    spec = JobSpec(name="j", workdir=tmp_path, entrypoint="python t.py", nodes=2, procs_per_node=1)
    plan = app.make_plan(spec, fake_inventory(2, fleet=fleet), run_id="r")
    hooks = {f.content for node in plan.nodes for f in node.files if f.path.endswith("poweroff")}
    assert len(hooks) == 1 and marker in hooks.pop()


def test_inventory_fleet_reference_is_typed_and_frozen() -> None:
    with pytest.raises(ValueError):
        Inventory.model_validate({**fake_inventory(1).to_yaml_data(), "fleet": {"kind": "pulumi-stack"}})
    with pytest.raises(ValueError):
        LocalFleetRef(prefix="../etc")
    ref = LocalFleetRef(prefix="fr")
    with pytest.raises(ValueError):
        ref.prefix = "zz"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("policy", "outcome", "pull", "stop", "applies", "action"),
    [
        ("always", "failed", {}, {}, True, TeardownAction.TEAR_DOWN),
        ("on_success", "succeeded", {}, {}, True, TeardownAction.TEAR_DOWN),
        ("on_success", "failed", {}, {}, True, TeardownAction.SKIP),
        ("never", "succeeded", {}, {}, True, TeardownAction.SKIP),
        ("always", "succeeded", {"n1": "rsync failed"}, {}, True, TeardownAction.BLOCK),
        ("always", "stopped", {}, {"n0": "timeout"}, True, TeardownAction.BLOCK),
        ("always", "stopped", {}, {}, False, TeardownAction.NOT_REQUESTED),
        ("always", None, {}, {}, True, TeardownAction.SKIP),
    ],
)
def test_decide_teardown(
    policy: str, outcome: str | None, pull: dict, stop: dict, applies: bool, action: TeardownAction
) -> None:
    decision = decide_teardown(policy, outcome, pull, stop, applies=applies)
    assert decision.action is action
    if action is TeardownAction.BLOCK:
        assert decision.outcome().blocked and sorted({*pull, *stop})[0] in decision.reason


FORBIDDEN = re.compile(
    r'"local-fleet"|"pulumi-stack"|teardown ==|cloud or "aws"|cloud ==|POWEROFF_HOOKS|\.teardown\.startswith'
)


def test_no_kind_or_cloud_switch_outside_the_kind_modules() -> None:
    offenders = []
    for path in sorted((REPO / "launch").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        # nodelib's upload still picks its CLI by cloud until it reads guard.json's upload_argv
        if rel.startswith(("launch/fleets/kinds/", "launch/nodelib/")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []


def test_the_registry_tables_name_each_kind_by_its_own_name() -> None:
    """The registry names modules and attributes (imported on first use): each entry must be the
    kind, selector or loader it says, so a renamed kind cannot go stale in the table."""
    from launch.fleets.kinds import lab, local, registry, slurm, stack

    classes = {lab.LabKind.name: lab.LabKind, local.LocalFleetKind.name: local.LocalFleetKind}
    classes[stack.StackKind.name] = stack.StackKind
    classes[slurm.SlurmKind.name] = slurm.SlurmKind
    assert {name: registry.resolve(entry) for name, entry in registry.KINDS.items()} == classes
    assert registry.resolve(registry.SELECTORS[local.SELECTOR]) is local.load_local_inventory
    assert registry.resolve(registry.SELECTORS[stack.SELECTOR]) is stack.load_stack_inventory
    assert registry.resolve(registry.SELECTORS[slurm.SELECTOR]) is slurm.load_slurm_inventory
    assert set(registry.SELECTORS) == {local.SELECTOR, stack.SELECTOR, slurm.SELECTOR}
    assert registry.resolve(registry.FILE_LOADERS[stack.OUTPUTS_SUFFIX]) is stack.load_outputs_file
    assert registry.resolve(registry.LAB_LOADER) is lab.load_lab_inventory


def test_every_registered_kind_answers_every_question_of_the_fleet_kind_interface() -> None:
    """The kinds are built by name from the registry (``fleet_kind`` returns them untyped to mypy):
    a kind lacking a member of ``FleetKind`` (the Slurm kind once lacked ``lifetime``) would fail
    only when a run reached that call."""
    from launch.fleets.kinds import registry
    from launch.fleets.kinds.base import FleetKind

    members = {
        name
        for name in vars(FleetKind)
        if not name.startswith("_")
        and (callable(getattr(FleetKind, name)) or name in FleetKind.__annotations__)
    }
    assert {"lifetime", "acquire", "release", "tear_down", "bucket_commands"} <= members
    missing = {
        kind: sorted(name for name in members if not hasattr(registry.resolve(entry), name))
        for kind, entry in registry.KINDS.items()
    }
    assert all(not names for names in missing.values()), missing


def test_fab_exec_on_a_local_fleet_imports_no_other_kind() -> None:
    """``fab exec --inventory local:...`` loads the local kind only: not the stack kind with its
    clouds and the node protocol's models, nor the launch pipeline (its start-up is its cost)."""
    import subprocess
    import sys

    code = (
        "import sys; import launch.cli.tasks, launch.fleets.select, launch.transport.run_everywhere; "
        "import launch.fleets.kinds.local; "
        "print(' '.join(m for m in sorted(sys.modules) if m.startswith(("
        "'launch.fleets.kinds.stack', 'launch.fleets.kinds.lab', 'launch.fleets.clouds', "
        "'launch.nodelib', 'launch.run', 'launch.cli.app', 'matplotlib', 'boto3', 'pulumi'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""
