"""From a job spec and an inventory to a launch plan (data): per-node scripts, environment, launchers. Pure."""
