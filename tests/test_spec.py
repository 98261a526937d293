"""Playbook validation: every broken file gets an error naming the file, the field and the expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.errors import SpecError
from launch.job.spec import load_job_spec

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


GOOD = """
name: demo
workdir: code
entrypoint: python -m trainer.task --epochs 3
nodes: 2
"""


def test_example_playbook_loads() -> None:
    spec = load_job_spec(REPO / "playbooks" / "digits-ddp.yaml")
    assert spec.name == "digits-ddp"
    assert spec.launcher == "torchrun"
    assert spec.workdir == (REPO / "examples" / "digits").resolve()
    assert spec.procs_per_node == "auto"


def test_good_minimal_playbook(tmp_path: Path) -> None:
    spec = load_job_spec(write(tmp_path, GOOD))
    assert spec.nodes == 2
    assert spec.workdir == (tmp_path / "code").resolve()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: demo\nworkdir: code\nnodes: 2\n", "field 'entrypoint': this field is required"),
        (GOOD.replace("nodes: 2", "nodes: three"), "field 'nodes': "),
        (
            GOOD + "launcher: mpirun\n",
            "field 'launcher': expected one of 'torchrun' or 'horovod', got 'mpirun'",
        ),
        (
            GOOD.replace("nodes: 2", "nodes: 0"),
            "field 'nodes': expected a value greater than or equal to 1, got 0",
        ),
        (GOOD.replace("workdir: code", "workdir: nowhere"), "field 'workdir': directory"),
        (GOOD + "nodez: 3\n", "field 'nodez': unknown field"),
        (GOOD + "procs_per_node: 0\n", "field 'procs_per_node'"),
        (GOOD + "env:\n  1BAD: x\n", "field 'env'"),
        (
            GOOD.replace("name: demo", "name: Demo Job"),
            "field 'name': expected a lowercase slug",
        ),
        (GOOD + "outputs: ../../etc\n", "field 'outputs'"),
        (GOOD + "entrypoint2: x\nrequirements: missing.txt\n", "field 'entrypoint2'"),
        (GOOD + "requirements: missing.txt\n", "field 'requirements': missing.txt not found"),
        ("name: demo\n  workdir: [\n", "not valid YAML (line"),
        ("- just\n- a list\n", "expected a mapping of fields"),
    ],
)
def test_broken_playbook_names_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_job_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_missing_playbook_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="playbook file not found"):
        load_job_spec(tmp_path / "nope.yaml")


def test_setup_hash_tracks_setup_and_requirements_only(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "req.txt").write_text("numpy\n")
    base = load_job_spec(write(tmp_path, GOOD + "requirements: req.txt\nsetup: [echo one]\n"))
    before = base.setup_hash("python3")
    same = load_job_spec(
        write(tmp_path, GOOD + "requirements: req.txt\nsetup: [echo one]\n" + "env: {A: b}\n")
    )
    changed_setup = load_job_spec(write(tmp_path, GOOD + "requirements: req.txt\nsetup: [echo two]\n"))
    assert same.setup_hash("python3") == before, "env is not part of setup"
    assert changed_setup.setup_hash("python3") != before
    assert base.setup_hash("/usr/bin/python3.12") != before
    (tmp_path / "code" / "req.txt").write_text("numpy==2.0\n")
    assert base.setup_hash("python3") != before, "requirements contents are part of setup"


def test_secret_values_by_name_pattern_or_listing(tmp_path: Path) -> None:
    spec = load_job_spec(
        write(
            tmp_path,
            GOOD
            + "env: {HF_TOKEN: a, aws_secret_access_key: b, DB_PASSWORD: c, GCP_CREDENTIALS: d,"
            + " DB_URL: e, OMP_NUM_THREADS: '1'}\nsecret_env: [DB_URL]\n",
        )
    )
    assert spec.secret_values() == {
        "HF_TOKEN": "a",
        "aws_secret_access_key": "b",
        "DB_PASSWORD": "c",
        "GCP_CREDENTIALS": "d",
        "DB_URL": "e",
    }


@pytest.mark.parametrize(
    ("entrypoint", "operator"),
    [
        ("python t.py | tee log", "|"),
        ("python t.py |& tee log", "|"),
        ("a && b", "&&"),
        ("a; b", ";"),
        ("a & b", "&"),
        ("a &> log", "&"),
        ("(a)", "("),
        ('python t.py "$(echo x)" ; b', ";"),
    ],
)
def test_control_operators_found_outside_quotes(entrypoint: str, operator: str) -> None:
    from launch.job.shell_text import control_operators

    assert control_operators(entrypoint)[0] == operator


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ('"3:2"', "field 'nodes': MIN:MAX needs 1 <= MIN <= MAX, got 3:2"),
        ("3:2", "field 'nodes': MIN:MAX needs 1 <= MIN <= MAX, got 3:2"),
        ("0:2", "field 'nodes': MIN:MAX needs 1 <= MIN <= MAX, got 0:2"),
        ("2\nmin_nodes: 3", "field 'min_nodes': expected at most nodes (2), got 3"),
        ("2:3\nmin_nodes: 2", "field 'min_nodes': give either nodes: MIN:MAX or min_nodes, not both"),
    ],
)
def test_elastic_nodes_errors_name_the_field_the_user_wrote(
    tmp_path: Path, nodes: str, expected: str
) -> None:
    """``nodes: 3:2`` named ``min_nodes`` (never written) and said "got" twice."""
    path = write(tmp_path, GOOD.replace("nodes: 2", f"nodes: {nodes}"))
    with pytest.raises(SpecError) as info:
        load_job_spec(path)
    message = str(info.value)
    assert message == f"{path}: {expected}", message
    assert message.count(", got ") <= 1 and "(top level)" not in message


# -- issue 24, item 9: a playbook sends only its own tree's files -----------------------------------


def _outside_playbook(tmp_path: Path, **fields: str | dict[str, object]) -> Path:
    (tmp_path / "laptop-secrets").mkdir()
    (tmp_path / "proj" / "code").mkdir(parents=True)
    import yaml

    data: dict[str, object] = {"name": "demo", "workdir": "code", "entrypoint": "python t.py", "nodes": 2}
    data.update(fields)
    path = tmp_path / "proj" / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"workdir": "../laptop-secrets"}, "workdir"),
        ({"channels": {"test": {"local": "../laptop-secrets"}}}, "channels.test.local"),
    ],
)
def test_a_playbook_may_not_send_files_outside_its_tree(
    tmp_path: Path, fields: dict[str, object], field: str
) -> None:
    path = _outside_playbook(tmp_path, **fields)  # type: ignore[arg-type]
    outside = tmp_path / "laptop-secrets"
    with pytest.raises(
        SpecError, match=rf"field '{field}': {outside} is outside the playbook's tree"
    ) as info:
        load_job_spec(path)
    assert f"--allow-path {outside}" in str(info.value)
    # named on the command line, it is the user's choice
    spec = load_job_spec(path, allowed=(outside,))
    assert spec.workdir == outside or spec.channels["test"].local == str(outside)


def test_the_playbooks_tree_is_its_git_checkout(tmp_path: Path) -> None:
    """playbooks/job.yaml with workdir: ../src in one repository is its own tree (as the built-ins)."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    (tmp_path / "repo" / "playbooks").mkdir()
    path = tmp_path / "repo" / "playbooks" / "job.yaml"
    path.write_text("name: demo\nworkdir: ../src\nentrypoint: python t.py\nnodes: 2\n")
    assert load_job_spec(path).workdir == tmp_path / "repo" / "src"
    (tmp_path / "other").mkdir()
    path.write_text("name: demo\nworkdir: ../../other\nentrypoint: python t.py\nnodes: 2\n")
    with pytest.raises(SpecError, match="outside the playbook's tree"):
        load_job_spec(path)


def test_the_dry_run_names_the_workdir_it_would_send(tmp_path: Path) -> None:
    from launch.cli.app import make_plan
    from launch.job.inventory import Host, Inventory
    from tests.conftest import SAMPLE_HOST_KEYS

    spec = load_job_spec(write(tmp_path, GOOD))
    hosts = [
        Host(name=f"n{i}", address=f"10.0.0.{i + 1}", user="u", host_key=SAMPLE_HOST_KEYS[i])
        for i in range(2)
    ]
    text = make_plan(spec, Inventory(hosts=hosts), run_id="r", dry_run=True).render()
    assert (
        f"# sends: workdir {tmp_path / 'code'} on this machine, to ~/.fleetrun/work/demo on every node"
        in text
    )


@pytest.mark.parametrize(
    ("sections", "field", "other"),
    [
        (
            "recovery: {max_restarts: 1, on: [gpu_fault]}\nstop: {gpu_fault: false}",
            "recovery.on",
            "stop.gpu_fault",
        ),
        ("recovery: {max_restarts: 1, on: [straggler]}", "recovery.on", "stop.straggler"),
        (
            "recovery: {max_restarts: 1, on: [straggler]}\nstop: {straggler: {action: warn}}",
            "recovery.on",
            "stop.straggler",
        ),
        ("recovery: {max_restarts: 2, on: []}", "recovery.max_restarts", "recovery.on"),
        ("stop: {plateau_min_delta: 0.1}", "stop.plateau_min_delta", "stop.plateau_patience"),
        ("stop: {plateau_unit: records}", "stop.plateau_unit", "stop.plateau_patience"),
        ("stop: {gpu_idle_percent: 20}", "stop.gpu_idle_percent", "stop.gpu_idle_timeout_s"),
        ("stop: {max_cost_usd: 5, price_per_node_hour: 0}", "stop.max_cost_usd", "stop.price_per_node_hour"),
        ("keep_warm_s: 600\nteardown: never", "keep_warm_s", "teardown"),
        ("recovery: {on: [node_lost, gpu_fault]}", "recovery.on", "recovery.max_restarts"),
    ],
)
def test_settings_that_cannot_take_effect_together_are_one_line_naming_both(
    tmp_path: Path, sections: str, field: str, other: str
) -> None:
    with pytest.raises(SpecError) as caught:
        load_job_spec(write(tmp_path, GOOD + sections + "\n"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'job.yaml'}: field '{field}': ") and f"field '{other}'" in message


@pytest.mark.parametrize(
    "sections",
    [
        "recovery: {max_restarts: 1, on: [gpu_fault]}",  # the rule is on by default
        "recovery: {max_restarts: 1, on: [straggler]}\nstop: {straggler: {action: exclude}}",
        "stop: {gpu_fault: false}",  # the default recovery.on does not list gpu_fault
        "stop: {plateau_patience: 5, plateau_min_delta: 0.1, plateau_unit: records}",
        "stop: {gpu_idle_percent: 20, gpu_idle_timeout_s: 600}",
        "stop: {max_cost_usd: 5, price_per_node_hour: 2.5}",
        "keep_warm_s: 600\nteardown: on_success",
        "recovery: {max_restarts: 0, on: [node_lost]}",  # written off on purpose
        "recovery: {max_restarts: 2}",  # the default losses
    ],
)
def test_settings_that_work_together_are_accepted(tmp_path: Path, sections: str) -> None:
    load_job_spec(write(tmp_path, GOOD + sections + "\n"))


def test_a_set_that_makes_settings_agree_is_accepted(tmp_path: Path) -> None:
    from launch.job.overrides import parse_overrides

    path = write(tmp_path, GOOD + "recovery: {max_restarts: 1, on: [gpu_fault]}\nstop: {gpu_fault: false}\n")
    spec = load_job_spec(path, parse_overrides(["stop.gpu_fault=true"]))
    assert spec.stop.gpu_fault and spec.recovery.on == ["gpu_fault"]
