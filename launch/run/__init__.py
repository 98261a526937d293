"""One run's life cycle on a fleet: runner (preflight, sync, setup, start), watcher, wrap-up, run folder and records."""
