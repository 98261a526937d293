"""``proxy_jump``: the inventory's validation, the known_hosts it writes, and the OpenSSH command.

The OpenSSH command is checked by running it: real ``rsync`` with ``-e`` (rsync's own word
splitting), then the ``ProxyCommand`` under ``sh -c`` after OpenSSH's ``%`` expansion, each time
with a stand-in ``ssh`` first on PATH that records its argv. So the quoting is proven on the
parsers that will read it, not on a re-implementation of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest
import yaml

from launch.errors import SpecError
from launch.job.inventory import Host, Inventory, JumpHost
from launch.transport import openssh
from launch.transport.ssh import openssh_command, proxy_command

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3ENAj6vRFYnzbm3iOpU9jEnRh9WI4cXMQxfHrT4EAP"
KEY_J = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH2eUlMyXEu3y7zYZrrRCMbWxe1pPcYaBz/SpW4dWAyY"
JUMP = {"address": "login.lab.example", "port": 2222, "user": "alice", "key": "jump_key", "host_key": KEY_J}


def lab(tmp_path: Path, data: dict[str, object]) -> Inventory:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(data))
    return Inventory.from_static_yaml(path)


def two_hosts(**extra: object) -> list[dict[str, object]]:
    return [
        {"name": "gpu1", "address": "10.1.0.10", "host_key": KEY_A, **extra},
        {"name": "gpu2", "address": "10.1.0.11", "host_key": KEY_B},
    ]


def test_defaults_give_every_host_the_jump_and_a_host_can_opt_out(tmp_path: Path) -> None:
    inv = lab(
        tmp_path,
        {"defaults": {"user": "bob", "proxy_jump": JUMP}, "hosts": two_hosts(proxy_jump=None)},
    )
    assert inv.hosts[0].proxy_jump is None, "proxy_jump: null reaches the host directly"
    jump = inv.hosts[1].proxy_jump
    assert jump is not None
    assert (jump.address, jump.port, jump.user) == ("login.lab.example", 2222, "alice")
    assert jump.key == (tmp_path / "jump_key").resolve(), "a relative key is relative to the inventory"
    assert jump.label == "alice@login.lab.example:2222"


def test_known_hosts_holds_the_jump_key_once_and_paramiko_finds_it(tmp_path: Path) -> None:
    inv = lab(tmp_path, {"defaults": {"user": "bob", "proxy_jump": JUMP}, "hosts": two_hosts()})
    kh = inv.write_known_hosts(tmp_path / "kh")
    lines = kh.read_text().splitlines()
    assert lines == [f"10.1.0.10 {KEY_A}", f"10.1.0.11 {KEY_B}", f"[login.lab.example]:2222 {KEY_J}"]
    found = paramiko.HostKeys(str(kh)).lookup("[login.lab.example]:2222")
    assert found is not None and found["ssh-ed25519"].get_base64() == KEY_J.split()[1]


@pytest.mark.parametrize(
    ("jump", "expected"),
    [
        (
            {k: v for k, v in JUMP.items() if k != "host_key"},
            "field 'hosts[0].proxy_jump.host_key': this field is required",
        ),
        ({**JUMP, "host_key": "ssh-ed25519 AAAA"}, "field 'hosts[0].proxy_jump.host_key'"),
        (
            {**JUMP, "user": "-oProxyCommand=x"},
            "field 'hosts[0].proxy_jump.user': expected a POSIX user name",
        ),
        ({**JUMP, "address": "login;rm -rf"}, "field 'hosts[0].proxy_jump.address': expected an IP address"),
        ({**JUMP, "port": 0}, "field 'hosts[0].proxy_jump.port'"),
        ({**JUMP, "proxy_jump": JUMP}, "field 'hosts[0].proxy_jump.proxy_jump'"),
        ("login.lab.example", "field 'hosts[0].proxy_jump'"),
    ],
)
def test_a_bad_jump_host_is_refused_naming_the_field(tmp_path: Path, jump: object, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        lab(tmp_path, {"defaults": {"user": "bob"}, "hosts": two_hosts(proxy_jump=jump)})
    assert expected in str(err.value)
    assert "hosts.yaml" in str(err.value)


def test_a_jump_host_that_is_a_host_must_carry_that_hosts_key(tmp_path: Path) -> None:
    head_as_jump = {"address": "10.1.0.10", "user": "bob", "host_key": KEY_A}
    inv = lab(
        tmp_path,
        {
            "defaults": {"user": "bob"},
            "hosts": two_hosts()[:1] + [{**two_hosts()[1], "proxy_jump": head_as_jump}],
        },
    )
    assert inv.hosts[1].proxy_jump is not None, "the head may serve as the workers' bastion"
    with pytest.raises(SpecError) as err:
        lab(
            tmp_path,
            {
                "defaults": {"user": "bob"},
                "hosts": two_hosts()[:1]
                + [{**two_hosts()[1], "proxy_jump": {**head_as_jump, "host_key": KEY_B}}],
            },
        )
    message = str(err.value)
    assert "field 'hosts[1].proxy_jump' (gpu2): jump host bob@10.1.0.10:22" in message
    assert "(top level)" not in message, "the field is named as the user wrote it"
    assert "differs from the one hosts[0] (gpu1) gives" in message


def test_two_pins_for_one_jump_endpoint_and_a_host_jumping_through_itself_are_refused(tmp_path: Path) -> None:
    hosts = two_hosts(proxy_jump=JUMP)
    hosts[1]["proxy_jump"] = {**JUMP, "host_key": KEY_A}
    with pytest.raises(SpecError, match=r"field 'hosts\[1\].proxy_jump' \(gpu2\): jump host alice@login"):
        lab(tmp_path, {"defaults": {"user": "bob"}, "hosts": hosts})
    with pytest.raises(SpecError, match="a host cannot be its own jump host"):
        lab(
            tmp_path,
            {
                "defaults": {"user": "bob"},
                "hosts": two_hosts(proxy_jump={**JUMP, "address": "10.1.0.10", "port": 22}),
            },
        )


# -- the OpenSSH command ---------------------------------------------------------------------------

HOSTILE = "/tmp/a b/it's $(touch pwned) `x` %h %% ;key"


def fake_ssh(tmp_path: Path) -> dict[str, str]:
    """A PATH whose ``ssh`` appends its argv (JSON) to a log and fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.jsonl"
    script = bin_dir / "ssh"
    script.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nsys.exit(255)\n"
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def ssh_expand(text: str, host: str, port: int) -> str:
    """OpenSSH's token expansion of ``ProxyCommand``: ``%h``, ``%p``, ``%%``; any other is an error."""

    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        values = {"h": host, "p": str(port), "%": "%"}
        assert token in values, f"unexpected token %{token} left in {text!r}"
        return values[token]

    return re.sub(r"%(.)", one, text)


def option(argv: list[str], name: str) -> str:
    values = [
        argv[i + 1].split("=", 1)[1]
        for i, a in enumerate(argv[:-1])
        if a == "-o" and argv[i + 1].startswith(f"{name}=")
    ]
    assert len(values) == 1, f"{name} given {len(values)} times in {argv}"
    return values[0]


def assert_strict(argv: list[str], known_hosts: str) -> None:
    assert option(argv, "StrictHostKeyChecking") == "yes"
    assert ssh_expand(option(argv, "UserKnownHostsFile"), "-", 0) == known_hosts
    assert option(argv, "GlobalKnownHostsFile") == "/dev/null"
    assert option(argv, "BatchMode") == "yes"
    assert option(argv, "IdentitiesOnly") == "yes"
    assert argv[argv.index("-F") + 1] == "/dev/null", "no ssh_config of the user's plays a part"


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")
def test_rsync_and_the_proxy_command_carry_strict_options_on_both_hops(tmp_path: Path) -> None:
    """Hostile key paths (quotes, spaces, ``$()``, backticks, ``%``) arrive byte for byte."""
    known_hosts = tmp_path / "known hosts %d"
    jump = JumpHost(
        address="login.lab.example", port=2222, user="alice", key=Path(HOSTILE + "-jump"), host_key=KEY_J
    )
    host = Host(
        name="gpu2",
        address="10.1.0.11",
        port=2201,
        user="bob",
        key=Path(HOSTILE),
        host_key=KEY_B,
        proxy_jump=jump,
    )
    env = fake_ssh(tmp_path)
    outer_cmd = shlex.join(openssh_command(host, known_hosts))
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(
        ["rsync", "-a", "-e", outer_cmd, f"{src}/", host.rsync_target("dest/")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        check=False,
        timeout=30,
    )
    outer = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[0])
    assert_strict(outer, str(known_hosts))
    assert ssh_expand(outer[outer.index("-i") + 1], "-", 0) == HOSTILE, "the host's own key, unexpanded"
    assert outer[outer.index("-p") + 1] == "2201"
    assert "-J" not in outer and not any(a.startswith("ProxyJump") for a in outer)
    assert "bob@10.1.0.11" in outer or ("-l" in outer and "10.1.0.11" in outer)

    # The outer ssh would expand the ProxyCommand's tokens, then run it with ``sh -c 'exec ...'``.
    proxy = ssh_expand(option(outer, "ProxyCommand"), "10.1.0.11", 2201)
    (tmp_path / "argv.jsonl").unlink()
    subprocess.run(
        ["sh", "-c", f"exec {proxy}"], env=env, cwd=tmp_path, capture_output=True, check=False, timeout=30
    )
    inner = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[0])
    assert not (tmp_path / "pwned").exists(), "nothing in a path is run by the shell"
    assert_strict(inner, str(known_hosts))
    assert ssh_expand(inner[inner.index("-i") + 1], "-", 0) == HOSTILE + "-jump", "the jump's own key"
    assert inner[inner.index("-p") + 1] == "2222" and inner[inner.index("-l") + 1] == "alice"
    assert inner[-4:] == ["-W", "[10.1.0.11]:2201", "--", "login.lab.example"]


def test_a_host_without_a_jump_gets_no_proxy_command(tmp_path: Path) -> None:
    host = Host(name="gpu1", address="10.1.0.10", user="bob", host_key=KEY_A)
    argv = openssh_command(host, tmp_path / "kh")
    assert not any(a.startswith("ProxyCommand") for a in argv)
    jump = JumpHost(address="fd00::5", user="alice", host_key=KEY_J)
    assert proxy_command(jump, tmp_path / "kh").endswith("-W '[%h]:%p' -- fd00::5"), "IPv6 bracketed by ssh"


def test_openssh_commands_through_one_jump_host_are_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """At most JUMP_SLOTS at once through one login node; other jumps and direct hosts are free."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))  # where the shared slots' lock files are
    jump = JumpHost(address="login.lab.example", user="alice", host_key=KEY_J)
    behind = Host(name="gpu2", address="10.1.0.11", user="bob", host_key=KEY_B, proxy_jump=jump)
    other = behind.model_copy(
        update={"proxy_jump": jump.model_copy(update={"address": "login2.lab.example"})}
    )
    direct = Host(name="gpu1", address="10.1.0.10", user="bob", host_key=KEY_A)
    with contextlib.ExitStack() as stack:
        for _ in range(openssh.JUMP_SLOTS):
            stack.enter_context(openssh.jump_slot(behind))
        slot = openssh._slots[jump.endpoint]
        assert slot.acquire(blocking=False) is False, "a ninth command waits for a slot"
        with openssh.jump_slot(other), openssh.jump_slot(direct):
            pass
    assert slot.acquire(blocking=False) is True, "slots are given back"
    slot.release()


def test_a_jump_host_spelt_in_capitals_is_the_same_machine(tmp_path: Path) -> None:
    """``LOGIN.LAB.example`` is ``login.lab.example``: pinning it with another key would let the
    known_hosts file accept either key for one machine."""
    hosts = two_hosts(proxy_jump=JUMP)
    hosts[1]["proxy_jump"] = {**JUMP, "address": "LOGIN.LAB.example", "host_key": KEY_A}
    with pytest.raises(SpecError, match=r"field 'hosts\[1\].proxy_jump' \(gpu2\): jump host alice@LOGIN"):
        lab(tmp_path, {"defaults": {"user": "bob"}, "hosts": hosts})


def test_jump_slots_are_shared_with_other_fleetrun_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 24, item 11: two fab commands through one login node share its JUMP_SLOTS (sshd's
    MaxStartups counts them together); a slot comes free when its holder ends, even killed."""
    import sys

    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    jump = JumpHost(address="login.lab.example", user="alice", host_key=KEY_J)
    behind = Host(name="gpu2", address="10.1.0.11", user="bob", host_key=KEY_B, proxy_jump=jump)
    probe = (
        "import sys; from launch.transport.jump import take_jump_slot; "
        "print('free' if take_jump_slot(('login.lab.example', 22), blocking=False) is not None else 'taken')"
    )

    def other_process() -> str:
        env = {**os.environ, "FLEETRUN_HOME": str(tmp_path / "home")}
        return subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()

    from launch.settings import Settings, active

    with active(Settings.from_env()), contextlib.ExitStack() as stack:
        for _ in range(openssh.JUMP_SLOTS):
            stack.enter_context(openssh.jump_slot(behind))
        assert other_process() == "taken", "another process waits while this one holds every slot"
    assert other_process() == "free"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from launch.transport.jump import take_jump_slot as t; "
         "[t(('login.lab.example', 22)) for _ in range(8)]; print('held', flush=True); time.sleep(60)"],
        env={**os.environ, "FLEETRUN_HOME": str(tmp_path / "home")}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert other_process() == "taken"
    finally:
        holder.kill()
        holder.wait()
    assert other_process() == "free", "a killed holder's slots are free again"
