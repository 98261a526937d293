"""``fab exec``'s fast path (OpenSSH, no Invoke/Fabric/paramiko/pydantic) against its full path
(Invoke's program, paramiko): the same bytes and exit codes for the same cases on the session's
local fleet, and what the fast path leaves to the full one.

The two paths run in this process one after the other (``launch.cli.fast_exec.main`` and
``launch.cli.main.program``), each with its output captured. Nodes answer in any order, so a case
where several nodes print compares the lines as sorted lists, and the summary (inventory order)
as it is; a case where only the summary prints compares the bytes.
"""

from __future__ import annotations

import errno
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest
import yaml

from launch.cli import fast_exec
from launch.cli.main import program
from launch.errors import HostError
from launch.fleets.kinds import local_hosts
from launch.fleets.local import LocalFleet
from launch.fleets.local.naming import PREFIX_RE, FleetNames
from launch.job.endpoints import HOSTNAME_RE, USER_RE
from launch.transport.jump import connect_errors
from launch.transport.openssh_exec import ExecTarget, connect_failure
from tests.conftest import REPO, TEST_PREFIX, needs_root

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def both(
    capsys: pytest.CaptureFixture[str],
) -> Callable[..., tuple[tuple[int, str, str], tuple[int, str, str]]]:
    """``both(*args)``: (exit code, stdout, stderr) of ``fab exec *args`` by the fast path, then
    by the full path; fails when the fast path does not take the case."""

    def fast(*args: str) -> tuple[int, str, str]:
        code = fast_exec.main(["fab", "exec", *args])
        assert code is not None, "the fast path did not take this case"
        out = capsys.readouterr()
        return code, out.out, out.err

    def full(*args: str) -> tuple[int, str, str]:
        try:
            program("fab").run(["fab", "exec", *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return lambda *args: (fast(*args), full(*args))


def _sorted(result: tuple[int, str, str]) -> tuple[int, list[str], list[str]]:
    return result[0], sorted(result[1].splitlines(keepends=True)), sorted(result[2].splitlines(keepends=True))


# -- without a fleet ---------------------------------------------------------------------------


def test_the_fast_path_takes_exactly_the_options_exec_has() -> None:
    """Every option of the ``exec`` task is parsed by the fast path, with the task's defaults."""
    from launch.cli.tasks import exec_

    params = inspect.signature(inspect.unwrap(exec_.body)).parameters
    assert set(params) - {"c"} == {
        "command",
        *fast_exec.VALUE_OPTIONS.values(),
        *fast_exec.FLAG_OPTIONS.values(),
    }
    assert params["timeout"].default == fast_exec.DEFAULT_TIMEOUT
    assert params["inventory"].default == "local"
    assert fast_exec.parse(
        ["exec", "ls -l", "-i", "local:ab", "--timeout=5", "--parallel", "2", "--quiet"]
    ) == {
        "command": "ls -l",
        "inventory": "local:ab",
        "timeout": "5",
        "parallel": "2",
        "quiet": "yes",
    }


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["train", "job.yaml"],
        ["exec"],
        ["exec", "--help"],
        ["exec", "-h"],
        ["exec", "true", "--verbose"],
        ["exec", "true", "--quiet", "--quiet"],
        ["exec", "true", "false"],
        ["exec", "true", "--timeout"],
        ["exec", "true", "--timeout", "--quiet"],
        ["exec", "true", "--quiet=yes"],
        ["exec", "true", "-q"],
        ["exec", "--", "true"],
    ],
)
def test_a_command_line_the_fast_path_does_not_cover_goes_to_the_full_path(args: list[str]) -> None:
    assert fast_exec.parse(args) is None


@pytest.mark.parametrize(
    "args",
    [
        ["exec", "true", "-i", "hosts.yaml"],
        ["exec", "true", "-i", "stack:dev"],
        ["exec", "true", "-i", "local:"],
        ["exec", "true", "--timeout", "abc"],
        ["exec", "true", "--timeout", "0"],
        ["exec", "true", "--timeout", "nan"],
        ["exec", "true", "--parallel", "-1"],
        ["exec", "true", "--parallel", "99999"],
        ["exec", "true", "--parallel", "x"],
    ],
)
def test_values_the_fast_path_does_not_take_leave_it_untouched(args: list[str], tmp_path: Path) -> None:
    """Selectors other than the local fleet's and values the full path refuses (or treats its own
    way) return None before anything is done: the full path answers them in its words."""
    os.environ["FLEETRUN_HOME"], old = str(tmp_path), os.environ.get("FLEETRUN_HOME")
    try:
        assert fast_exec.run(args) is None
    finally:
        if old is None:
            del os.environ["FLEETRUN_HOME"]
        else:
            os.environ["FLEETRUN_HOME"] = old
    assert not any(tmp_path.iterdir()), "nothing written"


def test_the_light_reader_uses_the_models_patterns_and_path() -> None:
    assert local_hosts.NAME_RE.pattern == HOSTNAME_RE.pattern
    assert local_hosts.USER_RE.pattern == USER_RE.pattern
    assert local_hosts.PREFIX_RE.pattern == PREFIX_RE.pattern
    from launch.settings import Settings, active

    with active(Settings.from_env({"FLEETRUN_HOME": "/x/home"})):
        assert local_hosts.inventory_file(Path("/x/home"), "frq") == FleetNames(prefix="frq").inventory_path


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtlUCCGynowZmjvNARAT4Ml8fncLtC6O+LK26DeI5PU"


def _entry(i: int, **changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "address": f"198.18.9.{10 + i}",
        "user": f"frqnode{i}",
        "port": 22,
        "key": "/x/home/id_ed25519",
        "host_key": KEY,
        "name": f"frqnode{i}",
        "proxy_jump": None,
    }
    return {**entry, **changes}


JUMP = {"address": "198.18.9.10", "user": "frqnode0", "port": 22, "key": "/k", "host_key": KEY}


@pytest.mark.parametrize(
    ("hosts", "fleet", "taken"),
    [
        ([_entry(0), _entry(1)], {"kind": "local", "prefix": "frq"}, True),
        ([_entry(0), _entry(1, proxy_jump=JUMP)], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0), _entry(1)], {"kind": "local", "prefix": "other"}, False),
        ([_entry(0), _entry(1)], {"kind": "lab"}, False),
        ([_entry(0), _entry(1, name="frqnode0")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0), _entry(1, address="198.18.9.10")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, user="-oProxyCommand=x")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, address="-oProxyCommand=x")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, address="198.018.9.10")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, port=True)], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, host_key=KEY + " comment")], {"kind": "local", "prefix": "frq"}, False),
        ([_entry(0, key="relative/key")], {"kind": "local", "prefix": "frq"}, False),
    ],
)
def test_the_light_reader_takes_only_what_the_models_would_read_the_same(
    tmp_path: Path, hosts: list[dict[str, object]], fleet: dict[str, object], taken: bool
) -> None:
    """A jump host, another fleet's file, a duplicate, a value in a spelling the models would
    change or refuse: not taken (the full path loads and answers it)."""
    path = local_hosts.inventory_file(tmp_path, "frq")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"hosts": hosts, "source": "local fleet frq", "fleet": fleet}))
    targets = local_hosts.read_local_targets(tmp_path, "frq")
    assert (targets is not None) is taken
    if targets is not None:
        assert [t.name for t in targets] == ["frqnode0", "frqnode1"]
        assert targets[1].known_hosts_line() == f"198.18.9.11 {KEY}"
    assert local_hosts.read_local_targets(tmp_path, "nofile") is None


@pytest.mark.parametrize(
    ("words", "error"),
    [
        (b"Connection timed out", TimeoutError()),
        (b"Connection refused", ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")),
        (b"No route to host", OSError(errno.EHOSTUNREACH, "No route to host")),
        (b"Network is unreachable", OSError(errno.ENETUNREACH, "Network is unreachable")),
    ],
)
def test_a_failed_connect_is_named_as_the_paramiko_path_names_it(words: bytes, error: OSError) -> None:
    target = ExecTarget("n1", "198.18.9.11", 2222, "u1", None, KEY)
    log = (
        b"debug1: Connecting to 198.18.9.11 [198.18.9.11] port 2222.\r\nssh: connect to host 198.18.9.11 port 2222: "
        + words
        + b"\r\n"
    )
    with (
        pytest.raises(HostError) as caught,
        connect_errors("n1", "u1@198.18.9.11:2222", None, KEY, paramiko.SSHClient(), "host"),
    ):
        raise error
    assert connect_failure(log, target) == str(caught.value).removeprefix("n1: ")
    assert connect_failure(b"Host key verification failed.\r\n", target) is None, "the full path names it"


# -- on the session's local fleet ----------------------------------------------------------------


@needs_root()
def test_output_and_exit_codes_are_the_full_paths(fleet: LocalFleet, both: Callable[..., tuple]) -> None:
    """Each node's lines, prefixed, stdout then stderr, bytes that are not UTF-8, a carriage
    return, no final newline; a node that failed, one killed by a signal, --parallel 1."""
    selector = f"local:{TEST_PREFIX}"
    bad, killed = fleet.node_name(1), fleet.node_name(2)
    command = (
        r"printf 'out \001\033[31mred\377\r mid\ttab\nlast'; echo err >&2; "
        f'[ "$(hostname)" != {bad} ] || exit 7; [ "$(hostname)" != {killed} ] || kill -9 $$'
    )
    fast, full = both(command, "-i", selector, "--parallel", "1")
    assert fast[0] == full[0] == 1
    assert _sorted(fast) == _sorted(full)
    assert fast[1].endswith(
        f"fleetrun: {bad}: FAILED: exit code 7\nfleetrun: {killed}: FAILED: exit code -1\n"
        "fleetrun: 1/3 node(s) ok, 2 failed\n"
    )
    assert f"{fleet.node_name(0)}: err\n" in fast[1]
    fast, full = both("echo hello from $(whoami)", "--inventory", selector)
    assert _sorted(fast) == _sorted(full)
    assert fast[0] == 0 and sorted(fast[1].splitlines()) == sorted(
        f"{fleet.node_name(i)}: hello from {fleet.node_name(i)}" for i in range(3)
    )


@needs_root()
def test_a_timeout_is_reported_as_the_full_path_reports_it(
    fleet: LocalFleet, both: Callable[..., tuple]
) -> None:
    slow = fleet.node_name(0)
    fast, full = both(
        f'[ "$(hostname)" != {slow} ] || sleep 30',
        f"--inventory=local:{TEST_PREFIX}",
        "--timeout",
        "1",
        "--quiet",
    )
    assert fast == full
    assert fast[0] == 1 and f"fleetrun: {slow}: FAILED: command timed out after 1.0 s: " in fast[1]


@needs_root()
def test_unreachable_nodes_and_a_changed_host_key_read_the_same(
    fleet: LocalFleet, both: Callable[..., tuple], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its inventory copied into another FLEETRUN_HOME with node 0 pinned with node 1's key (the
    full path names it), node 1 on a port nothing listens on (refused) and node 2 at an address no
    machine has (no route): both paths read that file and say the same bytes."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    hosts = data["hosts"]
    hosts[0]["host_key"] = hosts[1]["host_key"]
    hosts[1]["port"] = 2
    hosts[2]["address"] = hosts[2]["private_address"] = hosts[2]["address"].rsplit(".", 1)[0] + ".250"
    path = local_hosts.inventory_file(tmp_path, TEST_PREFIX)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))
    fast, full = both("echo up", "-i", f"local:{TEST_PREFIX}", "--quiet")
    assert fast == full
    names = [h["name"] for h in hosts]
    assert fast[0] == 1 and "does not match the pinned key" in fast[1]
    assert (
        f"fleetrun: {names[1]}: FAILED: unreachable at {hosts[1]['user']}@{hosts[1]['address']}:2 (connection refused)"
        in fast[1]
    )
    assert f"{names[2]}: FAILED: unreachable at " in fast[1] and "(no route to host)" in fast[1]


@needs_root()
def test_fab_exec_on_a_local_fleet_imports_no_invoke_fabric_paramiko_or_pydantic(
    fleet: LocalFleet, fleetrun_home: Path
) -> None:
    """The console script's own entry point, in a process of its own: what the fast path is for."""
    check = (
        "import sys\nfrom launch.cli.main import fab\n"
        f"try:\n    fab(['fab', 'exec', 'echo ok', '-i', 'local:{TEST_PREFIX}'])\nexcept SystemExit as exc:\n"
        "    heavy = sorted({m.split('.')[0] for m in sys.modules} & {'invoke', 'fabric', 'paramiko', 'pydantic'})\n"
        "    print('exit', exc.code, 'heavy', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check],
        cwd=REPO,
        env={**os.environ, "FLEETRUN_HOME": str(fleetrun_home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.stdout.splitlines()[-1] == "exit 0 heavy []", proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()[:-1]) == [f"{fleet.node_name(i)}: ok" for i in range(3)]


def test_the_light_reader_keeps_what_it_read_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second read of an unchanged file needs no YAML parser; a changed file is read again."""
    path = local_hosts.inventory_file(tmp_path, "frq")
    path.parent.mkdir(parents=True)
    data = {"hosts": [_entry(0), _entry(1)], "fleet": {"kind": "local", "prefix": "frq"}}
    path.write_text(yaml.safe_dump(data))
    first = local_hosts.read_local_targets(tmp_path, "frq")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "yaml", None)  # `import yaml` fails from here
        assert local_hosts.read_local_targets(tmp_path, "frq") == first
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFrqLdqF+AlqyQpLs+Z4jXcOQTL04T+dghJyjVlSOoDC"
    data["hosts"][1]["host_key"] = other  # type: ignore[index]
    path.write_text(yaml.safe_dump(data))  # a node replaced: its new key pinned
    again = local_hosts.read_local_targets(tmp_path, "frq")
    assert again is not None and again[1].host_key == other


def test_without_an_openssh_client_the_full_path_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine with no ``ssh`` on PATH: the fast path steps aside before anything is done."""
    path = local_hosts.inventory_file(tmp_path, "frq")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"hosts": [_entry(0)], "fleet": {"kind": "local", "prefix": "frq"}}))
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert fast_exec.run(["exec", "true", "-i", "local:frq"]) is None
    assert not (tmp_path / "known_hosts").exists(), "nothing written"


def test_a_node_that_authenticated_ran_the_command_even_when_its_log_start_was_cut() -> None:
    """ssh's own log is kept to its last ``LOG_KEPT_BYTES``: a node that authenticated and then
    logged more than that still ran the command (its exit status is read), and is never handed
    to the paramiko path, which would run the command a second time."""
    from launch.transport import openssh_exec

    node = object.__new__(openssh_exec._Node)
    node.log, node.authenticated_at, node.verdict, node.sinks, node.log_fd = bytearray(), None, None, {}, -1
    node.take(-1, b'debug1: Authenticated to 10.0.0.1 ([10.0.0.1]:22) using "publickey".\n', 1.0)
    for _ in range(openssh_exec.LOG_KEPT_BYTES // 40 + 10):
        node.take(-1, b"debug1: client_input_channel_req: rtype\n", 2.0)
    node.take(-1, b"debug1: Exit status 7\n", 3.0)
    assert openssh_exec.AUTHENTICATED not in bytes(node.log)
    assert node.outcome() == (7, "")
