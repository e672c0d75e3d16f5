"""What differs between the serving kinds' status, and the one place a stack's kind is chosen.

`status_kind(d)` is the only test of a stack's kind in the status modules (stack_status,
fleet_status, status_read, tpuserve.cli.status): everything kind-dependent there asks the
object it returns. The VM kinds share a node (tpuserve.ops.stack_status); flex adds a queued
resource in front of it and ends by its run duration instead of the billing guard; the fleet is
read from its cluster (tpuserve.ops.fleet_status).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from tpuserve import kinds
from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.gcp.tpu.queued_resources import DEAD_STATES, KNOWN_STATES, MISSING, QueuedResource
from tpuserve.settings import Deployment
from tpuserve.settings.base import parse_duration

from .boot_phases import BootReport, parse_time
from .status_model import format_duration

# Node states that end a node's life: only a new node (a redeploy) brings the server back.
LOST_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING"})
# Spot: `tpuserve recover` deletes and redeploys. A TERMINATED spot VM cannot be started again,
# so it is recovered the same way as a PREEMPTED one.
RECOVERABLE_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED"})
RECOVERABLE_QR_STATES = frozenset({"SUSPENDED", "FAILED"})  # flex: `tpuserve recover`

End = tuple[dt.datetime | None, str]  # when the node stops billing by itself, and the rule


class NodeFacts(Protocol):
    """What the VM kinds' rules read of a node's status (tpuserve.ops.stack_status)."""

    @property
    def d(self) -> Deployment: ...
    @property
    def node(self) -> NodeView | None: ...
    @property
    def qr(self) -> QueuedResource | None: ...
    @property
    def boot(self) -> BootReport: ...


class NodeKind:
    """spot, ondemand: a TPU VM the stack creates itself; the billing guard ends it."""

    reads_cluster = False  # read from the TPU API
    queued = False  # no queued resource in front of the node

    def qr_state(self, qr: QueuedResource | None) -> str | None:
        return None

    def ends_at(self, s: NodeFacts) -> End:
        created = s.node.create_time if s.node else None
        hours = s.d.stack.max_run_hours
        if s.boot.guard_deadline is not None:
            return s.boot.guard_deadline, "billing guard"
        if hours <= 0:
            return None, "none: billing guard off (stack.max_run_hours = 0)"
        if created is None:
            return None, f"billing guard {hours:g} h"
        # The guard's Cloud Tasks task fires at exactly this time (tpuserve.gcp.billing_guard);
        # nodes booted by an older script may still report their own deadline (above).
        return created + dt.timedelta(hours=hours), (
            f"billing guard {hours:g} h (createTime + max_run_hours)")

    def recoverable(self, s: NodeFacts) -> bool:
        return s.node is not None and s.node.state in RECOVERABLE_NODE_STATES

    def queue_problems(self, s: NodeFacts) -> list[str]:
        return []

    def state_line(self, s: NodeFacts, node_line: str) -> str:
        return node_line


class FlexKind(NodeKind):
    """flex: a queued resource asks for the node; its run duration ends it."""

    queued = True

    def qr_state(self, qr: QueuedResource | None) -> str | None:
        return qr.state if qr else MISSING

    def ends_at(self, s: NodeFacts) -> End:
        created = s.node.create_time if s.node else None
        run = (s.qr.raw.get("runDuration") or {}) if s.qr else {}
        if run.get("terminationTime"):
            return parse_time(str(run["terminationTime"])), "flex termination time"
        text = str(run.get("maxRunDuration") or "")
        seconds = float(text[:-1]) if text.endswith("s") else parse_duration(
            s.d.stack.max_run_duration
        )
        rule = f"flex max run duration {format_duration(seconds)}"
        return (created + dt.timedelta(seconds=seconds) if created else None), rule

    def recoverable(self, s: NodeFacts) -> bool:
        return s.qr is not None and s.qr.state in RECOVERABLE_QR_STATES

    def queue_problems(self, s: NodeFacts) -> list[str]:
        out: list[str] = []
        if s.qr is not None and s.qr.state in DEAD_STATES:
            why = f": {s.qr.failure}" if s.qr.failure else ""
            out.append(
                f"queued resource {s.qr.state}{why}; `tpuserve recover {s.d.name}` replaces it"
            )
        if s.qr is not None and s.qr.state not in KNOWN_STATES:
            out.append(
                f"queued resource state unknown ({s.qr.state}): neither live nor dead as "
                "far as tpuserve can tell; nothing is replaced; check again in a minute"
            )
        return out

    def state_line(self, s: NodeFacts, node_line: str) -> str:
        return f"queued resource {self.qr_state(s.qr)}, {node_line}"


class FleetKind:
    """fleet: a GKE cluster's Deployment behind a Gateway; GKE replaces what it loses."""

    reads_cluster = True


StatusKind = NodeKind | FleetKind

NODE, FLEX, FLEET = NodeKind(), FlexKind(), FleetKind()
# Each shape of capacity (tpuserve/kinds CAPACITIES) and how its status is read and told.
BY_CAPACITY: dict[str, StatusKind] = {kinds.TPU_VM: NODE, kinds.QUEUED_RESOURCE: FLEX,
                                      kinds.GKE: FLEET}


def status_kind(d: Deployment) -> StatusKind:
    """The stack's kind, for everything its status reads and says (the one choice)."""
    return BY_CAPACITY[d.kind.capacity]


def node_kind(d: Deployment) -> NodeKind:
    """A VM stack's kind (its status is a node's); the fleet has none."""
    kind = status_kind(d)
    if not isinstance(kind, NodeKind):
        raise TypeError(f"{d.name}: not a VM stack")
    return kind
