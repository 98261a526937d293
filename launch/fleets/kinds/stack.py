"""A Pulumi stack's cluster on AWS or GCP: the only module that knows how the two clouds differ
for a run (``launch.fleets.cloud_stack`` creates and destroys stacks).

Its inventory is fleetrun's own state: the stack's outputs (``--inventory stack:<name>``, read
through the Pulumi Automation API, or a ``.json`` of those outputs that fleetrun itself wrote:
``fab up --outputs FILE`` records the file's SHA-256 under ``$FLEETRUN_HOME/trusted-outputs``).
A ``.json`` from anywhere else is refused: what it says becomes the power-off hook run with sudo
on the hosts it lists and the bucket that run data is sent to, which only fleetrun's own state
may decide (a lab YAML, for other people's machines, can decide neither). Nodes power off with
``shutdown`` (instances are created with instance-initiated shutdown = terminate, so that ends
billing); run directories go to the stack's bucket with the node's own role; the teardown is
``pulumi destroy`` followed by asking the cloud that no instance of the cluster remains.

The per-cloud operations (power-off hook, upload command, tag key) come from
``launch.fleets.clouds.CLOUDS``, one module per cloud behind its ``CloudOps`` protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from launch.errors import SpecError
from launch.fleets.clouds import CLOUDS
from launch.fleets.kinds.base import (
    InstanceLifetime,
    Probe,
    Say,
    StandingMachines,
    TeardownOutcome,
    TeardownState,
)
from launch.fleets.kinds.refs import StackFleetRef
from launch.fleets.stack_outputs import (  # noqa: F401 - re-exported
    TRUSTED_OUTPUTS_DIR,
    inventory_from_stack_outputs,
    record_written_outputs,
    written_by_fleetrun,
)
from launch.job.validation import json_mapping, printable, read_bytes_bounded

if TYPE_CHECKING:
    from launch.job.inventory import Host, Inventory
    from launch.nodelib.fleetrun_protocol import BucketCommands


class NodeUpdate(Protocol):
    """``stack_replace.replace_node`` or ``renew_node``: one node's new instance, read from the outputs."""

    def __call__(
        self, stack_name: str, host: Host, *, on_output: Say, timeout_s: float | None = None
    ) -> Host | None: ...


SELECTOR = "stack"
OUTPUTS_SUFFIX = ".json"


class StackKind(StandingMachines):
    name: ClassVar[str] = "stack"
    can_power_off: ClassVar[bool] = True

    def __init__(self, ref: StackFleetRef) -> None:
        self.ref = ref
        self.cloud = CLOUDS[ref.cloud]

    def holding(self) -> StackFleetRef:
        """The reference as given: these machines are not asked for per run."""
        return self.ref

    def describe(self) -> str:
        return f"stack {self.ref.stack or '(unnamed)'} (cluster {self.ref.cluster_id}, {self.ref.cloud})"

    def poweroff_hook(self) -> str:
        return self.cloud.poweroff_hook()

    def bucket_upload_argv(self, dest: str) -> list[str] | None:
        return self.cloud.upload_argv(self.ref.bucket, dest) if self.ref.bucket else None

    def bucket_download_argv(self, src: str) -> list[str] | None:
        return self.cloud.download_argv(self.ref.bucket, src) if self.ref.bucket else None

    def bucket_commands(self, prefix: str) -> BucketCommands | None:
        return self.cloud.bucket_commands(self.ref.bucket, prefix) if self.ref.bucket else None

    def preemption_poller(self) -> str:
        return self.cloud.preemption_poller()

    def tear_down(self, say: Say) -> TeardownOutcome:
        if not self.ref.stack:
            return TeardownOutcome(
                TeardownState.FAILED,
                f"cluster {self.ref.cluster_id} came from a stack outputs file without a stack name; "
                "tear it down with: fab down --stack <name>",
            )
        from launch.fleets import cloud_stack  # Pulumi, imported only by cloud users

        cloud_stack.stack_down(self.ref.stack, on_output=say)  # raises TeardownIncomplete on leftovers
        return TeardownOutcome(
            TeardownState.DONE,
            f"stack {self.ref.stack} destroyed (buckets retained); no instance of cluster "
            f"{self.ref.cluster_id} remains",
        )

    def tags(self) -> dict[str, str]:
        return {self.cloud.cluster_tag: self.ref.cluster_id}

    def lifetime(self) -> InstanceLifetime | None:
        """``fleet:warm_until`` in the stack, which the program turns into the cloud's schedule
        (``launch.fleets.stack_lifetime``). None for a cluster known only from an outputs file:
        no stack to update."""
        if not self.ref.stack:
            return None
        from launch.fleets.stack_lifetime import StackLifetime

        return StackLifetime(self.ref.stack, self.cloud)

    def replace(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """Refresh + up through the Automation API recreates only the missing instance; its new
        host key comes from the outputs (``launch.fleets.stack_replace``); then its sshd is awaited
        (a booting instance), all within ``timeout_s``. A cluster known only from an outputs file
        has no stack to update: None."""
        from launch.fleets import stack_replace  # Pulumi, imported only by cloud users

        return self._new_instance(host, say, timeout_s, probe, stack_replace.replace_node, "recreated")

    def renew(self, host: Host, say: Say, timeout_s: float, probe: Probe | None = None) -> Host | None:
        """A new instance in place of the node's bad one: ``up(replace=[its URN])``, the URN of the
        instance fleetrun's program created for that node, read from the stack's state
        (``stack_replace.renew_node``); the old instance is terminated by the replacement. Then its
        sshd is awaited, all within ``timeout_s``. None without a stack name, as for ``replace``."""
        from launch.fleets import stack_replace  # Pulumi, imported only by cloud users

        return self._new_instance(host, say, timeout_s, probe, stack_replace.renew_node, "renewed")

    def _new_instance(
        self, host: Host, say: Say, timeout_s: float, probe: Probe | None, update: NodeUpdate, done: str
    ) -> Host | None:
        if not self.ref.stack:
            say(f"{host.name}: no stack name (inventory from an outputs file); cannot give it a new instance")
            return None
        import time

        from launch.transport.reachability import wait_for_sshd

        deadline = time.monotonic() + timeout_s
        new = update(self.ref.stack, host, on_output=say, timeout_s=timeout_s)
        if new is None:
            return None
        left = max(0.0, deadline - time.monotonic())
        say(f"{host.name}: instance {done} at {new.address}; waiting up to {left:.0f} s for its sshd")
        if wait_for_sshd(new, left, check=probe):
            return new
        say(f"{host.name}: the new instance's sshd did not answer within replace_timeout_s")
        return None


def load_outputs_file(path: str | Path, save_key: bool = True, key_path: Path | None = None) -> Inventory:
    """``--inventory outputs.json``: a stack's outputs saved by ``fab up --outputs`` on this
    machine (recorded by ``record_written_outputs``; any other file is refused), read once with
    the bounded reader: the SHA-256 checked against the record is that of the bytes parsed.

    The outputs are validated first, then their origin; then the stack's generated operator key
    (``ssh_private_key``), if any, is saved 0600 as ``fab up`` saves it and used for the hosts.
    ``save_key=False`` (``--dry-run``) writes nothing. ``key_path`` names the operator key
    instead (a key the operator keeps elsewhere).
    """
    path = Path(path)
    raw = read_bytes_bounded(path, "stack outputs")  # read once: the bytes checked are the bytes parsed
    data = json_mapping(raw, path, "stack outputs")
    try:  # validated first (safe on any input): a broken file is told what is wrong with it
        inventory = inventory_from_stack_outputs(data, key_path)
    except SpecError as exc:
        raise SpecError(f"{printable(path, 400)}: {exc}") from None
    if not written_by_fleetrun(raw):
        raise SpecError(
            f"{printable(path, 400)}: stack outputs that fleetrun did not write on this machine (no record of "
            f"this file under $FLEETRUN_HOME/{TRUSTED_OUTPUTS_DIR}); refused, since they decide the power-off "
            "command run with sudo on the hosts they list and the bucket run data goes to. Use "
            "--inventory stack:<name> (read from the stack itself), a file written by `fab up --outputs`, or "
            "a lab inventory YAML for the hosts"
        )
    if not save_key or key_path is not None:
        return inventory
    from launch.fleets.cloud_stack import save_operator_key

    key_path = save_operator_key(data)
    return inventory if key_path is None else inventory_from_stack_outputs(data, key_path)


def load_stack_inventory(stack: str | None, save_key: bool = True) -> Inventory:
    """``--inventory stack:<name>``: the deployed stack's outputs, read from Pulumi."""
    if not stack:
        raise SpecError("inventory 'stack:': expected a stack name, e.g. stack:dev")
    from launch.fleets.cloud_stack import stack_inventory  # lazy: only cloud users need Pulumi

    return stack_inventory(stack, save_key=save_key)
