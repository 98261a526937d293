"""Lab machines: a static hosts.yaml of machines the lab owns. Untrusted input, never torn down.

The file is the user's (often copied, edited, shared), so it may say only which hosts exist and
how to reach them: ``defaults`` and ``hosts``. Anything that decides what fleetrun destroys or
powers off (``teardown``, ``stack``, ``cluster_id``, ``bucket``, ``cloud``, ``fleet``) is refused
with one line naming the file and the key, so a copy of the local fleet's own inventory.yaml, or
a file with ``teardown: pulumi-stack``, cannot power off lab machines or destroy a stack. The
inventory it returns is always a ``LabFleet``: no power-off, no bucket, teardown keeps the machines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import ValidationError

from launch.errors import SpecError
from launch.fleets.kinds.base import Probe, Say, TeardownOutcome, TeardownState
from launch.fleets.kinds.refs import LabFleet
from launch.job.validation import describe_validation_error, load_yaml_mapping

if TYPE_CHECKING:
    from launch.job.inventory import Host, Inventory
    from launch.nodelib.fleetrun_protocol import BucketCommands

REPLACE_POLL_S = 5.0

ALLOWED_KEYS = ("defaults", "hosts")
REFUSED_KEYS = ("teardown", "stack", "cluster_id", "bucket", "cloud", "fleet")
"""Keys that only fleetrun's own state may set: they decide what is destroyed or powered off."""

POWEROFF_HOOK = (
    "# lab machine: fleetrun stops the run's processes but never powers the machine off\n"
    'echo "lab machine: not powered off"\n'
)


class LabKind:
    name: ClassVar[str] = "lab"
    can_power_off: ClassVar[bool] = False

    def __init__(self, ref: LabFleet) -> None:
        self.ref = ref

    def describe(self) -> str:
        return "lab machines"

    def poweroff_hook(self) -> str:
        return POWEROFF_HOOK

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        return None

    def bucket_download_argv(self, src: str) -> list[str] | None:
        return None

    def bucket_commands(self, prefix: str) -> BucketCommands | None:
        return None

    def preemption_poller(self) -> str:
        return ""

    def tear_down(self, say: Say) -> TeardownOutcome:
        return TeardownOutcome(
            TeardownState.KEPT, "lab machines are never torn down; the run's processes were stopped"
        )

    def tags(self) -> dict[str, str]:
        return {}

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """Lab machines are not made by fleetrun: wait (up to ``timeout_s``) for the host's sshd to
        answer again (a reboot, a network fixed) and give back the same host, its pinned key
        unchanged (a changed key is still refused when the run connects). None when it stays away.

        ``probe`` asks as the run reaches the host: a host behind a jump host through it (this
        machine has no route to its address; ``Fleet.answers``). Without one, a direct check."""
        from launch.transport.reachability import wait_for_sshd

        say(f"{host.name}: lab machine; waiting up to {timeout_s:.0f} s for it to answer again")
        return host if wait_for_sshd(host, timeout_s, poll_s=REPLACE_POLL_S, check=probe) else None


def _resolve_key(entry: dict[str, object], path: Path) -> None:
    """``key: ~/...`` or relative to the inventory file, as an absolute path."""
    if isinstance(entry.get("key"), str):
        key_path = Path(str(entry["key"])).expanduser()
        entry["key"] = key_path if key_path.is_absolute() else (path.parent / key_path).resolve()


def load_lab_inventory(path: str | Path) -> Inventory:
    """A lab's existing machines (untrusted)::

    defaults: {user: alice, key: ~/.ssh/id_ed25519, port: 22,
               proxy_jump: {address: login.lab.example, user: alice, key: ~/.ssh/id_ed25519,
                            host_key: "ssh-ed25519 AAAA..."}}
    hosts:
      - {name: gpu1, address: 192.0.2.10, private_address: 10.1.0.10, gpus: 8,
         host_key: "ssh-ed25519 AAAA..."}

    ``proxy_jump`` (per host or in ``defaults``; ``proxy_jump: null`` on a host reaches it
    directly) is a pinned host of its own: see ``launch.job.inventory.JumpHost``.
    """
    from launch.job.inventory import Inventory

    path = Path(path)
    data = load_yaml_mapping(path, "inventory")
    for key in sorted(data, key=lambda k: k not in REFUSED_KEYS):  # the dangerous ones named first
        if key in REFUSED_KEYS:
            raise SpecError(
                f"{path}: field {key!r}: not allowed in a lab inventory (only fleetrun's own state says "
                "how machines go away; lab machines are never powered off or destroyed). Remove it; "
                "for the local fleet use --inventory local:<prefix>, for a stack stack:<name>"
            )
        if key not in ALLOWED_KEYS:
            raise SpecError(
                f"{path}: field {key!r}: unknown; a lab inventory has only 'defaults' and 'hosts'"
            )
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(f"{path}: field 'defaults': expected a mapping")
    hosts = data.get("hosts")
    if isinstance(hosts, list):
        hosts = [{**defaults, **entry} if isinstance(entry, dict) else entry for entry in hosts]
        for entry in hosts:
            if not isinstance(entry, dict):
                continue
            _resolve_key(entry, path)
            if isinstance(entry.get("proxy_jump"), dict):
                entry["proxy_jump"] = dict(entry["proxy_jump"])  # shared by every host from defaults
                _resolve_key(entry["proxy_jump"], path)
    try:
        fields: dict[str, object] = {"source": str(path), "fleet": LabFleet()}
        return Inventory.model_validate({**fields, "hosts": hosts} if "hosts" in data else fields)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(str(path), exc)) from None
