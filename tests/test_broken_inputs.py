"""The broken-input corpus: every broken playbook or inventory gets one clear line, never a traceback.

Each case is a playbook, an inventory (or stack outputs) and sometimes extra files, run through the
real CLI: ``fab train PLAYBOOK --inventory INV --dry-run`` with ``FLEETRUN_HOME`` and ``HOME``
pointed at the case's own directory. Asserted for every case: exit code 2, stdout empty (no
plan), stderr exactly one line, starting ``fleetrun: error:``, naming the broken file and the
field (or line), no ``Traceback``, and nothing created under ``FLEETRUN_HOME`` (no run folder,
no key, no known_hosts).

Speed: most cases run in-process batches (``tests/broken/cli_batch.py`` runs the same
``fabric.main.program`` the ``fab`` script runs, one case after another, two batches in
parallel); every ``SUBPROCESS_EVERY``-th case also runs as its own ``.venv/bin/fab`` process,
so the real process boundary (exit status, stderr encoding) is covered for a spread of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch.job.validation import printable

REPO = Path(__file__).resolve().parent.parent
FAB = Path(sys.executable).parent / "fab"
BATCH = Path(__file__).resolve().parent / "broken" / "cli_batch.py"
SUBPROCESS_EVERY = 10

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3ENAj6vRFYnzbm3iOpU9jEnRh9WI4cXMQxfHrT4EAP"
RSA_BLOB = "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"  # an ssh-rsa blob cut short

GOOD_JOB: dict[str, Any] = {
    "name": "demo",
    "workdir": "code",
    "entrypoint": "python -m trainer.task --epochs 3",
    "nodes": 2,
    "env": {"OMP_NUM_THREADS": "1"},
}
GOOD_HOSTS: dict[str, Any] = {
    "defaults": {"user": "alice"},
    "hosts": [
        {
            "name": "gpu1",
            "address": "192.0.2.10",
            "private_address": "10.1.0.10",
            "gpus": 1,
            "host_key": KEY_A,
        },
        {
            "name": "gpu2",
            "address": "192.0.2.11",
            "private_address": "10.1.0.11",
            "gpus": 1,
            "host_key": KEY_B,
        },
    ],
}
GOOD_OUTPUTS: dict[str, Any] = {
    "fleetrun_contract": 1,
    "cluster_id": "fr-abc123",
    "cloud": "aws",
    "region": "us-east-1",
    "bucket": "fr-abc123-artifacts",
    "ssh_user": "ubuntu",
    "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "nodes": [
        {
            "name": f"fr-abc123-node{i}",
            "rank": i,
            "public_ip": f"54.1.2.{i + 3}",
            "private_ip": f"10.0.1.{i + 10}",
            "instance_type": "p5.48xlarge",
            "instance_id": f"i-0{i}",
            "host_key": key,
        }
        for i, key in enumerate((KEY_A, KEY_B))
    ],
}

Text = str | bytes | dict[str, Any] | list[Any] | None


@dataclass
class Case:
    """One broken input. ``job``/``hosts`` replace the good files' fields (dicts) or whole text."""

    id: str
    expect: tuple[str, ...]
    job: Text = None
    hosts: Text = None
    target: str = "job.yaml"
    inventory: str = "hosts.yaml"
    prepare: Callable[[Path], None] | None = None
    argv_playbook: str = "job.yaml"
    extra: dict[str, Text] = field(default_factory=dict)


def job(**fields: Any) -> dict[str, Any]:
    return {**GOOD_JOB, **fields}


def job_without(name: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD_JOB.items() if k != name}


def host(index: int, **fields: Any) -> dict[str, Any]:
    hosts = [dict(h) for h in GOOD_HOSTS["hosts"]]
    hosts[index].update(fields)
    return {**GOOD_HOSTS, "hosts": hosts}


def outputs_node(**fields: Any) -> dict[str, Any]:
    nodes = [dict(n) for n in GOOD_OUTPUTS["nodes"]]
    nodes[1].update(fields)
    return {**GOOD_OUTPUTS, "nodes": nodes}


GOOD_JOB_TEXT = yaml.safe_dump(GOOD_JOB, sort_keys=False)
GOOD_HOSTS_TEXT = yaml.safe_dump(GOOD_HOSTS, sort_keys=False)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)

F = "field "
NON_UTF8_DIR = "caf" + b"\xe9".decode("utf-8", "surrogateescape")
CASES: list[Case] = [
    # -- types and ranges -------------------------------------------------------------------------
    Case("nodes-zero", (F + "'nodes'", "greater than or equal to 1"), job(nodes=0)),
    Case("nodes-string", (F + "'nodes'", "valid integer"), job(nodes="3")),
    Case("nodes-bool", (F + "'nodes'",), job(nodes=True)),
    Case("nodes-float", (F + "'nodes'",), job(nodes=2.0)),
    Case("nodes-huge", (F + "'nodes'", "less than or equal to 4096"), job(nodes=10**9)),
    Case("procs-yes", (F + "'procs_per_node'", "'auto'"), job(procs_per_node=True)),
    Case("procs-zero", (F + "'procs_per_node'",), job(procs_per_node=0)),
    Case("procs-absurd", (F + "'procs_per_node'",), job(procs_per_node=100000)),
    Case("procs-word", (F + "'procs_per_node'",), job(procs_per_node="all")),
    Case("launcher-unknown", (F + "'launcher'", "'torchrun' or 'horovod'"), job(launcher="mpirun")),
    Case("teardown-unknown", (F + "'teardown'",), job(teardown="sometimes")),
    Case("rdzv-port-low", (F + "'rdzv_port'",), job(rdzv_port=80)),
    Case("relay-zero", (F + "'relay_sync_above'",), job(relay_sync_above=0)),
    Case("restarts-absurd", (F + "'max_restarts'",), job(max_restarts=1000)),
    Case("unknown-field", (F + "'nodez'", "unknown field"), job(nodez=3)),
    Case("missing-entrypoint", (F + "'entrypoint'", "required"), job_without("entrypoint")),
    Case("name-spaces", (F + "'name'", "slug"), job(name="Demo Job")),
    Case("name-trailing-newline", (F + "'name'", "slug"), job(name="demo\n")),
    Case("name-too-long", (F + "'name'",), job(name="a" * 64)),
    Case("name-not-string", (F + "'name'",), job(name=12)),
    # -- stop rules: finite, bounded, strictly typed --------------------------------------------
    Case(
        "stop-inf",
        (F + "'stop'", "stall_timeout_s", "finite"),
        GOOD_JOB_TEXT + "stop: {stall_timeout_s: 1.0e+400}\n",
    ),
    Case(
        "stop-1e400-text",
        (F + "'stop.stall_timeout_s'", "'1e400'"),
        GOOD_JOB_TEXT + "stop: {stall_timeout_s: 1e400}\n",
    ),
    Case(
        "stop-nan", (F + "'stop.max_wall_time_s'", "nan"), GOOD_JOB_TEXT + "stop: {max_wall_time_s: .nan}\n"
    ),
    Case("stop-negative", (F + "'stop.max_wall_time_s'",), job(stop={"max_wall_time_s": -5})),
    Case("stop-string", (F + "'stop.stall_timeout_s'",), job(stop={"stall_timeout_s": "300"})),
    Case("stop-cost-absurd", (F + "'stop'", "max_cost_usd"), job(stop={"max_cost_usd": 1e300})),
    Case("stop-unknown-rule", (F + "'stop.stall_timeout'", "unknown field"), job(stop={"stall_timeout": 5})),
    Case("stop-bool-word", (F + "'stop.nan_loss'",), job(stop={"nan_loss": "maybe"})),
    Case("stop-not-mapping", (F + "'stop'",), job(stop=[1, 2])),
    # -- entrypoint --------------------------------------------------------------------------------
    Case(
        "entry-pipe-tee", (F + "'entrypoint'", "'|'", "script"), job(entrypoint="python train.py | tee log")
    ),
    Case("entry-and", (F + "'entrypoint'", "'&&'"), job(entrypoint="python a.py && python b.py")),
    Case("entry-or", (F + "'entrypoint'", "'||'"), job(entrypoint="python a.py || true")),
    Case("entry-semicolon", (F + "'entrypoint'", "';'"), job(entrypoint="python a.py; python b.py")),
    Case("entry-background", (F + "'entrypoint'", "'&'"), job(entrypoint="python train.py &")),
    Case("entry-subshell", (F + "'entrypoint'", "'('"), job(entrypoint="(python train.py)")),
    Case(
        "entry-newline",
        (F + "'entrypoint'", "control characters"),
        job(entrypoint="python a.py\npython b.py"),
    ),
    Case("entry-empty", (F + "'entrypoint'", "empty"), job(entrypoint="")),
    Case("entry-blank", (F + "'entrypoint'", "empty"), job(entrypoint="   ")),
    Case("entry-unterminated", (F + "'entrypoint'", "shell command line"), job(entrypoint='python "x.py')),
    Case(
        "entry-python-c", (F + "'entrypoint'", "torchrun runs", "-c"), job(entrypoint="python -c 'print(1)'")
    ),
    Case("entry-python-u", (F + "'entrypoint'", "'-u'"), job(entrypoint="python -u train.py")),
    Case("entry-huge", (F + "'entrypoint'", "at most 8192"), job(entrypoint="python x.py " + "a" * 9000)),
    Case("entry-esc", (F + "'entrypoint'", "control"), job(entrypoint="python x.py \x1b[2J")),
    # -- env -------------------------------------------------------------------------------------
    Case("env-key-digit", (F + "'env'", "'1BAD'"), job(env={"1BAD": "x"})),
    Case("env-key-dash", (F + "'env'", "'A-B'"), job(env={"A-B": "x"})),
    Case("env-key-newline", (F + "'env'", "\\n"), job(env={"A\nPATH": "x"})),
    Case("env-key-trailing-newline", (F + "'env'",), job(env={"TOKEN\n": "x"})),
    Case("env-value-nul", (F + "'env'", "NUL"), job(env={"A": "x\0y"})),
    Case("env-value-int", (F + "'env.OMP_NUM_THREADS'", "valid string"), job(env={"OMP_NUM_THREADS": 1})),
    Case("env-not-mapping", (F + "'env'",), job(env=["A=1"])),
    Case("env-too-many", (F + "'env'", "at most 512"), job(env={f"V{i}": "x" for i in range(600)})),
    Case("secret-env-bad-name", (F + "'secret_env'",), job(secret_env=["NOT A NAME"])),
    Case("secret-env-not-list", (F + "'secret_env'",), job(secret_env="HF_TOKEN")),
    Case("secret-env-misspelt", (F + "'secret_env'", "'DB_URLL' is not in env"), job(secret_env=["DB_URLL"])),
    # -- paths -----------------------------------------------------------------------------------
    Case("outputs-parent", (F + "'outputs'", "relative path"), job(outputs="../../etc")),
    Case("outputs-absolute", (F + "'outputs'",), job(outputs="/etc")),
    Case("outputs-quote-injection", (F + "'outputs'",), job(outputs='out"; rm -rf ~; "')),
    Case("outputs-dollar", (F + "'outputs'",), job(outputs="$HOME")),
    Case("outputs-inner-parent", (F + "'outputs'",), job(outputs="a/../../b")),
    Case("outputs-empty", (F + "'outputs'",), job(outputs="")),
    Case("workdir-root", (F + "'workdir'", "root or home"), job(workdir="/")),
    Case("workdir-home", (F + "'workdir'", "root or home"), job(workdir="~")),
    Case("workdir-missing", (F + "'workdir'", "does not exist"), job(workdir="nowhere")),
    Case("workdir-is-file", (F + "'workdir'", "does not exist"), job(workdir="job.yaml")),
    Case("workdir-not-string", (F + "'workdir'",), job(workdir=5)),
    Case("workdir-newline", (F + "'workdir'",), job(workdir="code\n")),
    Case("requirements-outside", (F + "'requirements'", "outside workdir"), job(requirements="../req.txt")),
    Case("requirements-absolute", (F + "'requirements'", "outside workdir"), job(requirements="/etc/passwd")),
    Case("requirements-missing", (F + "'requirements'", "not found"), job(requirements="nope.txt")),
    Case(
        "requirements-not-utf8",
        (F + "'requirements'", "not valid UTF-8"),
        job(requirements="req.txt"),
        extra={"code/req.txt": b"numpy\n\xff\xfe\n"},
    ),
    Case("setup-mapping", (F + "'setup'",), job(setup={"a": 1})),
    Case("setup-nul", (F + "'setup'", "NUL"), job(setup=["echo a\0b"])),
    Case("python-newline", (F + "'python'", "control"), job(python="python3\nrm -rf ~")),
    Case("data-dir-esc", (F + "'data_dir'", "control"), job(data_dir="/data\x1b]0;owned\x07")),
    # -- the file itself -------------------------------------------------------------------------
    Case("duplicate-key", ("duplicate key 'nodes'", "line 7"), GOOD_JOB_TEXT + "nodes: 3\n"),
    Case("playbook-list", ("expected a mapping", "got list"), "- name: demo\n- nodes: 2\n"),
    Case("playbook-scalar", ("expected a mapping", "got str"), "just text\n"),
    Case("playbook-empty", ("expected a mapping", "got NoneType"), ""),
    Case("playbook-bad-yaml", ("not valid YAML", "line 2"), "name: demo\n  workdir: [\n"),
    Case("playbook-not-utf8", ("not valid UTF-8", "byte"), GOOD_JOB_TEXT.encode() + b"# caf\xe9\n"),
    Case("playbook-alias-bomb", ("aliases are expanded",), GOOD_JOB_TEXT + BOMB.replace("a:", "x_a:", 1)),
    Case("playbook-deep-nesting", ("nested too deeply",), "a: " + "[" * 2000 + "]" * 2000 + "\n"),
    Case("playbook-tab-indent", ("not valid YAML",), "name: demo\n\tnodes: 2\n"),
    Case(
        "playbook-100mb",
        ("larger than 1024 KiB",),
        prepare=lambda d: _sparse(d / "job.yaml", 100 * 1024 * 1024),
    ),
    Case(
        "workdir-not-utf8-directory",
        (F + "'workdir'", "not valid UTF-8"),
        argv_playbook=NON_UTF8_DIR + "/job.yaml",
        target=NON_UTF8_DIR + "/job.yaml",
        prepare=lambda d: _copy_into(d, NON_UTF8_DIR),
    ),
    Case("playbook-missing", ("playbook file not found",), argv_playbook="nope.yaml", target="nope.yaml"),
    Case("playbook-directory", ("not a regular file",), argv_playbook="code", target="code"),
    # -- inventory: hosts.yaml -------------------------------------------------------------------
    Case(
        "user-newline-proxycommand",
        (F + "'hosts[1].user'", "POSIX user name"),
        hosts=host(1, user="alice\nProxyCommand sh -c 'id>/tmp/x'"),
        target="hosts.yaml",
    ),
    Case(
        "user-dash-option",
        (F + "'hosts[0].user'",),
        hosts=host(0, user="-oProxyCommand=x"),
        target="hosts.yaml",
    ),
    Case("user-space", (F + "'hosts[0].user'",), hosts=host(0, user="root user"), target="hosts.yaml"),
    Case(
        "user-trailing-newline", (F + "'hosts[0].user'",), hosts=host(0, user="alice\n"), target="hosts.yaml"
    ),
    Case(
        "address-scope-injection",
        (F + "'hosts[0].address'", "scope id"),
        hosts=host(0, address="fe80::1%eth0;reboot"),
        target="hosts.yaml",
    ),
    Case(
        "private-scope-widens-from",
        (F + "'hosts[1].private_address'", "scope id"),
        hosts=host(1, private_address="fe80::1%x,*"),
        target="hosts.yaml",
    ),
    Case(
        "address-subshell-scope",
        (F + "'hosts[1].private_address'", "scope id"),
        hosts=host(1, private_address="fe80::2%$(reboot)"),
        target="hosts.yaml",
    ),
    Case(
        "address-bracketed",
        (F + "'hosts[0].address'", "without brackets"),
        hosts=host(0, address="[2001:db8::1]"),
        target="hosts.yaml",
    ),
    Case(
        "address-bang", (F + "'hosts[0].address'",), hosts=host(0, address="bad host!"), target="hosts.yaml"
    ),
    Case(
        "address-trailing-newline",
        (F + "'hosts[0].address'",),
        hosts=host(0, address="gpu1.lab\n"),
        target="hosts.yaml",
    ),
    Case("name-newline", (F + "'hosts[0].name'",), hosts=host(0, name="gpu1\n"), target="hosts.yaml"),
    Case(
        "host-key-truncated",
        (F + "'hosts[1].host_key'", "truncated"),
        hosts=host(1, host_key=KEY_B[:60]),
        target="hosts.yaml",
    ),
    Case(
        "host-key-type-mismatch",
        (F + "'hosts[1].host_key'", "declared ssh-rsa", "ssh-ed25519"),
        hosts=host(1, host_key="ssh-rsa " + KEY_B.split()[1]),
        target="hosts.yaml",
    ),
    Case(
        "host-key-rsa-cut",
        (F + "'hosts[0].host_key'", "truncated"),
        hosts=host(0, host_key="ssh-rsa " + RSA_BLOB),
        target="hosts.yaml",
    ),
    Case(
        "host-key-garbage",
        (F + "'hosts[0].host_key'",),
        hosts=host(0, host_key="not-a-key"),
        target="hosts.yaml",
    ),
    Case(
        "host-key-second-line",
        (F + "'hosts[0].host_key'",),
        hosts=host(0, host_key=KEY_A + "\n* " + KEY_B),
        target="hosts.yaml",
    ),
    Case("port-string", (F + "'hosts[1].port'",), hosts=host(1, port="22"), target="hosts.yaml"),
    Case("port-bool", (F + "'hosts[1].port'",), hosts=host(1, port=True), target="hosts.yaml"),
    Case("port-range", (F + "'hosts[1].port'", "65535"), hosts=host(1, port=70000), target="hosts.yaml"),
    Case("gpus-negative", (F + "'hosts[0].gpus'",), hosts=host(0, gpus=-1), target="hosts.yaml"),
    Case("gpus-absurd", (F + "'hosts[0].gpus'",), hosts=host(0, gpus=100000), target="hosts.yaml"),
    Case(
        "interface-injection",
        (F + "'hosts[0].interface'",),
        hosts=host(0, interface="eth0; reboot"),
        target="hosts.yaml",
    ),
    Case(
        "host-python-esc",
        (F + "'hosts[0].python'",),
        hosts=host(0, python="python3\x1b[2J"),
        target="hosts.yaml",
    ),
    Case(
        "host-unknown-field",
        (F + "'hosts[0].adress'", "unknown field"),
        hosts=host(0, adress="x"),
        target="hosts.yaml",
    ),
    Case("hosts-empty", (F + "'hosts'",), hosts={"hosts": []}, target="hosts.yaml"),
    Case("hosts-not-list", (F + "'hosts'",), hosts={"hosts": "gpu1"}, target="hosts.yaml"),
    Case(
        "defaults-not-mapping",
        (F + "'defaults'",),
        hosts={**GOOD_HOSTS, "defaults": ["x"]},
        target="hosts.yaml",
    ),
    Case(
        "hosts-duplicate-name",
        ("duplicate host name 'gpu1'",),
        hosts=host(1, name="gpu1"),
        target="hosts.yaml",
    ),
    Case(
        "hosts-duplicate-key",
        ("duplicate key 'user'",),
        hosts=GOOD_HOSTS_TEXT.replace("user: alice", "user: alice\n  user: root"),
        target="hosts.yaml",
    ),
    Case("inventory-list", ("expected a mapping",), hosts="- gpu1\n- gpu2\n", target="hosts.yaml"),
    Case(
        "inventory-not-utf8", ("not valid UTF-8",), hosts=b"hosts:\n  - name: gpu\xff\n", target="hosts.yaml"
    ),
    Case("inventory-missing", ("no such file",), inventory="nope.yaml", target="nope.yaml"),
    Case("nodes-more-than-inventory", ("field 'nodes'", "only 2"), job(nodes=5), target="hosts.yaml"),
    Case(
        "bucket-channel-on-lab-machines",
        ("field 'channels.train.bucket'", "has no bucket", "hosts.yaml"),
        job(channels={"train": {"bucket": "datasets/train"}}),
    ),
    Case(
        "profile-rank-past-the-world",
        ("field 'profile.ranks'", "rank(s) 7", "2 process(es)"),
        job(profile={"steps": "2-3", "ranks": [0, 7]}),
    ),
    Case(
        "horovod-ipv6",
        (F + "'hosts[0].private_address'", "IPv6"),
        job(launcher="horovod"),
        hosts=host(0, private_address="fd00::10"),
        target="hosts.yaml",
    ),
    # -- inventory: stack outputs JSON (its generated key must not be written when it is refused) --
    Case(
        "outputs-json-invalid",
        ("not valid JSON", "line 1"),
        hosts="{",
        inventory="out.json",
        target="out.json",
    ),
    Case(
        "outputs-json-duplicate-key",
        ("duplicate key 'cloud'",),
        hosts=json.dumps(GOOD_OUTPUTS)[:-1] + ', "cloud": "gcp"}',
        inventory="out.json",
        target="out.json",
    ),
    Case(
        "outputs-json-bad-host-key",
        ("field 'host_key'", "truncated", "fr-abc123-node1"),
        hosts=json.dumps(outputs_node(host_key=KEY_B[:50])),
        inventory="out.json",
        target="out.json",
    ),
    Case(
        "outputs-json-user-newline",
        ("field 'user'", "POSIX"),
        hosts=json.dumps(outputs_node(user="ubuntu\nProxyCommand x")),
        inventory="out.json",
        target="out.json",
    ),
    Case(
        "outputs-json-nan",
        ("NaN is not a JSON number",),
        hosts=json.dumps(outputs_node(port=22)).replace('"port": 22', '"port": NaN'),
        inventory="out.json",
        target="out.json",
    ),
]


def _copy_into(d: Path, name: str) -> None:
    """The case's playbook and workdir again, inside a directory whose name is not UTF-8."""
    (d / name / "code").mkdir(parents=True)
    (d / name / "job.yaml").write_text(GOOD_JOB_TEXT)


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as handle:
        handle.truncate(size)


def _write(path: Path, content: Text) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(yaml.safe_dump(content, sort_keys=False, allow_unicode=False))


def build(case: Case, root: Path) -> tuple[list[str], dict[str, str], Path]:
    """The case's directory, the fab argv, its environment, and its FLEETRUN_HOME."""
    d = root / case.id
    (d / "code").mkdir(parents=True)
    (d / "home").mkdir()
    (d / "req.txt").write_text("numpy\n")
    _write(d / "job.yaml", case.job if case.job is not None else GOOD_JOB)
    own_hosts = case.inventory == "hosts.yaml" and case.hosts is not None
    _write(d / "hosts.yaml", case.hosts if own_hosts else GOOD_HOSTS)
    if case.inventory == "out.json":
        _write(d / "out.json", case.hosts)
    for name, content in case.extra.items():
        _write(d / name, content)
    if case.prepare:
        case.prepare(d)
    fleetrun_home = d / "fleetrun-home"
    argv = ["fab", "train", str(d / case.argv_playbook)]
    argv += ["--inventory", str(d / case.inventory), "--dry-run"]
    env = {"FLEETRUN_HOME": str(fleetrun_home), "HOME": str(d / "home"), "FLEETRUN_RUNS": ""}
    return argv, env, fleetrun_home


def run_batch(items: list[tuple[list[str], dict[str, str]]]) -> list[dict[str, Any]]:
    payload = json.dumps([{"argv": argv, "env": env} for argv, env in items])
    proc = subprocess.run(
        [sys.executable, str(BATCH)], input=payload, capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    return results


def run_subprocess(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETRUN_")}
    full_env.update(env)
    proc = subprocess.run(
        [str(FAB), *argv[1:]], capture_output=True, env=full_env, cwd=REPO, timeout=120, check=False
    )
    return {
        "code": proc.returncode,
        "stdout": proc.stdout.decode("utf-8", "replace"),
        "stderr": proc.stderr.decode("utf-8", "replace"),
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Path, list[dict[str, Any]]]]:
    """Every case run once up front (batches and subprocesses in parallel); tests then assert."""
    root = tmp_path_factory.mktemp("broken")
    built = {case.id: build(case, root) for case in CASES}
    ids = [case.id for case in CASES]
    halves = [ids[0::2], ids[1::2]]
    direct = ids[::SUBPROCESS_EVERY]
    with ThreadPoolExecutor(max_workers=4) as pool:
        batch_futures = [pool.submit(run_batch, [built[i][:2] for i in half]) for half in halves]
        direct_futures = {i: pool.submit(run_subprocess, *built[i][:2]) for i in direct}
        results: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        for half, future in zip(halves, batch_futures, strict=True):
            for i, result in zip(half, future.result(), strict=True):
                results[i].append(result)
        for i, future in direct_futures.items():
            results[i].append(future.result())
    return {case.id: (case, built[case.id][2], results[case.id]) for case in CASES}


def test_corpus_is_large_and_distinct() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 60


@pytest.mark.parametrize("case_id", [case.id for case in CASES])
def test_broken_input_gives_one_clear_line(
    outcomes: dict[str, tuple[Case, Path, list[dict[str, Any]]]], case_id: str
) -> None:
    case, fleetrun_home, results = outcomes[case_id]
    target = printable(fleetrun_home.parent / case.target, 400)
    for result in results:
        stderr = result["stderr"]
        assert "Traceback" not in stderr, stderr
        assert result["code"] == 2, stderr
        assert result["stdout"] == "", "no plan is printed for a broken input"
        lines = stderr.strip("\n").split("\n")
        assert len(lines) == 1, stderr
        assert lines[0].startswith("fleetrun: error: ")
        assert target in lines[0], f"the message names the file {target}: {lines[0]}"
        for fragment in case.expect:
            assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
        assert not fleetrun_home.exists() or not any(fleetrun_home.rglob("*")), "nothing was created"


def test_a_spread_of_cases_ran_as_real_processes(
    outcomes: dict[str, tuple[Case, Path, list[dict[str, Any]]]],
) -> None:
    direct = [case_id for case_id, (_, _, results) in outcomes.items() if len(results) == 2]
    assert len(direct) >= len(CASES) // SUBPROCESS_EVERY
