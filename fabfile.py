"""fleetrun's collection for Fabric's own ``fab`` script: ``fab -l`` lists the tasks.

fleetrun installs a ``fab`` of its own (``launch.cli.main.fab``) that needs no fabfile; this one
serves where Fabric's script was installed last (Fabric reinstalled after fleetrun). All logic
lives in ``launch``.
"""

from launch.cli.tasks import ns  # noqa: F401
