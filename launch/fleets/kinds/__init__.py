"""Fleet kinds: where a fleet's machines come from and how they go away, one module per kind.

``refs`` holds the typed, frozen reference an ``Inventory`` carries (``LabFleet``,
``LocalFleetRef``, ``StackFleetRef``); ``registry`` maps a reference to its ``FleetKind``
(``lab``, ``local``, ``stack``), which owns everything that differs between kinds: how its
inventory is loaded and whether it is trusted, the power-off hook its nodes run, its bucket
upload command, its teardown and the check that nothing remains, its tags. Nothing outside this
folder switches on a kind or a cloud; a new kind (Kubernetes, Slurm) is one module here plus one
line in ``refs`` and one in ``registry``.
"""
