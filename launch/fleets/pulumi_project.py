"""Which Pulumi project ``fab up``/``fab down``/``--inventory stack:<name>`` drive, checkout or installed.

A stack needs a project (``Pulumi.yaml``: its name, its runtime, where the program is) and the
stack's own config (``Pulumi.<stack>.yaml``). In a checkout both sit at the repository root, as
``pulumi`` users expect, and ``main: infra/`` is the program. An installed fleetrun has no
repository: the program is the installed ``infra`` package and the stack configs are the user's.

The rule: the stack configs are in ``--project-dir``, else ``$FLEETRUN_PROJECT_DIR``, else the
current directory. If that folder has its own ``Pulumi.yaml`` (the checkout, or a project of the
user's), it is the project, as is. Otherwise fleetrun writes one under
``$FLEETRUN_HOME/pulumi/<digest of the folder>/``: the same project name (it is part of every
cluster id, ``fleetrun_contract.cluster``), ``main:`` the installed ``infra`` package,
``stackConfigDir:`` the user's folder, and ``virtualenv:`` the environment fleetrun runs in, so
Pulumi runs the program with this Python and these packages. Pulumi resolves ``main`` and
``stackConfigDir`` relative to ``Pulumi.yaml``, so both are written as relative paths.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from fleetrun_contract.cluster import PROJECT_NAME
from launch.settings import Settings, current

GENERATED_NOTE = (
    "# Written by fleetrun (launch.fleets.pulumi_project) for an installed fleetrun; rewritten on use.\n"
)


@dataclass(frozen=True)
class PulumiProject:
    work_dir: Path
    """Where ``Pulumi.yaml`` is: the Automation API's ``work_dir``."""
    config_dir: Path
    """Where ``Pulumi.<stack>.yaml`` files are."""
    materialised: bool

    def stack_config(self, short_stack_name: str) -> Path:
        return self.config_dir / f"Pulumi.{short_stack_name}.yaml"


def resolve(project_dir: Path | str | None = None, settings: Settings | None = None) -> PulumiProject:
    """The project for stack configs in ``project_dir`` (default: settings' ``project_dir``, else the cwd)."""
    settings = settings or current()
    chosen = project_dir if project_dir not in (None, "") else settings.project_dir
    config_dir = Path(chosen or Path.cwd()).expanduser().resolve()
    if (config_dir / "Pulumi.yaml").is_file():
        return PulumiProject(work_dir=config_dir, config_dir=config_dir, materialised=False)
    return materialise(config_dir, settings.home / "pulumi")


def infra_program_dir() -> Path:
    """The ``infra`` package as installed (or, editable, in the checkout): Pulumi's ``main``."""
    return Path(str(files("infra")))


def project_file(work_dir: Path, config_dir: Path) -> dict[str, Any]:
    """The ``Pulumi.yaml`` for an installed fleetrun whose stack configs are in ``config_dir``."""
    options: dict[str, Any] = {"toolchain": "pip"}
    if sys.prefix != sys.base_prefix:  # in a virtual environment (venv, pipx): Pulumi uses it
        options["virtualenv"] = sys.prefix
    return {
        "name": PROJECT_NAME,
        "description": "fleetrun's GPU training cluster (the installed fleetrun's infra program)",
        "runtime": {"name": "python", "options": options},
        "main": os.path.relpath(infra_program_dir(), work_dir) + "/",
        "stackConfigDir": os.path.relpath(config_dir, work_dir),
    }


def materialise(config_dir: Path, root: Path) -> PulumiProject:
    """Write (or refresh) the project for ``config_dir`` under ``root``; one per config folder."""
    digest = hashlib.sha256(str(config_dir).encode()).hexdigest()[:12]
    work_dir = root / digest
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = GENERATED_NOTE + yaml.safe_dump(project_file(work_dir, config_dir), sort_keys=False)
    target = work_dir / "Pulumi.yaml"
    if not target.is_file() or target.read_text() != text:
        tmp = target.with_name("Pulumi.yaml.tmp")
        tmp.write_text(text)
        tmp.replace(target)
    return PulumiProject(work_dir=work_dir, config_dir=config_dir, materialised=True)
