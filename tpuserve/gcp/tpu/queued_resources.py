"""Queued resources as the TPU API v2alpha1 names and reports them: references, states, the
read-only view, and the errors a queued-resource call raises (no I/O here)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuserve.contracts import QUEUED_RESOURCE
from tpuserve.render.queued_resource_body import GENERATION_LABEL

if TYPE_CHECKING:  # the provisioner path must not pay for pydantic
    from tpuserve.settings import Deployment

QR_PROG = QUEUED_RESOURCE.prog  # the provisioners' command, as a hint names it

API_VERSION = "v2alpha1"  # the only version with provisioningModel / runDuration
MISSING = "MISSING"  # pseudo-state: the QR does not exist

# QR states (v2alpha1 QueuedResourceState.State, plus WAITING_FOR_RESOURCES from the docs).
ALIVE_STATES = frozenset(
    {"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"}
)
ACCEPTED_OR_LATER = frozenset({"ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"})
# Run duration over (SUSPENDING/SUSPENDED: the node is deleted) or never provisioned (FAILED).
DEAD_STATES = frozenset({"SUSPENDING", "SUSPENDED", "FAILED"})
KNOWN_STATES = ALIVE_STATES | DEAD_STATES | {"DELETING"}
# Pseudo-state: the QR could not be read just now (transient errors outlasted their retries).
UNREADABLE = "UNREADABLE"

_NAME_RE = re.compile(
    r"projects/(?P<project>[^/\s]+)/locations/(?P<zone>[^/\s]+)/queuedResources/(?P<id>[^/\s]+)"
)
_ID_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")

Progress = Callable[[str, float], None]
"""Called on every poll with the QR state (or MISSING) and the seconds waited so far."""


class QueuedResourceError(Exception):
    """A queued-resource failure that is not an API error (state, timeout, mismatch)."""


class WaitTimeout(QueuedResourceError):
    pass


class UnknownState(QueuedResourceError):
    """The QR reports a state this client does not know (e.g. STATE_UNSPECIFIED): it is left
    alone, neither adopted as live nor replaced as dead."""

    def __init__(self, qr: QueuedResource) -> None:
        super().__init__(
            f"queued resource {qr.name} reports state {qr.state} (unknown): it is left alone "
            f"-> check it with `{QR_PROG} describe`, and retry once it "
            "reports a known state"
        )


class Spared(QueuedResourceError):
    """A delete that found the QR in a state the caller asked to spare (e.g. one that holds
    capacity): nothing was deleted; `state` is what it found."""

    def __init__(self, name: str, state: str) -> None:
        self.state = state
        super().__init__(f"queued resource {name} is {state}: not deleted (spared)")


class SpecMismatch(QueuedResourceError):
    """A QR with this name exists with a different spec; `differences` names the fields."""

    def __init__(self, name: str, differences: list[str]) -> None:
        self.differences = differences
        super().__init__(
            f"queued resource {name} exists with a different spec: {'; '.join(differences)} "
            f"-> delete it ({QR_PROG} delete --name NAME) or redeploy "
            "with its settings"
        )


@dataclass(frozen=True)
class QueuedResourceRef:
    project: str
    zone: str
    queued_resource_id: str

    def __post_init__(self) -> None:
        if not _ID_RE.fullmatch(self.queued_resource_id):
            raise ValueError(
                f"queued resource id {self.queued_resource_id!r}: 1-63 lowercase letters, "
                "digits or hyphens, starting with a letter"
            )

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def name(self) -> str:
        return f"{self.parent}/queuedResources/{self.queued_resource_id}"

    @classmethod
    def parse(cls, name: str) -> QueuedResourceRef:
        m = _NAME_RE.fullmatch(name.strip())
        if not m:
            raise ValueError(
                f"queued resource name {name!r}: must look like "
                "projects/PROJECT/locations/ZONE/queuedResources/ID"
            )
        return cls(m["project"], m["zone"], m["id"])


def ref_for(d: Deployment) -> QueuedResourceRef:
    """The deployment's queued resource (Deployment.queued_resource_name)."""
    return QueuedResourceRef.parse(d.queued_resource_name)


@dataclass(frozen=True)
class QueuedResource:
    name: str
    state: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueuedResource:
        state = data.get("state", {})
        return cls(
            name=str(data.get("name", "")),
            state=str(state.get("state", "STATE_UNSPECIFIED")) if isinstance(state, dict)
            else str(state),
            raw=dict(data),
        )

    @property
    def node_specs(self) -> list[dict[str, Any]]:
        return list(self.raw.get("tpu", {}).get("nodeSpec", []))

    @property
    def node_ids(self) -> list[str]:
        return [str(s.get("nodeId", "")) for s in self.node_specs]

    @property
    def node_names(self) -> list[str]:
        """projects/P/locations/Z/nodes/N of each node spec."""
        return [f"{s.get('parent', '')}/nodes/{s.get('nodeId', '')}" for s in self.node_specs]

    @property
    def generation(self) -> str | None:
        specs = self.node_specs
        labels = specs[0].get("node", {}).get("labels", {}) if specs else {}
        return labels.get(GENERATION_LABEL)

    @property
    def failure(self) -> str:
        """FAILED's reason (failedData.error.message), or ''."""
        err = self.raw.get("state", {}).get("failedData", {}).get("error", {})
        return " ".join(str(err.get("message", "")).split())


@dataclass(frozen=True)
class CreateResult:
    queued_resource: QueuedResource
    adopted: bool  # True: an existing QR with the same spec was kept


def dead_message(qr: QueuedResource) -> str:
    why = f": {qr.failure}" if qr.failure else ""
    return (
        f"queued resource {qr.name} is {qr.state}{why} -> deploy again to create a fresh one "
        "(cdktf deploy flex), or delete it (cdktf destroy flex)"
    )
