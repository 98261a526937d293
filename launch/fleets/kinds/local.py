"""The local fleet: network-namespace nodes on this machine, made and removed by fleetrun as root.

Its inventory is fleetrun's own state: the file ``LocalFleet.up`` wrote under
``$FLEETRUN_HOME/localfleet/<prefix>/``, reached only through ``--inventory local:<prefix>``, and
checked to name that same fleet. Nodes power off by asking the fleet's power daemon (root), and
the teardown is ``LocalFleet(prefix).down()`` followed by a check that nothing of it is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from launch.errors import FleetrunError
from launch.fleets.kinds.base import (
    InstanceLifetime,
    Probe,
    Say,
    StandingMachines,
    TeardownOutcome,
    TeardownState,
)
from launch.fleets.kinds.refs import LocalFleetRef

if TYPE_CHECKING:
    from launch.job.inventory import Host, Inventory
    from launch.nodelib.fleetrun_protocol import BucketCommands

SELECTOR = "local"

POWEROFF_HOOK = (
    "# local fleet: the fleet's power daemon (root) stops this node\n"
    'touch "$HOME/.fleetrun/poweroff-request"\n'
)
LOCAL_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "fleetrun-local",
    "AWS_SECRET_ACCESS_KEY": "fleetrun-local",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""The fleet's own S3 server's access key and region; the secret is the fleet's own, made at
``up`` (``launch.fleets.local.bucket.fleet_secret``): this one stands only for a fleet without."""
PREFIX_TAG = "fleetrun:local-prefix"
"""Every resource of a local fleet (users, namespaces, links, state) is named from its prefix."""


class LocalFleetKind(StandingMachines):
    name: ClassVar[str] = "local"
    can_power_off: ClassVar[bool] = True

    def __init__(self, ref: LocalFleetRef) -> None:
        self.ref = ref

    def holding(self) -> LocalFleetRef:
        """The reference as given: these machines are not asked for per run."""
        return self.ref

    def describe(self) -> str:
        return f"local fleet {self.ref.prefix}"

    def poweroff_hook(self) -> str:
        return POWEROFF_HOOK

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        commands = self.bucket_commands(dest)
        if commands is None:
            return None
        from launch.fleets.clouds import fill

        # Its environment (the fleet's S3 key) travels apart (``WatchTarget.upload_env``): an
        # argument is in every node user's ``ps``.
        return fill(commands.sync, dest=commands.url)

    def bucket_commands(self, prefix: str) -> BucketCommands | None:
        """The S3 commands against the fleet's own S3-compatible server, run with the image's ``aws``
        (the fleet's own key: the server refuses requests signed with any other)."""
        if not (self.ref.bucket and self.ref.s3_endpoint):
            return None
        from launch.fleets.clouds import aws
        from launch.fleets.local.bucket import fleet_secret
        from launch.fleets.local.naming import FleetNames
        from launch.fleets.local.prereqs import image_python
        from launch.nodelib.fleetrun_protocol import BucketCommands

        cli = str(image_python().parent / "aws")
        env = {**LOCAL_S3_ENV, "AWS_ENDPOINT_URL": self.ref.s3_endpoint}
        secret = fleet_secret(FleetNames(prefix=self.ref.prefix).state_dir)
        if secret is not None:
            env["AWS_SECRET_ACCESS_KEY"] = secret
        return BucketCommands(
            url=f"s3://{self.ref.bucket}/{prefix}",
            copy=(cli, *aws.COPY[1:]),
            sync=(cli, *aws.SYNC[1:]),
            remove=(cli, *aws.REMOVE[1:]),
            env=env,
        )

    def preemption_poller(self) -> str:
        return self.ref.preemption_poller

    def bucket_download_argv(self, src: str) -> list[str] | None:
        return None

    def tear_down(self, say: Say) -> TeardownOutcome:
        from launch.fleets.local import LocalFleet  # root-only I/O, imported when used

        left = LocalFleet(prefix=self.ref.prefix, subnet=0).down(say=say)
        remaining = {k: v for k, v in left.items() if v}
        if remaining:
            return TeardownOutcome(
                TeardownState.FAILED, f"local fleet {self.ref.prefix}: teardown left {remaining}"
            )
        return TeardownOutcome(
            TeardownState.DONE, f"local fleet {self.ref.prefix} removed; nothing left behind"
        )

    def tags(self) -> dict[str, str]:
        return {PREFIX_TAG: self.ref.prefix}

    def lifetime(self) -> InstanceLifetime | None:
        """No cloud to keep a lifetime: the laptop timer and the power daemon keep the deadline."""
        return None

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """A fresh node (empty home, new host key) in the lost one's place; see ``replace_node``."""
        new = self._fresh_node(host)
        say(f"{host.name}: replaced by a fresh node (new host key pinned)")
        return new

    def renew(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """The same fresh node for a bad one that still runs (``replace_node`` powers it off
        first): what a cloud's new instance is, so a ``gpu_fault`` recovery without spares can be
        rehearsed on this machine."""
        new = self._fresh_node(host)
        say(f"{host.name}: powered off and renewed as a fresh node (new host key pinned)")
        return new

    def _fresh_node(self, host: Host) -> Host:
        from launch.fleets.local import LocalFleet  # root-only I/O, imported when used
        from launch.fleets.local.power import replace_node

        return replace_node(LocalFleet(prefix=self.ref.prefix, subnet=0), host)


def load_local_inventory(prefix: str | None, save_keys: bool = True) -> Inventory:
    """``--inventory local`` / ``local:<prefix>``: the fleet's own inventory file, which must name it."""
    from launch.fleets.select import local_fleet

    fleet = local_fleet(prefix)
    inventory = fleet.inventory()
    if not isinstance(inventory.fleet, LocalFleetRef) or inventory.fleet.prefix != fleet.prefix:
        raise FleetrunError(
            f"{fleet.inventory_path}: this file does not describe local fleet {fleet.prefix!r}; "
            f"recreate the fleet (fab local.down --prefix {fleet.prefix}; fab local.up)"
        )
    return inventory
