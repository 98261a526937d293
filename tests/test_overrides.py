"""``--set key=value`` (``launch.job.overrides``): every kind of playbook field, bad keys and bad
values (one line, exit 2, naming the ``--set``), and the run record that remembers them.

The unit tests read playbooks through ``load_job_spec`` (no fleet); the CLI tests run the real
``fab plan`` against an inventory file (it connects to nothing); one run on the session's local
fleet checks that the overrides reach the nodes and are recorded and shown.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launch.errors import SpecError
from launch.job.overrides import apply_overrides, blamed, overrides_record, parse_override, parse_overrides
from launch.job.spec import load_job_spec
from launch.reports.compare import ComparedRun, RunMetrics, compare_rows, compare_table
from launch.reports.views import show_run
from launch.run.records import RunRecords
from tests.conftest import REPO, SAMPLE_HOST_KEYS, STEPS_JOB, TEST_PREFIX, fab, needs_root, write_playbook


def _spec(tmp_path: Path, *sets: str, **fields: object):  # type: ignore[no-untyped-def]
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    playbook = write_playbook(tmp_path / "job.yaml", workdir, **fields)
    return load_job_spec(playbook, parse_overrides(sets))


def test_every_kind_of_field(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    spec = _spec(
        tmp_path,
        "nodes=2",  # integer
        "procs_per_node=4",  # integer or 'auto'
        "launcher=torchrun",  # literal
        "entrypoint=python -m trainer.task --epochs 1",  # string
        "setup=[echo one, echo two]",  # list
        "env.NCCL_DEBUG=INFO",  # mapping entry (a string, always)
        "env.SEED=7",
        "stop.max_wall_time_s=600",  # nested model, a mapping the file did not have
        "stop.nan_loss=false",  # boolean
        "teardown=on_success",  # enum
        "hyperparameters.lr=0.01",  # float hyperparameter
        "hyperparameters.arch=mlp",  # string hyperparameter
        "rdzv_port=29555",
        "workdir=other",  # a path: relative to the playbook, like the file's
        "data_dir=",  # YAML null: the field's default
    )
    assert spec.nodes == 2 and spec.procs_per_node == 4 and spec.launcher == "torchrun"
    assert spec.entrypoint == "python -m trainer.task --epochs 1"
    assert spec.setup == ["echo one", "echo two"]
    assert spec.env == {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO", "SEED": "7"}, "env values stay text"
    assert spec.stop.max_wall_time_s == 600 and spec.stop.nan_loss is False
    assert spec.teardown.value == "on_success"
    assert spec.hyperparameters == {"lr": 0.01, "arch": "mlp"}
    assert spec.rdzv_port == 29555 and spec.data_dir is None
    assert spec.workdir == (tmp_path / "other").resolve()


def test_elastic_nodes_and_a_later_set_of_one_key_wins(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "nodes=2:3")
    assert (spec.min_nodes, spec.nodes) == (2, 3)
    items = parse_overrides(["nodes=2", "nodes=1"])
    assert overrides_record(items) == {"nodes": 1}
    assert _spec(tmp_path, "nodes=2", "nodes=1").nodes == 1


def test_the_file_is_left_as_it_was(tmp_path: Path) -> None:
    data = {"stop": {"nan_loss": True}, "nodes": 3}
    out = apply_overrides(data, parse_overrides(["stop.max_wall_time_s=5", "nodes=1"]), "job.yaml")
    assert data == {"stop": {"nan_loss": True}, "nodes": 3}
    assert out == {"stop": {"nan_loss": True, "max_wall_time_s": 5}, "nodes": 1}


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("nodez=2", "--set nodez=2: field 'nodez': unknown field"),
        ("stop.max_wall_clock=5", "--set stop.max_wall_clock=5: field 'stop.max_wall_clock': unknown field"),
        ("nodes=zero", "--set nodes=zero: field 'nodes': input should be a valid integer, got 'zero'"),
        ("nodes=0", "--set nodes=0: field 'nodes': expected a value greater than or equal to 1, got 0"),
        ("teardown=sometimes", "--set teardown=sometimes: field 'teardown': expected one of always"),
        ("stop.max_wall_time_s=-5", "--set stop.max_wall_time_s=-5: field 'stop.max_wall_time_s'"),
        ("env.1A=x", "--set env.1A=x: field 'env': '1A' is not a valid environment variable name"),
        ("nodes.x=1", "--set nodes.x=1: field 'nodes' holds int 3, not a mapping of fields"),
        ("hyperparameters.api_token=x", "--set hyperparameters.api_token=x: field 'hyperparameters'"),
    ],
)
def test_a_bad_key_or_value_names_the_file_the_set_and_the_field(
    tmp_path: Path, item: str, expected: str
) -> None:
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, item)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'job.yaml'}: {expected}"), message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("nodes", "expected key=value"),
        ("=2", "expected key=value"),
        ("a..b=1", "expected a field name or a dotted path"),
        ("a.b.c.d.e=1", "expected a field name or a dotted path"),
        ("no\x1bes=1", "expected a field name or a dotted path"),
        ("nodes=[", "--set nodes: not valid YAML"),
    ],
)
def test_a_malformed_set_is_refused_before_the_playbook_is_read(item: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_override(item)
    assert expected in str(err.value) and "\x1b" not in str(err.value)


def test_an_error_is_blamed_on_the_set_at_above_or_under_its_field() -> None:
    items = parse_overrides(["stop.max_wall_time_s=1", "env.X=1"])
    assert blamed(("stop", "max_wall_time_s"), items) is items[0]
    assert blamed(("stop",), items) is items[0]
    assert blamed(("env",), items) is items[1]
    assert blamed(("nodes",), items) is None and blamed(("stopx",), items) is None


def test_too_many_sets() -> None:
    with pytest.raises(SpecError, match="at most 64"):
        parse_overrides([f"env.V{i}=1" for i in range(65)])


def test_the_record_keeps_them_and_show_and_compare_print_them(tmp_path: Path) -> None:
    with RunRecords(tmp_path / "r.db") as db:
        db.start(run_id="a", overrides={"nodes": 2, "hyperparameters.lr": 0.01})
        db.start(run_id="b")
        a, b = db.get("a"), db.get("b")
    assert a is not None and b is not None
    assert a.overrides == {"nodes": 2, "hyperparameters.lr": 0.01} and b.overrides == {}
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(show_run(a))
    assert "nodes=2 hyperparameters.lr=0.01" in console.export_text()
    runs = [ComparedRun(a, RunMetrics()), ComparedRun(b, RunMetrics())]
    console.print(compare_table(runs))
    text = console.export_text()
    assert "--set" in text and "nodes=2 hyperparameters.lr=0.01" in text
    assert compare_rows(runs)[0]["overrides"] == {"nodes": 2, "hyperparameters.lr": 0.01}


# ------------------------------------------------------------------ the real command line


def _inventory(path: Path) -> Path:
    hosts = [
        {"name": f"n{i}", "address": f"203.0.113.{i + 1}", "user": "u", "host_key": SAMPLE_HOST_KEYS[i]}
        for i in range(3)
    ]
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def test_fab_plan_doctor_and_export_take_set(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "inv.yaml")
    playbook = str(REPO / "playbooks" / "digits-ddp.yaml")
    home = tmp_path / "home"
    ok = fab(
        "plan", playbook, "--inventory", str(inventory), "--set", "nodes=2", "--set", "env.NCCL_DEBUG=INFO",
        "--set", "hyperparameters.lr=0.5", "--set", "total_steps=500", home=home,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "export FLEETRUN_TOTAL_STEPS=500" in ok.stdout, "the metrics helper's total (progress, ETA)"
    assert "nodes: 2;" in ok.stdout and "## n1 " in ok.stdout and "## n2 " not in ok.stdout
    assert "export NCCL_DEBUG=INFO" in ok.stdout and "--lr 0.5" in ok.stdout
    for task in ("plan", "doctor", "export"):
        extra = ["--image", "img"] if task == "export" else ["--inventory", str(inventory)]
        for item, field in (("nodes=zero", "'nodes'"), ("nodez=2", "'nodez'")):
            named = ["--playbook", playbook] if task == "doctor" else [playbook]  # optional there
            bad = fab(task, *named, *extra, "--set", item, home=home)
            assert bad.returncode == 2, (task, bad.stdout, bad.stderr)
            lines = bad.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("fleetrun: error: "), (task, bad.stderr)
            assert f"--set {item}: field {field}" in lines[0] and "Traceback" not in bad.stderr


def test_doctor_set_without_a_playbook_says_so(tmp_path: Path) -> None:
    bad = fab("doctor", "--set", "nodes=2", home=tmp_path / "home")
    assert bad.returncode == 2 and "name the playbook too" in bad.stderr


@needs_root()
def test_a_run_with_set_uses_and_records_it(fleet: object, fleetrun_home: Path, tmp_path: Path) -> None:
    """On the session's fleet: 2 of its 3 nodes, a learning rate the trainer receives, a wall-time
    rule; ``fab show`` and ``fab compare`` print what was set. The job is the torch-free trainer:
    the overrides are the subject, not training."""
    playbook = write_playbook(
        tmp_path / "job.yaml", STEPS_JOB, name="t-set", entrypoint="python steps.py --steps 20"
    )
    runs = tmp_path / "runs"
    proc = fab(
        "train", str(playbook), "--inventory", f"local:{TEST_PREFIX}", "--set", "nodes=2",
        "--set", "hyperparameters.lr=0.05", "--set", "stop.max_wall_time_s=900",
        "--set", "env.FLEETRUN_T_SET=yes", "--set", "total_steps=100000",
        home=fleetrun_home, runs=runs, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = list(runs.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world"]["world_size"] == 2, "nodes=2 of the 3"
    launch_sh = next((run / "nodes").glob("*/launch.sh")).read_text()
    assert "--lr 0.05" in launch_sh and "FLEETRUN_T_SET=yes" in launch_sh
    show = fab("show", run.name, home=fleetrun_home, runs=runs)
    assert "nodes=2 hyperparameters.lr=0.05 stop.max_wall_time_s=900 env.FLEETRUN_T_SET=yes" in show.stdout
    assert "total_steps=100000" in show.stdout
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [(m["step"], m["progress"]) for m in metrics if "progress" in m]
    assert steps and all(p == round(s / 100000, 6) for s, p in steps), "progress against total_steps"
    listed = fab("runs", "--limit", "100", home=fleetrun_home, runs=runs, columns=300)
    row = next(line for line in listed.stdout.splitlines() if run.name[:20] in line)
    assert "0%" in row, row
    compare = fab("compare", run.name, "--plot", "", "--json", home=fleetrun_home, runs=runs)
    assert json.loads(compare.stdout)[0]["overrides"]["hyperparameters.lr"] == 0.05
