"""One run's life cycle on a fleet: ``lifecycle`` (the one path of ``fab train``, ``fab watch``
and ``fab pull``) over the ``stages`` (preflight, sync, setup, claim, start, watch), each a
function of the run's ``state`` (a frozen ``RunState`` and its ``RunContext``); ``attempts``
(recovery: the next attempt after a loss), the watcher (``watch``, built with its heartbeat by
``watching``), the wrap-up (secure the artifacts, write the reports, finish), the ``target`` a
watcher re-attaches to, the pure ``summary`` (``RunSummary``, ``decide_teardown``), the
``reporter`` for console output, ``transfers`` (rsync steps), run folder and records."""
