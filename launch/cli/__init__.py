"""Commands: the Fabric tasks (``fab``), the ``fleetrun`` console script, and what they call."""
