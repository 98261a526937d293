"""``fab ssh-config`` and ``fab forward`` at their edges: where the config is written, what goes in
it, and a port that is not one (issue 30 item 10, issue 32 items 14-16). No node is contacted:
the inventory is two documentation-range hosts and the config is read back by ``ssh -G``."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from launch.cli.access import check_port, ssh_config
from launch.errors import FleetrunError, SpecError
from launch.job.inventory import Inventory, load_lab_inventory
from tests.conftest import fab, sample_inventory


def _lab(tmp_path: Path, key: str | None = None) -> Path:
    hosts = sample_inventory(2).to_yaml_data()["hosts"]
    if key is not None:
        hosts = [{**h, "key": key} for h in hosts]
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def _ssh_reads(config: Path, alias: str) -> dict[str, str]:
    """What OpenSSH's own parser makes of ``config`` for ``alias`` (``ssh -G``: nothing connects)."""
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), alias], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return {k: v for k, _, v in (line.partition(" ") for line in out.splitlines())}


def test_output_in_a_missing_folder_or_naming_a_folder_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    lab, home = _lab(tmp_path), tmp_path / "home"
    missing = fab("ssh-config", str(lab), "--output", str(tmp_path / "missing" / "x.conf"), home=home)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "its folder does not exist" in missing.stderr
    folder = tmp_path / "confs"
    folder.mkdir()
    into_folder = fab("ssh-config", str(lab), "--output", str(folder), home=home)
    assert into_folder.returncode == 2 and "Traceback" not in into_folder.stderr, into_folder.stderr
    assert "is a folder; name a file in it" in into_folder.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["confs", "home", "hosts.yaml"], "no .tmp left"
    assert not any(folder.iterdir())


def test_output_never_follows_a_planted_temporary_file(tmp_path: Path) -> None:
    """The old writer used ``<output>.tmp``: anyone who could write in that folder made it a
    symlink to a file of the user's, which the write then replaced with the ssh config."""
    lab, home = _lab(tmp_path), tmp_path / "home"
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA... mine\n")
    target = tmp_path / "fleetrun.conf"
    target.with_name("fleetrun.conf.tmp").symlink_to(victim)
    done = fab("ssh-config", str(lab), "--output", str(target), home=home)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "ssh-ed25519 AAAA... mine\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and "StrictHostKeyChecking yes" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "authorized_keys", "fleetrun.conf", "fleetrun.conf.tmp", "home", "hosts.yaml",
    ]  # fmt: skip


def test_a_home_with_a_space_is_quoted_as_openssh_reads_it(tmp_path: Path) -> None:
    """Issue 32 item 16: fleetrun's own known_hosts under a HOME with a space was refused, blaming
    the first host; a ``%`` in it is a token to OpenSSH. Both are written so ``ssh`` reads the
    real paths back."""
    home = tmp_path / "Jane Doe %h"
    key = home / "my keys" / "id_ed25519"
    inventory = load_lab_inventory(_lab(tmp_path, key=str(key)))
    known_hosts = home / ".fleetrun" / "known_hosts" / "abc"
    config = tmp_path / "config"
    config.write_text(ssh_config(inventory, known_hosts))
    seen = _ssh_reads(config, "fleetrun-n0")
    assert seen["userknownhostsfile"] == str(known_hosts)
    assert seen["identityfile"] == str(key).replace("%", "%%"), "-G shows it before its % expansion"
    assert seen["hostname"] == "203.0.113.1" and seen["stricthostkeychecking"] == "true"


def test_dollar_brace_in_a_path_is_refused_naming_whose_it_is(tmp_path: Path) -> None:
    """OpenSSH expands ``${VAR}`` in IdentityFile and UserKnownHostsFile (``-i`` too) and has no
    escape for it: a key path holding it is refused at the inventory, naming the field; fleetrun's
    own known_hosts path holding it names FLEETRUN_HOME, not a host. A lone ``$`` is left as is."""
    with pytest.raises(SpecError, match=r"hosts.yaml: field 'hosts\[0\].key'.*'\$\{'"):
        load_lab_inventory(_lab(tmp_path, key="/keys/${HOME}/id"))
    inventory = Inventory(hosts=sample_inventory(1).hosts)
    with pytest.raises(FleetrunError, match=r"fleetrun's own known_hosts path .*FLEETRUN_HOME") as caught:
        ssh_config(inventory, Path("/home/x/${EVIL}/known_hosts"))
    assert "host n0" not in str(caught.value)
    config = tmp_path / "config"
    config.write_text(ssh_config(inventory, tmp_path / "a$b" / "known_hosts"))
    assert _ssh_reads(config, "fleetrun-n0")["userknownhostsfile"] == str(tmp_path / "a$b" / "known_hosts")


@pytest.mark.parametrize("port", ["²", "٣", "0", "65536", "80a", ""])
def test_a_port_that_is_not_ascii_digits_in_range_is_the_port_error(port: str) -> None:
    with pytest.raises(SpecError, match="expected a TCP port from 1 to 65535"):
        check_port(port, "PORT")
    assert check_port(" 6006 ", "PORT") == 6006


def test_fab_forward_with_a_superscript_port_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    done = fab("forward", str(_lab(tmp_path)), "²", home=tmp_path / "home")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "PORT '²': expected a TCP port from 1 to 65535" in done.stderr
