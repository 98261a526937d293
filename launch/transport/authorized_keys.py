"""Re-export: the ``authorized_keys`` edits are pure text and live in
``launch.planning.authorized_keys`` (the cluster key's plan needs them; planning is below transport)."""

from launch.planning.authorized_keys import (  # noqa: F401 - re-exported for the relay sync
    EDITOR,
    ZONE_SLACK_S,
    add_command,
    add_command_for_variable,
    check_line,
    expiry_time,
    remove_command,
    remove_recorded_command,
)
