"""``fleetrun``, the console script: the same commands as ``fab``, without Fabric's command line.

``fleetrun -l``, ``fleetrun train PLAYBOOK --dry-run``, ``fleetrun local.up`` run the tasks of
``launch.cli.tasks.ns``, the collection ``fab`` loads through ``fabfile.py`` in a checkout, so the
two cannot drift. It is Invoke's ``Program`` over that collection: the commands' arguments and
``--help`` are the same as with ``fab``, without Fabric's host flags (``-H``, ``-i``...), which
fleetrun's commands do not use (hosts come from ``--inventory``). It works from any directory;
no fabfile is searched for.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version

from invoke import Program

from launch.cli.tasks import ns


def fleetrun_version() -> str:
    try:
        return version("fleetrun")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


FIRST_STEPS = (
    ("fleetrun examples", "copy the built-in playbooks and example code into ./fleetrun-examples"),
    (
        "fleetrun doctor --inventory hosts.yaml",
        "check your machines: SSH, Python, rsync, GPUs, the rendezvous port",
    ),
    (
        "fleetrun train fleetrun-examples/playbooks/digits-ddp.yaml --inventory hosts.yaml",
        "sync, launch and watch a job (add --dry-run to only print the plan)",
    ),
)
"""The commands a new user needs first, in the order they need them (``fleetrun`` alone prints them)."""


class FleetrunProgram(Program):  # type: ignore[misc]
    """Invoke's program whose ``--help`` (and bare ``fleetrun``) is about fleetrun, not Invoke.

    Invoke's own help opens with its core options (``--hide``, ``--pty``, ``--write-pyc``...),
    which steer shell commands fleetrun's tasks never run; a new user saw those before the
    tasks. They still work; the help shows the first steps, then the commands."""

    def print_help(self) -> None:
        print(f"Usage: {self.binary} <command> [--options]   (fleetrun {self.version})")
        print("")
        print("Launch multi-node training jobs on machines you own or rent, watch them, record every run.")
        print("")
        print("First steps:")
        print("")
        for command, what in FIRST_STEPS:
            print(f"  {command}")
            print(f"      {what}")
        print("")
        if self.namespace is not None:
            self.list_tasks()
        print(
            f"'{self.binary} COMMAND --help' shows a command's options; '{self.binary} --version' its version."
        )

    def task_list_opener(self, extra: str = "") -> str:
        opener: str = super().task_list_opener(extra=extra)
        return "Commands" if opener == "Subcommands" else opener


def program() -> Program:
    return FleetrunProgram(namespace=ns, name="fleetrun", binary="fleetrun", version=fleetrun_version())


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fleetrun`` script; ``argv`` as ``sys.argv`` (program name first)."""
    try:
        program().run(argv)
    except BrokenPipeError:  # `fleetrun --help | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(1)


if __name__ == "__main__":
    main()
