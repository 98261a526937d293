"""Read the stack's ``fleet:*`` config and turn a bad one into a clean ``pulumi preview`` error.

The only module that touches ``pulumi.Config`` for fleet settings; validation itself lives in
the pure ``infra.settings``. A ``ConfigError`` becomes ``pulumi.RunError``, which Pulumi prints
as the message alone (no traceback), e.g.::

    error: fleet:machine_type: 'p9.huge' is not a known AWS instance type; known GPU types: ...
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.settings import KEYS, NAMESPACE, ConfigError, FleetSettings, parse_settings


def raw_fleet_config() -> dict[str, Any]:
    """Every ``fleet:*`` key set in the stack (known or not, so that typos are reported)."""
    raw: dict[str, Any] = {}
    prefix = NAMESPACE + ":"
    for full_key in all_config_keys():
        if full_key.startswith(prefix):
            raw[full_key[len(prefix) :]] = pulumi.runtime.get_config(full_key)
    config = pulumi.Config(NAMESPACE)
    for key in KEYS:
        if key not in raw:
            value = config.get(key)
            if value is not None:
                raw[key] = value
    if "project" not in raw:
        gcp_project = pulumi.Config("gcp").get("project")
        if gcp_project:
            raw["project"] = gcp_project
    return raw


def load_settings() -> FleetSettings:
    try:
        return parse_settings(raw_fleet_config(), project=pulumi.get_project(), stack=pulumi.get_stack())
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None


def all_config_keys() -> list[str]:
    """All config keys the engine passed to the program (both ways the SDK may receive them)."""
    from pulumi.runtime import config as runtime_config

    keys = set(runtime_config.CONFIG.get().keys())
    keys.update(runtime_config.get_config_env().keys())
    return sorted(keys)
