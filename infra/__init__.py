"""fleetrun's Pulumi program: one stack config in, one GPU training cluster out.

Layout (pure modules first; they import nothing from Pulumi, so they are testable alone):

* ``catalog``   machine types, regions and default images of each cloud (data only).
* ``presets``   named tiers (``basic-gpu``, ``multi-node``...) that expand into settings.
* ``settings``  the stack config model: parse, expand the preset, validate, name every bad key.
* ``bootstrap`` renders each node's cloud-init from ``images/cloud-init/``.
* ``config``    reads ``fleet:*`` from the Pulumi stack config into ``settings`` (Pulumi-facing).
* ``identity``  operator key pair and per-node SSH host keys (pulumi-tls).
* ``clouds``    one module per cloud behind one interface, looked up by name.
* ``program``   wires the pieces and exports the stack-outputs contract (``fleetrun_contract.stack_outputs``).
"""
