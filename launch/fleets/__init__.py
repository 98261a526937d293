"""Fleets: where a run's machines come from and how they go away."""
