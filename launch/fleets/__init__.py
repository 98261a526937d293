"""Where machines come from and how they go away: ``kinds/`` (lab machines, the local fleet, Pulumi
stacks: inventory loading, power-off hook, bucket upload, teardown), the local fleet, stacks."""
