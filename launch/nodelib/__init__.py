"""Code that fleetrun copies to every node (``~/.fleetrun/lib``), standard library only.

Nothing here imports fleetrun itself: nodes do not have fleetrun installed.
"""
