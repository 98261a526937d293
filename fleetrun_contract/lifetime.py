"""A kept-warm fleet's instance lifetime: the one stack config key the laptop sets and the Pulumi
program reads, and the one form of its time.

The laptop (``launch.fleets.stack_lifetime``) writes ``fleet:warm_until`` when a run keeps a
stack fleet warm and removes it when a run claims the fleet; the program (``infra.clouds.aws``,
``infra.clouds.gcp``) turns it into a schedule in the cloud that ends the instances then. Both
sides format and parse the time here, so what one writes the other reads.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

WARM_UNTIL_KEY = "fleet:warm_until"
WARM_UNTIL_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""UTC, to the second: ``2026-11-28T21:05:00Z`` (RFC 3339)."""


def warm_until_text(unix_time: float) -> str:
    """``unix_time`` rounded up to the next whole minute, as ``fleet:warm_until`` holds it: GCP's
    Cloud Scheduler fires on minutes, and a lifetime is never earlier than asked."""
    minute = math.ceil(unix_time / 60.0) * 60
    return datetime.fromtimestamp(minute, tz=timezone.utc).strftime(WARM_UNTIL_FORMAT)


def parse_warm_until(text: str) -> datetime:
    """The time of a ``fleet:warm_until`` value (aware, UTC); ValueError if it is not one."""
    return datetime.strptime(text, WARM_UNTIL_FORMAT).replace(tzinfo=timezone.utc)
