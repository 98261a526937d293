"""One settings object for the operator's side of fleetrun: defaults, then the environment.

Why one object: the environment used to be read wherever a value was needed (paths, the local
fleet's prefix, the Pulumi project), and each fan-out had its own parallelism default (64, 32,
16). Now the environment is read here only, once per command at the CLI edge
(``launch.cli.tasks`` runs each command inside ``active(Settings.from_env())``), and the values
go down as parameters where a function takes one (``max_parallel``, ``project_dir``). The few
modules that need a path at depth (``launch.paths``) ask ``current()`` rather than the environment.

Playbook values are not here: they belong to one job and are validated with its playbook
(``launch.job.spec.JobSpec``), which is passed down beside these.

=======================  ===========================================  ==========================
environment              meaning                                      default
=======================  ===========================================  ==========================
FLEETRUN_HOME            keys, known_hosts, local fleets, Pulumi       ``~/.fleetrun``
                         projects of an installed package
FLEETRUN_RUNS            run folders and ``runs.db``                  ``$FLEETRUN_HOME/runs``
FLEETRUN_IMAGE_DIR       the local fleet's shared Python image        ``/opt/fleetrun/image``
FLEETRUN_LOCAL_PREFIX    the local fleet's name prefix                ``fr``
FLEETRUN_LOCAL_SUBNET    the local fleet's 198.18.<subnet>.0/24       ``0``
FLEETRUN_PROJECT_DIR     where ``Pulumi.<stack>.yaml`` configs are    the current directory
FLEETRUN_FANOUT          nodes worked on at once (SSH, sync, polls)   ``64``
=======================  ===========================================  ==========================
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launch.errors import FleetrunError

DEFAULT_FANOUT = 64
"""Nodes worked on at once by every fan-out (commands, syncs, polls) unless told otherwise.

One persistent SSH connection and one thread per node in flight; the open-files limit is raised to
match. 64 holds on a laptop (see the README's scale table) and covers a 64-node fleet in one round.
"""
MAX_FANOUT = 4096
DEFAULT_LOCAL_PREFIX = "fr"
DEFAULT_IMAGE_DIR = Path("/opt/fleetrun/image")
"""Outside /root so that node users can run it (like a machine image, kept between fleets)."""


class SettingsError(FleetrunError):
    """An environment variable fleetrun reads has a value it cannot use."""


@dataclass(frozen=True)
class Settings:
    home: Path
    runs: Path
    image_dir: Path = DEFAULT_IMAGE_DIR
    local_prefix: str = DEFAULT_LOCAL_PREFIX
    local_subnet: int = 0
    project_dir: Path | None = None
    """Where the stack configs are; ``None``: the current directory when a command needs them."""
    fanout: int = DEFAULT_FANOUT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by ``FLEETRUN_*`` variables; a bad value names its variable."""
        env = os.environ if environ is None else environ
        home = Path(env.get("FLEETRUN_HOME") or Path.home() / ".fleetrun").expanduser()
        project = env.get("FLEETRUN_PROJECT_DIR")
        return cls(
            home=home,
            runs=Path(env.get("FLEETRUN_RUNS") or home / "runs").expanduser(),
            image_dir=Path(env.get("FLEETRUN_IMAGE_DIR") or DEFAULT_IMAGE_DIR).expanduser(),
            local_prefix=env.get("FLEETRUN_LOCAL_PREFIX") or DEFAULT_LOCAL_PREFIX,
            local_subnet=_whole_number(env, "FLEETRUN_LOCAL_SUBNET", 0, 0, 255),
            project_dir=Path(project).expanduser() if project else None,
            fanout=_whole_number(env, "FLEETRUN_FANOUT", DEFAULT_FANOUT, 1, MAX_FANOUT),
        )

    def with_fanout(self, fanout: int | None) -> Settings:
        """These settings with a command-line ``--parallel`` (``None`` or 0: unchanged)."""
        if not fanout:
            return self
        if not 1 <= fanout <= MAX_FANOUT:
            raise SettingsError(f"--parallel {fanout}: expected 1 to {MAX_FANOUT}")
        return dataclasses.replace(self, fanout=fanout)


def _whole_number(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name}={text[:40]!r}: expected a whole number from {low} to {high}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value}: expected a whole number from {low} to {high}")
    return value


_active: Settings | None = None


def current() -> Settings:
    """The settings of the command being run; outside one (library use, tests), the environment now."""
    return _active if _active is not None else Settings.from_env()


@contextmanager
def active(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` the ones ``current()`` returns while a command runs (all its threads)."""
    global _active
    previous, _active = _active, settings
    try:
        yield settings
    finally:
        _active = previous
