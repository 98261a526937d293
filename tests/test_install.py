"""The wheel works installed, away from the checkout: console script, ``fab``, dry-run, runtime files.

Builds the wheel, installs it into a fresh virtual environment outside the checkout (no system
site-packages; dependencies from the warm pip cache, torch not among them), and runs from a
temporary folder that holds only a playbook, its code and a lab inventory:

* ``fleetrun -l`` and ``fab -l`` list the tasks: ``fab`` is fleetrun's own script (installed over
  Fabric's), so it needs no ``fabfile.py`` (and a one-line one still works);
* ``fleetrun train job.yaml --dry-run --inventory hosts.yaml`` prints the plan for both nodes
  (documentation-range addresses with pinned keys: a dry run connects to nothing);
* the runtime files and the Pulumi program are read from the venv's site-packages, not the checkout.

Marked ``install`` (deselect with ``-m "not install"``); ``make test`` runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parents[1]
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvhipRqRG6pVVv2ReJ6BqUyaR82FT9Wa5PVWfYDKj6l"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3ENAj6vRFYnzbm3iOpU9jEnRh9WI4cXMQxfHrT4EAP"

PLAYBOOK = """\
name: sample
workdir: code
launcher: torchrun
nodes: 2
procs_per_node: 1
entrypoint: python -m train --epochs 1
"""
INVENTORY = f"""\
defaults: {{user: alice, key: id_ed25519}}
hosts:
  - {{name: gpu1, address: 192.0.2.10, private_address: 10.1.0.10, gpus: 1, host_key: "{KEY_A}"}}
  - {{name: gpu2, address: 198.51.100.11, private_address: 10.1.0.11, gpus: 1, host_key: "{KEY_B}"}}
"""
INSTALLED_USER_FABFILE = "from launch.cli.tasks import ns  # noqa: F401\n"

# Where each runtime file and the Pulumi program come from, as the installed package sees them.
WHERE = """\
import json, sys
from pathlib import Path
import fleetrun_images, launch, infra.bootstrap
from fleetrun_contract import stack_outputs
from launch.fleets import pulumi_project
from launch.fleets.local.prereqs import runtime_file as localfleet_file
from launch.planning.launchers.horovod import INSTALL_SCRIPT_SOURCE
project = pulumi_project.resolve()
spec = __import__("yaml").safe_load((project.work_dir / "Pulumi.yaml").read_text())
print(json.dumps({
    "prefix": sys.prefix,
    "modules": [launch.__file__, fleetrun_images.__file__, stack_outputs.__file__, infra.bootstrap.__file__],
    "runtime_files": [str(fleetrun_images.runtime_file(n)) for n in fleetrun_images.RUNTIME_FILES],
    "horovod_install": str(INSTALL_SCRIPT_SOURCE),
    "local_requirements": str(localfleet_file("local/requirements.txt")),
    "cloud_init": str(infra.bootstrap.BOOTSTRAP_SCRIPT),
    "project_work_dir": str(project.work_dir),
    "project_main": str((project.work_dir / spec["main"]).resolve()),
    "project_configs": str((project.work_dir / spec["stackConfigDir"]).resolve()),
    "project_name": spec["name"],
    "virtualenv": spec["runtime"]["options"].get("virtualenv"),
}))
"""


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv, outside the checkout, holding the wheel built from this checkout."""
    root = tmp_path_factory.mktemp("install")
    assert not root.resolve().is_relative_to(REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Build from a copy of what git would commit: no stale build/ of the checkout leaks into the
    # wheel, and the checkout is not written to.
    source = root / "source"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, env=env)
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = root / "dist"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
        ],
        cwd=root,
        env=env,
    )
    wheels = list(dist.glob("fleetrun-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root, env=env)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    run([*pip, "install", "-q", "--no-compile", str(wheels[0])], cwd=root, env=env, timeout=300)
    return venv


@pytest.fixture
def workspace(installed: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder outside the checkout with a playbook, its code and a lab inventory; the venv first on PATH."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('training')\n")
    (tmp_path / "job.yaml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("FLEETRUN_")
    }
    env.update(
        PATH=f"{installed / 'bin'}{os.pathsep}{env.get('PATH', '')}", FLEETRUN_HOME=str(tmp_path / "home")
    )
    return tmp_path, env


def test_console_script_lists_the_tasks(workspace: tuple[Path, dict[str, str]], installed: Path) -> None:
    cwd, env = workspace
    out = run([str(installed / "bin" / "fleetrun"), "-l"], cwd, env)
    for name in ("train", "plan", "exec", "up", "down", "runs", "show", "local.up", "local.down"):
        assert f"  {name} " in out, out


def test_dry_run_prints_the_plan_for_every_node(
    workspace: tuple[Path, dict[str, str]], installed: Path
) -> None:
    cwd, env = workspace
    out = run(
        [str(installed / "bin" / "fleetrun"), "train", "job.yaml", "--dry-run", "--inventory", "hosts.yaml"],
        cwd,
        env,
    )
    assert "gpu1" in out and "gpu2" in out, out
    assert "192.0.2.10" in out and "198.51.100.11" in out, out
    assert "-m fleetrun_torchrun" in out and "-m train --epochs 1" in out, out
    assert not (cwd / "home" / "runs").exists()  # a dry run records nothing


def test_fab_through_a_one_line_fabfile(workspace: tuple[Path, dict[str, str]], installed: Path) -> None:
    cwd, env = workspace
    (cwd / "fabfile.py").write_text(INSTALLED_USER_FABFILE)
    out = run([str(installed / "bin" / "fab"), "-l"], cwd, env)
    for name in ("train", "exec", "local.up"):
        assert f"  {name} " in out, out
    plan = run([str(installed / "bin" / "fab"), "plan", "job.yaml", "--inventory", "hosts.yaml"], cwd, env)
    assert "gpu2" in plan, plan


def test_fab_without_a_fabfile_is_fleetrun(workspace: tuple[Path, dict[str, str]], installed: Path) -> None:
    """The installed ``fab`` is fleetrun's: outside a checkout it lists fleetrun's commands
    (not "Can't find any collection named 'fabfile'"), and a bad command line is exit code 2."""
    cwd, env = workspace
    fab = str(installed / "bin" / "fab")
    out = run([fab, "--help"], cwd, env)
    assert "Commands:" in out and "  train " in out and "Core options" not in out, out
    plan = run([fab, "plan", "job.yaml", "-i", "hosts.yaml"], cwd, env)
    assert "gpu2" in plan, plan
    bad = subprocess.run(
        [fab, "trian"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode == 2 and bad.stderr.startswith("fleetrun: error: unknown command 'trian'"), (
        bad.stderr
    )


def test_runtime_files_and_pulumi_program_come_from_the_installed_package(
    workspace: tuple[Path, dict[str, str]], installed: Path
) -> None:
    cwd, env = workspace
    where = json.loads(run([str(installed / "bin" / "python"), "-c", WHERE], cwd, env))
    site = Path(where["prefix"]).resolve()
    assert site == installed.resolve()
    files = [
        *where["modules"],
        *where["runtime_files"],
        where["horovod_install"],
        where["local_requirements"],
        where["cloud_init"],
        where["project_main"],
    ]
    for name in files:
        path = Path(name).resolve()
        assert path.exists(), name
        assert "site-packages" in path.parts and path.is_relative_to(site), name
        assert not path.is_relative_to(REPO), name
    # `fab up --stack` here would run a project written under FLEETRUN_HOME: the installed infra
    # program, the stack configs of this folder, this venv's Python.
    assert Path(where["project_work_dir"]).is_relative_to(cwd / "home" / "pulumi")
    assert (Path(where["project_main"]) / "__main__.py").is_file()
    assert Path(where["project_configs"]) == cwd.resolve()
    assert where["project_name"] == "fleetrun"
    assert Path(where["virtualenv"]).resolve() == site


KEY_C = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL/J25+urjtSlg/NzELnbVRULdpmj/2+A2qONlNFbs8h"
WORKDIR_OF = (
    "import sys; from launch.job.spec import load_job_spec; print(load_job_spec(sys.argv[1]).workdir)"
)
THREE_HOSTS = INVENTORY + (
    f'  - {{name: gpu3, address: 203.0.113.12, private_address: 10.1.0.12, gpus: 1, host_key: "{KEY_C}"}}\n'
)


def test_built_in_playbooks_run_by_name_and_copy_out(
    workspace: tuple[Path, dict[str, str]], installed: Path
) -> None:
    """Away from the checkout, ``digits-ddp`` (and the README's ``playbooks/digits-ddp.yaml``) name
    the installed built-in, whose workdir resolves to the installed example code; ``examples``
    copies both folders out, and the copy is what a path then names."""
    cwd, env = workspace
    (cwd / "three.yaml").write_text(THREE_HOSTS)
    fleetrun = str(installed / "bin" / "fleetrun")
    for name in ("digits-ddp", "playbooks/digits-ddp.yaml"):
        out = run([fleetrun, "train", name, "--dry-run", "--inventory", "three.yaml"], cwd, env)
        assert "gpu3" in out and "trainer.task --epochs 8" in out, out
    workdir = run([str(installed / "bin" / "python"), "-c", WORKDIR_OF, "digits-ddp"], cwd, env).strip()
    assert Path(workdir) == installed.resolve() / "share" / "fleetrun" / "examples" / "digits"
    run([fleetrun, "examples", "--into", "mine"], cwd, env)
    assert (cwd / "mine" / "examples" / "digits" / "trainer" / "task.py").is_file()
    assert (cwd / "mine" / "playbooks" / "sagemaker-csv.yaml").is_file()
    assert not list((cwd / "mine").rglob("__pycache__"))
    out = run(
        [fleetrun, "train", "mine/playbooks/digits-ddp.yaml", "--dry-run", "--inventory", "three.yaml"],
        cwd,
        env,
    )
    assert "gpu3" in out, out
    mine = run(
        [str(installed / "bin" / "python"), "-c", WORKDIR_OF, "mine/playbooks/digits-ddp.yaml"], cwd, env
    )
    assert Path(mine.strip()) == (cwd / "mine" / "examples" / "digits").resolve()
    again = subprocess.run(
        [fleetrun, "examples", "--into", "mine"], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert again.returncode == 2 and "already exists" in again.stderr, again
