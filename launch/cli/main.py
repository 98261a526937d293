"""``fleetrun``, the console script: the same commands as ``fab``, without Fabric's command line.

``fleetrun -l``, ``fleetrun train PLAYBOOK --dry-run``, ``fleetrun local.up`` run the tasks of
``launch.cli.tasks.ns``, the collection ``fab`` loads through ``fabfile.py`` in a checkout, so the
two cannot drift. It is Invoke's ``Program`` over that collection: the commands' arguments and
``--help`` are the same as with ``fab``, without Fabric's host flags (``-H``, ``-i``...), which
fleetrun's commands do not use (hosts come from ``--inventory``). It works from any directory;
no fabfile is searched for.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from invoke import Program

from launch.cli.tasks import ns


def fleetrun_version() -> str:
    try:
        return version("fleetrun")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def program() -> Program:
    return Program(namespace=ns, name="fleetrun", binary="fleetrun", version=fleetrun_version())


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fleetrun`` script; ``argv`` as ``sys.argv`` (program name first)."""
    program().run(argv)


if __name__ == "__main__":
    main()
