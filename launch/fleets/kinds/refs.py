"""Re-export: the fleet references are plain data of an inventory, in ``launch.job.fleet_refs``
(the inventory is below the fleet kinds that act on them)."""

from launch.job.fleet_refs import (  # noqa: F401 - re-exported: the fleet kinds import them from here
    BUCKET_PATTERN,
    LOCAL_ENDPOINT_PATTERN,
    NAME_PATTERN,
    PREFIX_PATTERN,
    FleetRef,
    LabFleet,
    LocalFleetRef,
    SlurmFleetRef,
    StackFleetRef,
)
