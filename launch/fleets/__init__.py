"""Where machines come from and how they go away: the local fleet, lab machines, Pulumi stacks."""
