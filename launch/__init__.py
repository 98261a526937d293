"""fleetrun's launch library: job specs, inventories, launch plans, and the tasks that run them.

The pure packages (``job``, ``planning``, ``rules``, ``reports``) import neither Fabric, paramiko,
subprocess nor Pulumi (``tests/test_layout.py`` checks it), so they can be reasoned about and
tested without a network. I/O lives at the edges: ``transport`` (SSH, rsync), ``run`` (one run's
life cycle), ``fleets`` (where machines come from), ``cli`` (commands). ``nodelib`` is shipped to
nodes. The contract shared with ``infra`` is the top-level package ``fleetrun_contract``.
"""

__version__ = "0.1.0"
