"""Bad input on the command line itself: flags, ports, positional arguments, run ids, dates, paths.

Each is parsed by the same program the ``fab`` and ``fleetrun`` scripts run, in-process: the
result must be one ``fleetrun: error:`` line on stderr and exit code 2 (no traceback, nothing
started), or, for the documented forms, the task called with the arguments the user meant.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from invoke import Program

from launch.cli import app
from launch.cli.main import program
from launch.run import closing, opening

PROGRAMS = pytest.mark.parametrize(
    "make", [lambda: program("fab"), lambda: program("fleetrun")], ids=["fab", "fleetrun"]
)


def run_cli(
    make: Callable[[], Program], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of one command line."""
    try:
        make().run(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(code: int, out: str, err: str, *fragments: str) -> None:
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("fleetrun: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def doctor_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``app.doctor`` replaced: the arguments each ``doctor`` command line reached it with."""
    calls: list[dict[str, Any]] = []

    def fake(playbook: str | None = None, **kwargs: Any) -> bool:
        calls.append({"playbook": playbook, **kwargs})
        return True

    monkeypatch.setattr(app, "doctor", fake)
    return calls


@PROGRAMS
@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "job.yaml", "--inventory", "hosts.yaml"],  # the README's form
        ["doctor", "--playbook", "job.yaml", "--inventory", "hosts.yaml"],
        ["doctor", "--inventory", "hosts.yaml", "job.yaml"],
        ["doctor", "-i", "hosts.yaml", "-p", "job.yaml"],
    ],
)
def test_doctor_takes_the_playbook_as_a_positional_argument_or_a_flag(
    make: Callable[[], Program],
    args: list[str],
    doctor_calls: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = run_cli(make, ["prog", *args], capsys)
    assert code == 0, err
    assert len(doctor_calls) == 1
    call = doctor_calls[0]
    assert {k: call[k] for k in ("playbook", "inventory", "port", "verbose")} == {
        "playbook": "job.yaml",
        "inventory": "hosts.yaml",
        "port": None,
        "verbose": False,
    }
    assert not call.get("collective") and not call.get("overrides")  # not asked for


@PROGRAMS
def test_doctor_without_a_playbook_still_runs(
    make: Callable[[], Program], doctor_calls: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run_cli(
        make, ["prog", "doctor", "--inventory", "hosts.yaml", "--port", "29555"], capsys
    )
    assert code == 0, err
    assert len(doctor_calls) == 1
    call = doctor_calls[0]
    assert {k: call[k] for k in ("playbook", "inventory", "port", "verbose")} == {
        "playbook": None,
        "inventory": "hosts.yaml",
        "port": 29555,
        "verbose": False,
    }


@PROGRAMS
@pytest.mark.parametrize("port", ["70000", "-5", "0", "65536"])
def test_doctor_port_out_of_range_is_refused_before_anything_is_read(
    make: Callable[[], Program], port: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        make, ["prog", "doctor", f"--port={port}", "-i", str(tmp_path / "none.yaml")], capsys
    )
    assert_one_error_line(code, out, err, f"--port {port}", "1 to 65535")


@PROGRAMS
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["doctor", "--port", "abc"], ("--port 'abc'", "whole number")),
        (["runs", "--limit", "many"], ("--limit 'many'", "whole number")),
        (["exec", "true", "--timeout", "soon"], ("--timeout 'soon'", "a number")),
        (["local.up", "--nodes", "3x"], ("--nodes '3x'", "whole number")),
    ],
)
def test_a_flag_value_not_of_its_kind_is_one_line_not_a_traceback(
    make: Callable[[], Program],
    args: list[str],
    fragments: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(make, ["prog", *args], capsys)
    assert_one_error_line(code, out, err, *fragments)


@pytest.fixture
def one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fleetrun home holding one finished run (its folder has a short loss history)."""
    import json

    from launch.run.records import RunRecords

    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEETRUN_RUNS", raising=False)
    folder = tmp_path / "runs" / "demo-1"
    folder.mkdir(parents=True)
    lines = [{"step": s, "time": 1.0e9 + s, "loss": 1.0 / (s + 1)} for s in range(5)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with RunRecords(tmp_path / "home" / "runs.db") as db:
        db.start(run_id="demo-1", playbook_name="demo", started_at=1.0e9, run_dir=str(folder), watcher_pid=1)
        db.finish("demo-1", state="succeeded", ended_at=1.0e9 + 60)
    return "demo-1"


NOT_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")  # what Python makes of $'\xff\xfe' in argv


@PROGRAMS
@pytest.mark.parametrize(
    "args",
    [
        ["show", NOT_UTF8],
        ["logs", NOT_UTF8],
        ["pull", NOT_UTF8],
        ["watch", NOT_UTF8],
        ["compare", f"demo-1,{NOT_UTF8}", "--plot", ""],
        ["show", "demo\x1b[2J"],
    ],
)
def test_a_run_id_that_is_not_text_is_one_line(
    make: Callable[[], Program], args: list[str], one_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(make, ["prog", *args], capsys)
    assert_one_error_line(code, out, err, "no run ", "printable text")
    assert "\x1b" not in err


@PROGRAMS
@pytest.mark.parametrize("since", ["0001-01-01", "0001-01-01T00:00:00", "9999-12-31T23:59:59-14:00"])
def test_runs_since_a_date_out_of_range_is_one_line(
    make: Callable[[], Program], since: str, one_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(make, ["prog", "runs", "--since", since], capsys)
    if code == 0:  # a far-future date is a valid (empty) filter, never a traceback
        assert "Traceback" not in err and one_run not in out
        return
    assert_one_error_line(code, out, err, "--since", "expected a date")


@PROGRAMS
def test_compare_plot_to_an_unwritable_path_is_one_line_before_the_table(
    make: Callable[[], Program], one_run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for plot in (str(a_file / "loss.png"), str(tmp_path)):
        code, out, err = run_cli(make, ["prog", "compare", one_run, "--plot", plot], capsys)
        assert_one_error_line(code, out, err, "--plot", plot)
        assert out == "", "nothing is printed before the refusal"
    code, out, err = run_cli(
        make, ["prog", "compare", one_run, "--plot", str(tmp_path / "new" / "c.png")], capsys
    )
    assert code == 0 and (tmp_path / "new" / "c.png").is_file(), err
    assert not [p for p in (tmp_path / "new").iterdir() if p.name != "c.png"], "the probe file is removed"


@PROGRAMS
def test_runs_tensorboard_into_an_unwritable_folder_is_one_line(
    make: Callable[[], Program], one_run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, out, err = run_cli(make, ["prog", "runs", "--tensorboard", str(a_file / "tb")], capsys)
    assert_one_error_line(code, out, err, "--tensorboard")


def test_the_end_of_a_run_says_why_a_profiled_rank_left_no_trace(tmp_path: Path) -> None:
    """``procs_per_node: auto`` on hosts of unknown GPU count: the world size is known only once
    the nodes report it, so the playbook is accepted and the end of the run says it."""
    from launch.job.spec import load_job_spec

    (tmp_path / "code").mkdir()
    playbook = tmp_path / "job.yaml"
    playbook.write_text(
        "name: demo\nworkdir: code\nentrypoint: python x.py\nnodes: 2\nprocs_per_node: auto\n"
        "profile: {steps: '2-3', ranks: [1, 7]}\n"
    )
    spec = load_job_spec(playbook)
    opening.check_profiled_ranks_exist(spec, None, playbook)  # unknown world size: nothing to refuse yet
    line = closing.missing_profile_ranks_line(spec, {"world_size": 2, "ranks": []})
    assert line == "no trace from rank(s) 7 (profile.ranks): the job ran 2 process(es), ranks 0-1"
    assert closing.missing_profile_ranks_line(spec, {"world_size": 8}) is None
    for garbage in (None, {"world_size": "2"}, {"world_size": True}, [2], {"world_size": 0}):
        assert closing.missing_profile_ranks_line(spec, garbage) is None
    with pytest.raises(Exception, match=r"field 'profile.ranks': rank\(s\) 7 do not exist"):
        opening.check_profiled_ranks_exist(spec, 4, playbook)


@PROGRAMS
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["train", "job.yaml", "--bogus"], ("train: unknown option '--bogus'", "train --help")),
        (["train", "--bogus"], ("train: unknown option '--bogus'",)),  # not read as the playbook
        (["export", "job.yaml", "-x"], ("export: unknown option '-x'",)),
        (["train", "job.yaml", "-e"], ("unknown option '-e'",)),  # once Invoke's --echo
        (["train", "job.yaml", "-i"], ("train: --inventory needs a value",)),
        (["runs", "--limit"], ("runs: --limit needs a value",)),
        (["trian"], ("unknown command 'trian'", "did you mean 'train'?", "--help' lists the commands")),
        (["--bogus"], ("unknown option '--bogus'",)),
        (["--help", "trian"], ("trian",)),
        (["show"], ("show: missing RUN",)),
        (["forward", "last"], ("forward: missing PORT",)),
        (["local.up", "--vm=yes"], ("local.up: unexpected argument 'yes'",)),
        (["train", "a.yaml", "b.yaml"], ("train: unexpected argument 'b.yaml'",)),
        (["--list", "nowhere"], ("--list", "nowhere")),
        (["train", "job.yaml", "--set"], ("train: --set needs a value",)),  # once ignored: no change
        (["train", "job.yaml", "--set", "--dry-run"], ("train: --set needs a value",)),
        (["plan", "job.yaml", "-s", "nodes=2", "-s"], ("plan: --set needs a value",)),
        (["sweep", "job.yaml", "--grid", "--parallel", "2"], ("sweep: --grid needs a value",)),
        (["export", "job.yaml", "--allow-path"], ("export: --allow-path needs a value",)),
    ],
)
def test_every_parse_error_is_one_line_and_exit_2(
    make: Callable[[], Program],
    args: list[str],
    fragments: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(make, ["prog", *args], capsys)
    assert_one_error_line(code, out, err, *fragments)
    assert "No idea what" not in err and "did not receive" not in err and "Flag <" not in err


@PROGRAMS
def test_short_flags_read_the_same_in_train_and_sweep(
    make: Callable[[], Program], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-s`` is ``--set`` and ``-i`` is ``--inventory`` in both (``-s`` was ``--skip-doctor`` in train)."""
    from launch.cli import sweep as sweeping

    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(app, "train", lambda playbook, **kw: calls.append(("train", kw)))
    monkeypatch.setattr(
        sweeping, "run_sweep", lambda playbook, grid, **kw: calls.append(("sweep", kw)) or _NoVariants()
    )
    for task in ("train", "sweep"):
        code, _out, err = run_cli(make, ["prog", task, "job.yaml", "-s", "nodes=2", "-i", "lab.yaml"], capsys)
        assert code == 0, err
    (_, train), (_, sweep) = calls
    assert (
        train["overrides"] == ("nodes=2",) and train["inventory"] == "lab.yaml" and not train["skip_doctor"]
    )
    assert sweep["sets"] == ("nodes=2",) and sweep["inventory"] == "lab.yaml"


class _NoVariants:
    variants: list[Any] = []


# -- --allow-path in every command that reads a playbook ---------------------------------------


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A playbook in ``proj/`` whose workdir is ``elsewhere/code`` (outside its folder), and a lab
    inventory of two documentation-address hosts (nothing is connected to)."""
    import json

    from tests.conftest import SAMPLE_HOST_KEYS, write_playbook

    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    code = tmp_path / "elsewhere" / "code"
    code.mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    playbook = write_playbook(tmp_path / "proj" / "job.yaml", code, nodes=2)
    hosts = [
        {"name": f"n{i}", "address": f"203.0.113.{i + 1}", "user": "u", "host_key": SAMPLE_HOST_KEYS[i]}
        for i in range(2)
    ]
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(json.dumps({"hosts": hosts}))
    return playbook, code, inventory


def _refused_then_accepted(
    make: Callable[[], Program], args: list[str], code_dir: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``args`` refused for the workdir without ``--allow-path``; the result with it."""
    code, out, err = run_cli(make, ["prog", *args], capsys)
    assert_one_error_line(code, out, err, "field 'workdir'", "--allow-path")
    return run_cli(make, ["prog", *args, "--allow-path", str(code_dir.parent)], capsys)


@PROGRAMS
def test_plan_accepts_allow_path(
    make: Callable[[], Program], outside: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    playbook, code_dir, inventory = outside
    code, out, err = _refused_then_accepted(
        make, ["plan", str(playbook), "-i", str(inventory)], code_dir, capsys
    )
    assert code == 0, err
    assert "n0" in out and "n1" in out and "203.0.113.2" in out
    code, out, err = run_cli(
        make,
        ["prog", "train", str(playbook), "--dry-run", "-i", str(inventory), "--allow-path", str(code_dir)],
        capsys,
    )
    assert code == 0 and "203.0.113.2" in out, err


@PROGRAMS
def test_export_accepts_allow_path(
    make: Callable[[], Program],
    outside: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    playbook, code_dir, _ = outside
    manifest = tmp_path / "job.k8s.yaml"
    args = ["export", str(playbook), "--image", "registry.example/digits:1", "--output", str(manifest)]
    code, _out, err = _refused_then_accepted(make, args, code_dir, capsys)
    assert code == 0, err
    assert "kind: PyTorchJob" in manifest.read_text()


@PROGRAMS
def test_sweep_accepts_allow_path_and_hands_it_to_every_variant(
    make: Callable[[], Program],
    outside: tuple[Path, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each variant stands in as a Python that writes down its command line (the ``fab train`` it
    would run), which must carry the ``--allow-path`` too."""
    import sys

    from launch.cli import sweep as sweeping

    playbook, code_dir, inventory = outside
    seen = tmp_path / "argv"
    recorder = tmp_path / "record.py"
    recorder.write_text(f"import sys\nopen({str(seen)!r}, 'a').write(repr(sys.argv[1:]) + '\\n')\n")
    monkeypatch.setattr(sweeping, "_fab", lambda: [sys.executable, str(recorder)])
    args = ["sweep", str(playbook), "--grid", "hyperparameters.lr=0.1,0.2", "-i", str(inventory)]
    code, out, err = _refused_then_accepted(make, args, code_dir, capsys)
    assert code == 0, (out, err)
    argvs = [eval(line) for line in seen.read_text().splitlines()]  # noqa: S307 (our own repr)
    assert len(argvs) == 2
    for argv in argvs:
        assert argv[:2] == ["train", str(playbook.resolve())]
        assert argv[argv.index("--allow-path") + 1] == str(code_dir.parent)


@PROGRAMS
def test_doctor_accepts_allow_path(
    make: Callable[[], Program],
    outside: tuple[Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Accepted, doctor goes on to the machines: here a fleet that reports it was reached."""
    from launch.errors import FleetrunError
    from launch.transport import ssh

    class Reached(FleetrunError):
        pass

    class Unreachable:
        def __init__(self, hosts: list[Any], *_args: Any, **_kwargs: Any) -> None:
            raise Reached(f"doctor reached the fleet: {', '.join(h.name for h in hosts)}")

    monkeypatch.setattr(ssh, "Fleet", Unreachable)
    playbook, code_dir, inventory = outside
    args = ["doctor", str(playbook), "-i", str(inventory)]
    code, out, err = _refused_then_accepted(make, args, code_dir, capsys)
    assert_one_error_line(code, out, err, "doctor reached the fleet: n0, n1")


@PROGRAMS
def test_doctor_refuses_a_bad_playbook_before_it_reads_the_inventory(
    make: Callable[[], Program],
    outside: tuple[Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fab doctor PLAYBOOK`` names the playbook's problem first: its inventory (here a local
    fleet that is not up) is not read, nor its fleet's health asked (a scheduler's login host)."""
    from launch.cli import app

    def not_read(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the inventory was read before the playbook")

    monkeypatch.setattr(app, "load_inventory", not_read)
    playbook, code_dir, _inventory = outside
    code, out, err = run_cli(make, ["prog", "doctor", str(playbook), "-i", "local:frnone"], capsys)
    assert_one_error_line(code, out, err, f"--allow-path {code_dir}")
