"""A local fleet's nodes for ``fab exec``'s OpenSSH path, read from fleetrun's own state without
the inventory models (pydantic is a tenth of a second of that command's start-up).

The file is the one ``LocalFleet.up`` wrote (``$FLEETRUN_HOME/localfleet/<prefix>/inventory.yaml``),
trusted as ``load_local_inventory`` trusts it. Every field the OpenSSH command line uses is still
checked with the models' own patterns, and anything this reader does not take exactly as the
models would (a jump host, an address in another spelling, a duplicate, a file that names
another fleet, a missing file) makes it answer ``None``: the caller then loads the inventory the
usual way, which accepts it or names what is wrong in its usual words.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from launch.transport.openssh_exec import ExecTarget

INVENTORY_FILE = ("localfleet", "{prefix}", "inventory.yaml")
"""Where under ``$FLEETRUN_HOME`` (``launch.fleets.local.naming.FleetNames.inventory_path``,
which imports the whole local fleet's package; a test checks the two agree)."""
PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
"""``launch.fleets.local.naming.PREFIX_RE`` (a test checks they are the same)."""
NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
"""``launch.job.endpoints.HOSTNAME_RE`` (a test checks they are the same)."""
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
"""``launch.job.endpoints.USER_RE``."""
IPV4_RE = re.compile(
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"
)
"""An IPv4 address in its one canonical spelling (what the local fleet writes)."""
HOST_KEY_RE = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]{68}")
"""The host keys the local fleet pins (ed25519, no comment), as the models would keep them."""


def inventory_file(home: Path, prefix: str) -> Path:
    return home.joinpath(*(part.format(prefix=prefix) for part in INVENTORY_FILE))


def read_local_targets(home: Path, prefix: str) -> list[ExecTarget] | None:
    """The nodes of local fleet ``prefix`` in inventory order, or None (see the module doc).

    What was taken from the file is kept beside it as JSON with the file's whole text
    (``$FLEETRUN_HOME/cache``): while the text is the same, the next command reads that instead of
    importing a YAML parser (a third of this path's imports). The entries are checked again either way.
    """
    if not PREFIX_RE.fullmatch(prefix):
        return None
    path = inventory_file(home, prefix)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    cache = home / "cache" / f"exec-local-{prefix}.json"
    entries = _cached(cache, text)
    if entries is None:
        entries = _parse(text, prefix)
        if entries is None:
            return None
        _keep(cache, text, entries)
    targets = [_target(entry) for entry in entries]
    names = {t.name.casefold() for t in targets if t is not None}
    endpoints = {(t.address, t.port) for t in targets if t is not None}
    if (
        not targets
        or any(t is None for t in targets)
        or len(names) != len(targets)
        or len(endpoints) != len(targets)
    ):
        return None
    return [t for t in targets if t is not None]


FIELDS = ("name", "address", "port", "user", "key", "host_key", "proxy_jump")
"""The fields of a host entry this path uses (and ``proxy_jump``, which it must see absent)."""


def _parse(text: str, prefix: str) -> list[dict[str, Any]] | None:
    """The host entries of the inventory file's text, when it describes local fleet ``prefix``."""
    import yaml

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict):
        return None
    fleet = data.get("fleet")
    if not isinstance(fleet, dict) or fleet.get("kind") != "local" or fleet.get("prefix") != prefix:
        return None
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(entry, dict) for entry in hosts):
        return None
    return [{k: entry[k] for k in FIELDS if k in entry} for entry in hosts]


def _cached(cache: Path, text: str) -> list[dict[str, Any]] | None:
    try:
        kept = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("inventory") != text or not isinstance(kept.get("hosts"), list):
        return None
    hosts: list[dict[str, Any]] = kept["hosts"]
    return hosts


def _keep(cache: Path, text: str, entries: list[dict[str, Any]]) -> None:
    """Written whole under a name of its own, then renamed: a reader never sees half of it. A
    cache that cannot be written costs the next command its YAML parse, nothing else."""
    try:
        cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = cache.parent / f".{cache.name}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"inventory": text, "hosts": entries}, out)
        os.replace(tmp, cache)
    except OSError:
        return


def _target(entry: Any) -> ExecTarget | None:
    """One host entry as an ``ExecTarget`` when it is one exactly as the models would read it."""
    if not isinstance(entry, dict) or entry.get("proxy_jump") is not None:
        return None
    name, address, user, port = (
        entry.get("name"),
        entry.get("address"),
        entry.get("user"),
        entry.get("port", 22),
    )
    key, host_key = entry.get("key"), entry.get("host_key")
    if not (isinstance(name, str) and NAME_RE.fullmatch(name)):
        return None
    if not (isinstance(address, str) and IPV4_RE.fullmatch(address)):
        return None
    if not (isinstance(user, str) and USER_RE.fullmatch(user)):
        return None
    if type(port) is not int or not 1 <= port <= 65535:
        return None
    if not (isinstance(key, str) and key.startswith("/") and "${" not in key):
        return None
    if not (isinstance(host_key, str) and HOST_KEY_RE.fullmatch(host_key)):
        return None
    return ExecTarget(name=name, address=address, port=port, user=user, key=Path(key), host_key=host_key)
