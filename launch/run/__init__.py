"""One run's life cycle on a fleet: runner (preflight, sync, setup, start), watcher (``watch``, built
with its heartbeat by ``watching``), wrap-up (stop, pull, upload, teardown decision, record), the
``target`` a watcher re-attaches to, the pure ``summary`` (``RunSummary``, ``decide_teardown``), the
``reporter`` for console output, ``transfers`` (rsync steps), run folder and records."""
