"""The instance lifetime of a kept-warm stack fleet, armed from the laptop through the stack.

Arming sets the stack's ``fleet:warm_until`` (``fleetrun_contract.lifetime``) and runs ``pulumi up``;
the program then declares the cloud's own schedule that ends the instances at that time (AWS: an
EventBridge Scheduler one-time schedule per node, ``infra.clouds.aws_lifetime``; GCP: a Cloud
Scheduler job per node, ``infra.clouds.gcp_lifetime``). Disarming removes the key and runs
``pulumi up`` again, which deletes those schedules. Nothing on a node can touch either: the
nodes' own roles hold no scheduler or IAM permission.

No refresh before these updates: a refresh drops nodes that already ended (their own timer, a
spot interruption) from the state, and ``up`` would then create them again, billing. No node's
inputs depend on ``fleet:warm_until`` (tests/infra/test_lifetime.py), so the update changes only
the schedules. The per-cloud part is the program's; here both clouds are the same stack update,
and ``CloudOps.lifetime_note`` says what the cloud will do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetrun_contract.lifetime import warm_until_text
from launch.fleets.clouds import CloudOps
from launch.fleets.kinds.base import Say

SetWarmUntil = Callable[[str, str | None, Say], None]
"""``(stack name, fleet:warm_until or None to remove it, say)``: the stack update."""


class StackLifetime:
    """``InstanceLifetime`` of a Pulumi stack's cluster."""

    def __init__(
        self,
        stack_name: str,
        cloud: CloudOps,
        project_dir: Path | None = None,
        update: SetWarmUntil | None = None,
    ) -> None:
        self.stack_name = stack_name
        self.cloud = cloud
        self.project_dir = project_dir
        self._update = update

    def arm(self, until: float, say: Say) -> str:
        text = warm_until_text(until)
        say(f"arming the instances' lifetime: stack {self.stack_name}, fleet:warm_until {text} (pulumi up)")
        self.update(text, say)
        return self.cloud.lifetime_note(text)

    def disarm(self, say: Say) -> None:
        say(f"disarming the instances' lifetime: stack {self.stack_name} (pulumi up)")
        self.update(None, say)

    def update(self, value: str | None, say: Say) -> None:
        if self._update is not None:
            self._update(self.stack_name, value, say)
            return
        from launch.fleets import cloud_stack  # Pulumi, imported only by cloud users

        cloud_stack.set_warm_until(self.stack_name, value, self.project_dir, on_output=say)
