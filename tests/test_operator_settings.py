"""One settings object (environment read in one place), one fan-out default, and the Pulumi project rule."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from fleetrun_contract.cluster import PROJECT_NAME
from launch import paths
from launch.fleets import cloud_stack, pulumi_project
from launch.fleets.select import local_fleet
from launch.run.runner import RunOptions
from launch.settings import DEFAULT_FANOUT, Settings, SettingsError, active, current
from launch.transport import run_everywhere, ssh, sync, sync_relay

REPO = Path(__file__).resolve().parents[1]


def test_defaults_then_environment(tmp_path: Path) -> None:
    plain = Settings.from_env({})
    assert plain.home == Path.home() / ".fleetrun" and plain.runs == plain.home / "runs"
    assert (plain.local_prefix, plain.local_subnet, plain.fanout, plain.project_dir) == (
        "fr",
        0,
        DEFAULT_FANOUT,
        None,
    )
    env = {
        "FLEETRUN_HOME": str(tmp_path / "h"),
        "FLEETRUN_IMAGE_DIR": str(tmp_path / "img"),
        "FLEETRUN_LOCAL_PREFIX": "kx",
        "FLEETRUN_LOCAL_SUBNET": "41",
        "FLEETRUN_PROJECT_DIR": str(tmp_path / "stacks"),
        "FLEETRUN_FANOUT": "8",
    }
    s = Settings.from_env(env)
    assert s.home == tmp_path / "h" and s.runs == tmp_path / "h" / "runs"  # runs follow home
    assert (s.image_dir, s.local_prefix, s.local_subnet) == (tmp_path / "img", "kx", 41)
    assert (s.project_dir, s.fanout) == (tmp_path / "stacks", 8)
    assert Settings.from_env({**env, "FLEETRUN_RUNS": str(tmp_path / "r")}).runs == tmp_path / "r"


@pytest.mark.parametrize(
    ("name", "value"),
    [("FLEETRUN_FANOUT", "many"), ("FLEETRUN_FANOUT", "0"), ("FLEETRUN_LOCAL_SUBNET", "300")],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_parallel_flag_overrides_the_fanout() -> None:
    s = Settings.from_env({"FLEETRUN_FANOUT": "8"})
    assert s.with_fanout(0).fanout == 8 and s.with_fanout(3).fanout == 3
    with pytest.raises(SettingsError, match="--parallel"):
        s.with_fanout(10_000)


def test_active_settings_reach_the_paths_and_the_local_fleet(tmp_path: Path) -> None:
    chosen = Settings(home=tmp_path / "h", runs=tmp_path / "r", local_prefix="zz", local_subnet=7)
    with active(chosen):
        assert current() is chosen
        assert paths.fleetrun_home() == tmp_path / "h" and paths.runs_dir() == tmp_path / "r"
        fleet = local_fleet()
        assert (fleet.prefix, fleet.subnet) == ("zz", 7)
        assert local_fleet("ab", 3).prefix == "ab"
    assert current() is not chosen


def test_every_fan_out_shares_one_default() -> None:
    defaults = {
        "ssh.parallel_map": inspect.signature(ssh.parallel_map).parameters["max_parallel"].default,
        "ssh.Fleet": inspect.signature(ssh.Fleet).parameters["max_parallel"].default,
        "sync.sync_all": inspect.signature(sync.sync_all).parameters["max_parallel"].default,
        "sync_relay.sync_fleet": inspect.signature(sync_relay.sync_fleet).parameters["parallel"].default,
        "sync_relay.relay_sync": inspect.signature(sync_relay.relay_sync).parameters["parallel"].default,
        "run_everywhere": inspect.signature(run_everywhere.run_everywhere).parameters["max_parallel"].default,
        "RunOptions": RunOptions().max_parallel,
    }
    assert defaults == dict.fromkeys(defaults, DEFAULT_FANOUT)


def test_a_folder_with_its_own_project_is_used_as_is(tmp_path: Path) -> None:
    project = pulumi_project.resolve(REPO, Settings(home=tmp_path, runs=tmp_path))
    assert project == pulumi_project.PulumiProject(REPO, REPO, materialised=False)
    assert yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"] == PROJECT_NAME


def test_stack_configs_elsewhere_get_a_project_running_the_installed_program(tmp_path: Path) -> None:
    configs = tmp_path / "my-stacks"
    configs.mkdir()
    settings = Settings(home=tmp_path / "home", runs=tmp_path / "runs", project_dir=configs)
    project = pulumi_project.resolve(None, settings)
    assert project.materialised and project.config_dir == configs
    assert project.work_dir.parent == tmp_path / "home" / "pulumi"
    spec = yaml.safe_load((project.work_dir / "Pulumi.yaml").read_text())
    assert spec["name"] == PROJECT_NAME and spec["runtime"]["name"] == "python"
    main = (project.work_dir / spec["main"]).resolve()
    assert main == pulumi_project.infra_program_dir().resolve() and (main / "__main__.py").is_file()
    assert (project.work_dir / spec["stackConfigDir"]).resolve() == configs.resolve()
    assert project.stack_config("dev") == configs / "Pulumi.dev.yaml"
    assert (
        pulumi_project.resolve(configs, settings) == project
    )  # one project per config folder, rewritten in place


def test_a_missing_stack_config_names_the_users_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cloud_stack, "require_pulumi_cli", lambda: "/usr/bin/pulumi")
    monkeypatch.chdir(tmp_path)
    settings = Settings(home=tmp_path / "home", runs=tmp_path / "runs")
    missing = rf"no stack config {tmp_path}/Pulumi\.dev\.yaml"
    with active(settings), pytest.raises(cloud_stack.FleetrunError, match=missing):
        cloud_stack.stack_up("dev")
