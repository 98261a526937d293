"""fleetrun's Fabric entry point: ``fab -l`` lists the tasks. All logic lives in ``launch``."""

from launch.cli.tasks import ns  # noqa: F401
