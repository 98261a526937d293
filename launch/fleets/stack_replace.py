"""Replacing one lost node of a Pulumi stack's cluster, through the Automation API (no CLI call
of our own): ``refresh`` (the terminated or reclaimed instance leaves the state), then ``up``
(Pulumi creates what the program declares and the state lacks: only the missing instance; the
survivors are unchanged), then the new outputs, whose host key for the node is pinned again.

The whole update is bounded by the recovery's ``replace_timeout_s``: ``up`` runs in a worker
thread, and when it outlives the deadline the update is cancelled (``Stack.cancel``) and the
replacement gives up, so a cloud out of capacity cannot hold a run (and its surviving, billing
nodes) forever.

The stack object is passed in by tests (a fake with ``refresh``, ``up``, ``outputs`` and
``cancel``); in a real run it is opened from the project like ``fab up`` opens it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launch.errors import FleetrunError
from launch.fleets.cloud_stack import _open_stack, _run, outputs_to_contract

if TYPE_CHECKING:
    from launch.job.inventory import Host


class StackLike(Protocol):
    """The part of ``pulumi.automation.Stack`` a replacement uses."""

    def refresh(self, **kwargs: Any) -> Any: ...
    def up(self, **kwargs: Any) -> Any: ...
    def outputs(self) -> Any: ...
    def cancel(self) -> Any: ...


def replace_node(
    stack_name: str,
    host: Host,
    *,
    stack: StackLike | None = None,
    project_dir: Path | None = None,
    on_output: Callable[[str], None] = print,
    timeout_s: float | None = None,
) -> Host | None:
    """Recreate ``host``'s instance and return it as a ``Host`` read from the new outputs (its new
    address and pinned host key), or None when the outputs no longer name the node.

    Survivors must come out of ``up`` unchanged: a survivor whose address or host key changed is
    a stack that replaced more than the lost node (a changed config, a drifted program), and the
    run must not go on against machines it did not plan for. None as well when refresh and up
    together take longer than ``timeout_s`` (the update is cancelled).
    """
    from launch.fleets.stack_outputs import inventory_from_stack_outputs

    opened: Any = stack if stack is not None else _open_stack(stack_name, project_dir, create=False)
    before = inventory_from_stack_outputs(
        outputs_to_contract(_run(opened.outputs, "stack output"), source=f"stack {stack_name}"),
        host.key,
        stack=stack_name,
    )

    def update() -> Any:
        _run(lambda: opened.refresh(on_output=on_output, show_secrets=False), "refresh")
        return _run(lambda: opened.up(on_output=on_output), "up")

    finished, result = _within(update, timeout_s)
    if not finished:
        on_output(
            f"stack {stack_name}: replacing {host.name} took longer than {timeout_s:.0f} s; "
            "cancelling the update (run `fab up` later to bring the stack back in line)"
        )
        with contextlib.suppress(Exception):
            opened.cancel()
        return None
    outputs = outputs_to_contract(result.outputs, source=f"stack {stack_name}")
    after = inventory_from_stack_outputs(outputs, host.key, stack=stack_name)
    old = {h.name: h for h in before.hosts}
    for survivor in after.hosts:
        was = old.get(survivor.name)
        if survivor.name == host.name or was is None:
            continue
        if (was.address, was.host_key) != (survivor.address, survivor.host_key):
            raise FleetrunError(
                f"stack {stack_name}: replacing {host.name} also changed {survivor.name} "
                "(address or host key); refusing to go on"
            )
    return next((h for h in after.hosts if h.name == host.name), None)


def _within(call: Callable[[], Any], timeout_s: float | None) -> tuple[bool, Any]:
    """``(True, call())``, or ``(False, None)`` when ``call`` is still running after ``timeout_s``
    (it goes on in a daemon thread until cancelled); ``call``'s exception is raised here."""
    if timeout_s is None:
        return True, call()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="stack-replace", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout_s))
    if worker.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("result")
