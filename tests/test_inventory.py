"""Inventories: static YAML, stack outputs, known_hosts; bad ones fail naming the host and field."""

from __future__ import annotations

import json
from pathlib import Path

import paramiko
import pytest

from launch.errors import SpecError
from launch.fleets.cloud_stack import write_outputs_json
from launch.fleets.kinds.refs import StackFleetRef
from launch.fleets.kinds.stack import inventory_from_stack_outputs, load_outputs_file
from launch.job.inventory import Inventory

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3ENAj6vRFYnzbm3iOpU9jEnRh9WI4cXMQxfHrT4EAP"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


GOOD = f"""
defaults: {{user: alice, key: id_ed25519, port: 22}}
hosts:
  - {{name: gpu1, address: 192.0.2.10, private_address: 10.1.0.10, gpus: 8, host_key: "{KEY_A}"}}
  - {{name: gpu2, address: 192.0.2.11, private_address: 10.1.0.11, gpus: 8, port: 2222, host_key: "{KEY_B}"}}
"""


def test_static_inventory(tmp_path: Path) -> None:
    inv = Inventory.from_static_yaml(write(tmp_path, GOOD))
    assert [h.name for h in inv.hosts] == ["gpu1", "gpu2"]
    assert inv.head.private_address == "10.1.0.10"
    assert inv.hosts[1].port == 2222 and inv.hosts[1].user == "alice"
    assert inv.hosts[0].key == (tmp_path / "id_ed25519").resolve()


def test_known_hosts_written_from_pinned_keys_only(tmp_path: Path) -> None:
    inv = Inventory.from_static_yaml(write(tmp_path, GOOD))
    kh = inv.write_known_hosts(tmp_path / "kh")
    lines = kh.read_text().splitlines()
    assert lines == [f"192.0.2.10 {KEY_A}", f"[192.0.2.11]:2222 {KEY_B}"]
    assert oct(kh.stat().st_mode & 0o777) == "0o600"
    # paramiko reads the same file and finds the non-default port under its bracketed name
    keys = paramiko.HostKeys(str(kh))
    assert keys.lookup("[192.0.2.11]:2222") is not None
    assert keys.lookup("192.0.2.11") is None


def test_known_hosts_written_by_many_runs_at_once(tmp_path: Path) -> None:
    """Two runs of one inventory started together write the same known_hosts file: each through
    a temporary name of its own (a shared ``.tmp`` was renamed away under the other writer)."""
    from concurrent.futures import ThreadPoolExecutor

    inv = Inventory.from_static_yaml(write(tmp_path, GOOD))
    target = tmp_path / "kh"
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda _i: inv.write_known_hosts(target), range(400)))
    assert done == [target] * 400
    assert target.read_text().splitlines() == [f"192.0.2.10 {KEY_A}", f"[192.0.2.11]:2222 {KEY_B}"]
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("gpu2", "gpu1"), "duplicate host name 'gpu1'"),
        (
            GOOD.replace("port: 2222", "port: 70000"),
            "field 'hosts[1].port': expected a value less than or equal to 65535, got 70000",
        ),
        (GOOD.replace("port: 2222", "port: ssh"), "field 'hosts[1].port'"),
        (GOOD.replace(f'host_key: "{KEY_B}"', 'host_key: "not-a-key"'), "field 'hosts[1].host_key'"),
        (GOOD.replace(f', host_key: "{KEY_B}"', ""), "field 'hosts[1].host_key': this field is required"),
        (
            GOOD.replace("192.0.2.11, private", "192.0.2.10, port: 22, private").replace("port: 2222, ", ""),
            "duplicate address 192.0.2.10:22",
        ),
        (GOOD.replace("address: 192.0.2.10", "address: 'bad host!'"), "field 'hosts[0].address'"),
        ("hosts: []\n", "field 'hosts'"),
        (GOOD + "extra: 1\n", "field 'extra': unknown; a lab inventory has only 'defaults' and 'hosts'"),
    ],
)
def test_broken_inventory(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        Inventory.from_static_yaml(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


DNS_HOSTS = f"""
defaults: {{user: alice}}
hosts:
  - {{name: gpu1, address: gpu1.lab.example, host_key: "{KEY_A}"}}
  - {{name: gpu2, address: gpu2.lab.example, host_key: "{KEY_B}"}}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("name: gpu2", "name: GPU1"),
            "duplicate host name 'GPU1' (as 'gpu1': names ignore case)",
        ),
        (
            DNS_HOSTS.replace("gpu2.lab.example", "GPU1.LAB.example"),
            "duplicate address GPU1.LAB.example:22 (the same machine as gpu1.lab.example)",
        ),
        (
            DNS_HOSTS.replace("gpu1.lab.example", "'2001:db8::11'").replace(
                "gpu2.lab.example", "'2001:DB8:0:0::11'"
            ),
            "duplicate address 2001:db8::11:22",  # the address is kept in its canonical spelling
        ),
    ],
)
def test_one_machine_spelt_two_ways_is_a_duplicate(tmp_path: Path, text: str, expected: str) -> None:
    """gpu1/GPU1 (or the same DNS name or IPv6 address in other letters) would be one machine used
    as two ranks, and one run folder on a case-insensitive laptop disk."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        Inventory.from_static_yaml(path)
    assert str(path) in str(info.value) and expected in str(info.value), str(info.value)


def test_hosts_that_differ_by_more_than_case_are_kept(tmp_path: Path) -> None:
    inv = Inventory.from_static_yaml(
        write(tmp_path, DNS_HOSTS.replace("gpu2.lab.example", "gpu1b.lab.example"))
    )
    assert [h.address for h in inv.hosts] == ["gpu1.lab.example", "gpu1b.lab.example"]


def test_first_n_hosts_or_clear_error(tmp_path: Path) -> None:
    inv = Inventory.from_static_yaml(write(tmp_path, GOOD))
    assert [h.name for h in inv.first(1).hosts] == ["gpu1"]
    with pytest.raises(SpecError, match="asks for 3 nodes but inventory .* has only 2 \\(gpu1, gpu2\\)"):
        inv.first(3)


def stack_outputs() -> dict:
    return {
        "fleetrun_contract": 1,
        "cluster_id": "fr-abc123",
        "cloud": "aws",
        "region": "us-east-1",
        "bucket": "fr-abc123-artifacts",
        "ssh_user": "ubuntu",
        "nodes": [
            {
                "name": "n1",
                "rank": 1,
                "public_ip": "203.0.113.2",
                "private_ip": "10.0.1.11",
                "gpus": 8,
                "instance_type": "p4d.24xlarge",
                "instance_id": "i-2",
                "host_key": KEY_B,
            },
            {
                "name": "n0",
                "rank": 0,
                "public_ip": "203.0.113.1",
                "private_ip": "10.0.1.10",
                "gpus": 8,
                "instance_type": "p4d.24xlarge",
                "instance_id": "i-1",
                "host_key": KEY_A,
            },
        ],
    }


def test_stack_outputs_inventory_orders_by_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    path = write_outputs_json(stack_outputs(), tmp_path / "outputs.json")  # fleetrun's own: trusted
    inv = load_outputs_file(path, save_key=False, key_path=tmp_path / "key")
    assert [h.name for h in inv.hosts] == ["n0", "n1"]
    assert inv.head.address == "203.0.113.1" and inv.head.private_address == "10.0.1.10"
    assert inv.fleet == StackFleetRef(cluster_id="fr-abc123", cloud="aws", bucket="fr-abc123-artifacts")
    assert inv.hosts[0].gpus == 8


def test_stack_outputs_bad_contract() -> None:
    data = stack_outputs()
    del data["nodes"][0]["host_key"]
    with pytest.raises(
        SpecError, match=r"stack outputs: field 'nodes\[0\].host_key': this field is required"
    ):
        inventory_from_stack_outputs(data)


@pytest.mark.parametrize(
    ("address", "error"),
    [
        ("fe80::1%eth0", "scope ids"),
        ("fe80::1%x,*", "scope ids"),
        ("[2001:db8::1]", "without brackets"),
        ("2001:db8::1\n", "expected an IP address or a DNS name"),
        ("gpu1.lab\n", "expected an IP address or a DNS name"),
    ],
)
def test_addresses_full_match_and_no_ipv6_scope(tmp_path: Path, address: str, error: str) -> None:
    path = write(tmp_path, GOOD.replace("address: 192.0.2.10", f"address: {json.dumps(address)}"))
    with pytest.raises(SpecError, match=f"field 'hosts\\[0\\].address': .*{error}"):
        Inventory.from_static_yaml(path)


def test_ipv6_is_kept_compressed(tmp_path: Path) -> None:
    inv = Inventory.from_static_yaml(
        write(tmp_path, GOOD.replace("address: 192.0.2.10", "address: '2001:DB8:0:0::10'"))
    )
    assert inv.head.address == "2001:db8::10"
    assert inv.head.rsync_target("x/") == "alice@[2001:db8::10]:x/"


def test_a_replaced_jump_host_is_repinned_on_the_hosts_behind_it() -> None:
    """Recovery replaced the head that is the workers' jump host: its new key is pinned on their
    ``proxy_jump`` too, so the rewritten inventory is valid and the old key is trusted nowhere."""
    from launch.job.inventory import Host, JumpHost

    head = Host(name="head", address="203.0.113.5", user="alice", host_key=KEY_A)
    jump = JumpHost(address="203.0.113.5", user="alice", host_key=KEY_A)
    worker = Host(name="w1", address="10.0.0.2", user="alice", host_key=KEY_B, proxy_jump=jump)
    other = Host(name="w2", address="10.0.0.3", user="alice", host_key=KEY_B)
    fresh = head.model_copy(update={"host_key": KEY_B})
    hosts = [h.repinned(fresh) for h in (head, worker, other)]
    assert hosts[0] == fresh and hosts[2] == other
    assert hosts[1].proxy_jump is not None and hosts[1].proxy_jump.host_key == KEY_B
    assert hosts[1].host_key == KEY_B and hosts[1].address == "10.0.0.2", "the worker itself unchanged"
    Inventory(hosts=hosts)  # one key per endpoint again: valid
    with pytest.raises(ValueError, match="one machine has one key"):
        Inventory(hosts=[fresh, worker])
    assert worker.repinned(other.model_copy(update={"name": "w9"})) == worker, "another machine: unchanged"
