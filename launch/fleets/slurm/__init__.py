"""Slurm through its login host: the commands fleetrun sends (``commands``), the typed parse of
what Slurm answers (``answers``), and the allocation's life (``allocation``). The fleet kind
``launch.fleets.kinds.slurm`` is the only user."""
