"""fleetrun's launch library: job specs, inventories, launch plans, and the tasks that run them.

The pure modules (``spec``, ``inventory``, ``plan``, ``launchers``) import neither Fabric nor
Pulumi, so they can be reasoned about and tested without a network. The stack-outputs contract
shared with ``infra`` is the top-level package ``fleetrun_contract``; settings are ``launch.settings``.
I/O lives at the edges: ``ssh``, ``sync``, ``setup``, ``runner``, ``localfleet`` and ``tasks``.
"""

__version__ = "0.1.0"
