"""Plans that stay correct under messy input: IPv6 bracketed, secrets masked, files private, no keys on dry runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from launch.cli.app import make_plan
from launch.errors import SpecError
from launch.fleets.cloud_stack import write_outputs_json
from launch.fleets.select import load_inventory
from launch.job.inventory import Host, Inventory
from launch.job.shell_text import control_operators
from launch.job.spec import JobSpec
from launch.planning import cluster_ssh
from launch.planning.launchers.horovod import HorovodLauncher
from launch.run.run_folder import RunFolder
from launch.transport.sync import rsync_argv
from tests.conftest import SAMPLE_HOST_KEYS

REPO = Path(__file__).resolve().parent.parent
FAB = Path(sys.executable).parent / "fab"


def v6_inventory(n: int = 2, port: int = 22) -> Inventory:
    hosts = [
        Host(
            name=f"n{i}",
            address=f"2001:db8::{i + 10:x}",
            private_address=f"fd00:0:0:0::{i + 10:x}",
            user="u",
            port=port,
            host_key=SAMPLE_HOST_KEYS[i],
            gpus=1,
        )
        for i in range(n)
    ]
    return Inventory(hosts=hosts, source="v6.yaml")


def spec(tmp_path: Path, **kw: object) -> JobSpec:
    fields: dict[str, object] = {
        "name": "job",
        "workdir": tmp_path,
        "entrypoint": "python -m trainer.task",
        "nodes": 2,
    }
    fields.update(kw)
    return JobSpec.model_validate(fields)


# -- IPv6 -----------------------------------------------------------------------------------------


def test_ipv6_addresses_are_compressed_and_bracketed_where_a_port_follows(tmp_path: Path) -> None:
    inv = v6_inventory()
    assert inv.head.private_address == "fd00::a", "kept in the form `ip` prints"
    plan = make_plan(spec(tmp_path, rdzv_port=29500), inv, run_id="job-1")
    auto = make_plan(spec(tmp_path), inv, run_id="job-1")
    assert all('--rdzv-endpoint=[fd00::a]:"$MASTER_PORT"' in (n.command or "") for n in auto.nodes)
    for rank, node in enumerate(plan.nodes):
        assert "--rdzv-endpoint=[fd00::a]:29500" in (node.command or "")
        assert f"--local-addr=fd00::{rank + 10:x}" in (node.command or "")
        assert json.loads(node.env["TF_CONFIG"])["cluster"]["worker"] == ["[fd00::a]:2222", "[fd00::b]:2222"]
        assert node.env["MASTER_ADDR"] == "fd00::a", "a host, not an endpoint: no brackets"
        assert "ip -o -6 addr show" in (node.launch_script or "")
    assert "u@[2001:db8::a]:22" in plan.render()


def test_ipv6_rsync_target_and_known_hosts(tmp_path: Path) -> None:
    inv = v6_inventory(port=2222)
    host = inv.head
    argv = rsync_argv(tmp_path, host, ".fleetrun/work/job", tmp_path / "kh", [])
    assert argv[-1] == "u@[2001:db8::a]:.fleetrun/work/job/"
    kh = inv.write_known_hosts(tmp_path / "kh")
    assert kh.read_text().splitlines()[0] == f"[2001:db8::a]:2222 {SAMPLE_HOST_KEYS[0]}"
    assert paramiko.HostKeys(str(kh)).lookup("[2001:db8::a]:2222") is not None


def test_horovod_refuses_ipv6_private_addresses_naming_the_field(tmp_path: Path) -> None:
    launcher = HorovodLauncher(cluster_ssh.ClusterKey("k", "ssh-ed25519 AAAA t", "t"), "echo\n")
    with pytest.raises(SpecError, match=r"v6.yaml: field 'hosts\[0\].private_address'.*IPv6"):
        launcher.plan(spec(tmp_path, launcher="horovod"), v6_inventory(), "job-1")


# -- secrets ----------------------------------------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf_live_0123456789",
    "WANDB_API_KEY": "wandb-secret-value",
    "db_password": "p@ss'word\nsecond line",
    "PLAIN": "listed-in-secret-env",
}


def test_secret_values_are_masked_in_render_but_reach_the_nodes(tmp_path: Path) -> None:
    s = spec(tmp_path, env={**SECRETS, "OMP_NUM_THREADS": "1"}, secret_env=["PLAIN"])
    plan = make_plan(s, v6_inventory(), run_id="job-1")
    text = plan.render()
    for key, value in SECRETS.items():
        assert f"export {key}=***" in text
        for part in value.split("\n"):
            assert part not in text, f"{key}'s value leaked into the plan text"
    assert "export OMP_NUM_THREADS=1" in text, "ordinary values are shown"
    # The launch script the node receives exports the real values: run it up to the exports.
    script = plan.nodes[1].launch_script or ""
    exports = "\n".join(line for line in script.split("\nexport PYTHONPATH")[0].splitlines()[3:])
    out = subprocess.run(
        [
            "sh",
            "-c",
            exports + '\nprintf "%s\\0%s\\0%s\\0%s" "$HF_TOKEN" "$WANDB_API_KEY" "$db_password" "$PLAIN"',
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"HOME": str(tmp_path)},
    ).stdout
    assert out.split("\0") == list(SECRETS.values())


def test_horovod_rank_script_has_the_secret_and_its_render_does_not(tmp_path: Path) -> None:
    key = cluster_ssh.ClusterKey("private", "ssh-ed25519 AAAAC3Nza t", "t")
    inv = Inventory(
        hosts=[
            Host(name=f"n{i}", address=f"10.0.0.{i + 1}", user="u", host_key=SAMPLE_HOST_KEYS[i])
            for i in range(2)
        ],
        source="inline",
    )
    plan = HorovodLauncher(key, "echo\n").plan(
        spec(tmp_path, launcher="horovod", env={"HF_TOKEN": "hf_rank_secret"}), inv, "job-1"
    )
    rank_files = [f for f in plan.nodes[1].files if f.path.endswith("rank.sh")]
    assert "export HF_TOKEN=hf_rank_secret" in rank_files[0].content
    assert "hf_rank_secret" not in plan.render() and "export HF_TOKEN=***" in plan.render()


def test_run_folder_is_private_and_plan_txt_0600(tmp_path: Path) -> None:
    folder = RunFolder.create("job-1", base=tmp_path)
    plan_txt = folder.write_text("plan.txt", "secret-free text")
    assert stat.S_IMODE(folder.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(plan_txt.stat().st_mode) == 0o600
    plan_txt.chmod(0o644)
    folder.write_text("plan.txt", "again")
    assert stat.S_IMODE(plan_txt.stat().st_mode) == 0o600, "an existing file is made private too"


def test_outputs_export_is_quoted_and_expands_home(tmp_path: Path) -> None:
    plan = make_plan(spec(tmp_path, outputs="out/ckpt-1"), v6_inventory(), run_id="job-1")
    script = plan.nodes[0].launch_script or ""
    line = next(x for x in script.splitlines() if x.startswith("export FLEETRUN_OUTPUT_DIR="))
    assert line == 'export FLEETRUN_OUTPUT_DIR="$HOME"/.fleetrun/runs/job-1/out/ckpt-1'
    out = subprocess.run(
        ["sh", "-c", line + '; printf %s "$FLEETRUN_OUTPUT_DIR"'],
        capture_output=True,
        text=True,
        env={"HOME": "/home/a b"},
        check=True,
    ).stdout
    assert out == "/home/a b/.fleetrun/runs/job-1/out/ckpt-1"


# -- dry runs create nothing; a real load saves the stack's key ------------------------------------


def _write_case(tmp_path: Path, launcher: str) -> tuple[Path, Path]:
    (tmp_path / "code").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "demo",
                "workdir": "code",
                "launcher": launcher,
                "entrypoint": "python -m t",
                "nodes": 2,
                "env": {"MY_SECRET": "s3cr3t-value"},
            }
        )
    )
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        yaml.safe_dump(
            {
                "defaults": {"user": "alice"},
                "hosts": [
                    {"name": f"g{i}", "address": f"192.0.2.{i + 10}", "host_key": SAMPLE_HOST_KEYS[i]}
                    for i in range(2)
                ],
            }
        )
    )
    return job, hosts


def test_cli_dry_run_of_horovod_writes_no_key_and_masks_secrets(tmp_path: Path) -> None:
    job, hosts = _write_case(tmp_path, "horovod")
    home = tmp_path / "fleetrun-home"
    env = {**os.environ, "FLEETRUN_HOME": str(home)}
    proc = subprocess.run(
        [str(FAB), "train", str(job), "--inventory", str(hosts), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "export MY_SECRET=***" in proc.stdout and "s3cr3t-value" not in proc.stdout
    assert "cluster-key-generated-for-each-run" in proc.stdout
    assert not home.exists() or not any(home.rglob("*")), "a dry run creates no key and no folder"


def stack_outputs(key: str | None) -> dict[str, object]:
    return {
        "fleetrun_contract": 1,
        "cluster_id": "fr-abc123",
        "cloud": "aws",
        "region": "us-east-1",
        "bucket": "team-bucket",
        "ssh_user": "ubuntu",
        "ssh_private_key": key,
        "nodes": [
            {
                "name": f"node{i}",
                "rank": i,
                "private_ip": f"10.0.1.{i + 10}",
                "public_ip": f"54.0.0.{i + 1}",
                "instance_type": "t3",
                "instance_id": f"i-{i}",
                "host_key": SAMPLE_HOST_KEYS[i],
            }
            for i in range(2)
        ],
    }


def test_stack_outputs_json_uses_and_saves_the_generated_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    out = tmp_path / "out.json"
    # written by fleetrun (`fab up --outputs`): the only outputs file it trusts (issue 24, item 7)
    write_outputs_json(
        stack_outputs("-----BEGIN OPENSSH PRIVATE KEY-----\nxyz\n-----END OPENSSH PRIVATE KEY-----"), out
    )
    dry = load_inventory(str(out), save_keys=False)
    assert not (tmp_path / "home" / "keys").exists(), "--dry-run writes no private key"
    assert dry.head.key is None
    inv = load_inventory(str(out))
    key_file = tmp_path / "home" / "keys" / "fr-abc123"
    assert all(h.key == key_file for h in inv.hosts), "the stack's key is the one used"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "xyz" in key_file.read_text()
    write_outputs_json(stack_outputs(None), out)
    assert load_inventory(str(out)).head.key is None


def test_stack_outputs_json_not_written_by_fleetrun_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24, item 7: a .json from anywhere would decide the sudo power-off hook on the hosts it
    lists and the bucket run data goes to; only a file fleetrun wrote (recorded by its hash) is
    trusted, byte for byte."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    foreign = tmp_path / "colleague.json"
    foreign.write_text(json.dumps(stack_outputs("-----BEGIN OPENSSH PRIVATE KEY-----\nxyz\n-----END")))
    with pytest.raises(SpecError, match=r"colleague.json: stack outputs that fleetrun did not write"):
        load_inventory(str(foreign))
    assert not (tmp_path / "home" / "keys").exists(), "a refused file's key is not written"
    ours = write_outputs_json(stack_outputs(None), tmp_path / "ours.json")
    assert load_inventory(str(ours)).fleet.kind == "stack"
    edited = json.loads(ours.read_text())
    edited["bucket"] = "someone-elses-bucket"
    ours.write_text(json.dumps(edited))
    with pytest.raises(SpecError, match="did not write"):
        load_inventory(str(ours))


def test_stack_outputs_are_trusted_for_the_bytes_parsed_not_a_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30, item 7: a file swapped between the read that is hashed and the read that is
    parsed must not lend fleetrun's record to other outputs. Every open of the file here returns
    the recorded bytes and the foreign ones in turn; whatever is used is the recorded file's."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    ours = write_outputs_json(stack_outputs(None), tmp_path / "ours.json")
    trusted = ours.read_bytes()
    edited = json.loads(trusted)
    edited["bucket"] = "someone-elses-bucket"
    foreign = json.dumps(edited).encode()
    turns = iter([trusted, foreign] * 5)
    real_open = Path.open

    def swapping_open(self: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
        if self == ours and mode == "rb":
            with real_open(ours, "wb") as handle:
                handle.write(next(turns))
        return real_open(self, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", swapping_open)
    inventory = load_inventory(str(ours))
    assert inventory.fleet.bucket != "someone-elses-bucket", "the foreign bytes were parsed as trusted"


def test_outputs_json_is_written_through_an_unpredictable_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fab up --outputs``: the old fixed ``<file>.tmp`` beside the target was followed when
    another user made it a symlink; now a planted ``.tmp`` symlink is left alone."""
    monkeypatch.setenv("FLEETRUN_HOME", str(tmp_path / "home"))
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "out.json.tmp").symlink_to(victim)
    path = write_outputs_json(stack_outputs(None), tmp_path / "out.json")
    assert victim.read_text() == "keep me" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["bucket"] == stack_outputs(None)["bucket"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "out.json", "out.json.tmp", "victim"], (
        "no temporary file left behind"
    )


# -- what validation accepts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entrypoint",
    [
        "python train.py > train.log 2>&1",
        "python train.py --seed $(date +%s)",
        "python train.py --msg 'a; b | c && d'",
        'python train.py --msg "x && y $(echo a;b)"',
        "python train.py --out ${FLEETRUN_OUTPUT_DIR}",
        r"python train.py a\;b",
    ],
)
def test_entrypoints_without_control_operators_are_accepted(tmp_path: Path, entrypoint: str) -> None:
    assert control_operators(entrypoint) == []
    assert spec(tmp_path, entrypoint=entrypoint).entrypoint == entrypoint


def _public(key: object) -> str:
    return (
        key.public_key()
        .public_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        .decode()
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        lambda: ec.generate_private_key(ec.SECP256R1()),
        lambda: ec.generate_private_key(ec.SECP384R1()),
    ],
)
def test_real_rsa_and_ecdsa_host_keys_are_accepted(make: object) -> None:
    public = _public(make())  # type: ignore[operator]
    host = Host(name="h", address="192.0.2.1", user="u", host_key=public + " root@h")
    assert host.host_key == public


def test_ecdsa_blob_with_another_curve_is_refused() -> None:
    public = _public(ec.generate_private_key(ec.SECP256R1()))
    blob = public.split()[1]
    with pytest.raises(ValueError, match="declared ecdsa-sha2-nistp384"):
        Host(name="h", address="192.0.2.1", user="u", host_key=f"ecdsa-sha2-nistp384 {blob}")


def test_inventory_with_merge_keys_and_overrides_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "hosts:\n"
        f"  - &base {{name: g0, address: 192.0.2.10, user: alice, host_key: '{SAMPLE_HOST_KEYS[0]}'}}\n"
        f"  - {{<<: *base, name: g1, address: 192.0.2.11, host_key: '{SAMPLE_HOST_KEYS[1]}'}}\n"
    )
    inv = Inventory.from_static_yaml(path)
    assert [(h.name, h.user) for h in inv.hosts] == [("g0", "alice"), ("g1", "alice")]
