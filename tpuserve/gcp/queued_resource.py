"""A small typed client for flex-start queued resources (TPU API v2alpha1, REST).

Neither the google-beta provider nor google-cloud-tpu 1.28 can express a flex-start queued
resource; the v2alpha1 REST API can (issue 3). The request body is built by one pure function,
`build_body`, shared by the flex stack (which hands it to Terraform) and this client.

Also the node helpers others need (`get_node` with its external IP, `get_guest_attributes`),
and the entry point the flex stack's Terraform provisioners run:

    python -m tpuserve.queued_resource create     # body in $TPUSERVE_QR_BODY or --body-file
    python -m tpuserve.queued_resource delete     # force, waits until gone
    python -m tpuserve.queued_resource probe      # Terraform `external` data source protocol
    python -m tpuserve.queued_resource describe   # the QR as JSON

The QR name comes from --name or $TPUSERVE_QR_NAME (projects/P/locations/Z/queuedResources/ID).
An error prints one line to stderr and exits 1 (bad input: 2); never a traceback.

Transient faults never cost a queue position (issue 11): every call is retried by the API
edge's policy (google_api.RetryPolicy) within the command's --timeout; a wait whose reads keep
failing polls again (state UNREADABLE) until that timeout; and `create` deletes what it made
only on a definitive outcome (FAILED/SUSPENDED, or the create operation refused the spec).
Otherwise it leaves the QR in the queue and says so: the next deploy adopts it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from tpuserve.gcp.api import (
    CLOUD_PLATFORM_SCOPE,
    CREATE_TRANSIENT_CODES,
    TPU_API,
    ApiError,
    GoogleApi,
    RetryPolicy,
)
from tpuserve.render.node_metadata import node_metadata

if TYPE_CHECKING:  # the provisioner path must not pay for pydantic
    from tpuserve.settings import Deployment

API_VERSION = "v2alpha1"  # the only version with provisioningModel / runDuration (issue 3)
# The label that ties a QR to the Terraform plan that created it (see `probe`).
GENERATION_LABEL = "tpuserve-generation"
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
# A refused delete comes as 400, 409 or 412, with or without a status: the QR's own state, read
# after the refusal, says whether waiting helps (issue 11).
DELETE_REFUSAL_CODES = frozenset({400, 409, 412})

DEFAULT_POLL_S = 5.0
ACCEPT_TIMEOUT_S = 600.0
# SPEC 2: a QR in PROVISIONING cannot be deleted, and provisioning takes minutes.
DELETE_TIMEOUT_S = 1800.0
CLEANUP_TIMEOUT_S = 600.0

ENV_NAME = "TPUSERVE_QR_NAME"
ENV_BODY = "TPUSERVE_QR_BODY"
ENV_GENERATION = "TPUSERVE_QR_GENERATION"
ENV_POLL = "TPUSERVE_QR_POLL_SECONDS"

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
            "-> check it with `python -m tpuserve.queued_resource describe`, and retry once it "
            "reports a known state"
        )


class _Definitive(Exception):
    """A create's definitive failure (FAILED, or the spec refused): what it made is removed."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class BodyError(ValueError):
    """A queued-resource body that cannot be right (caught locally, before any API call)."""


class SpecMismatch(QueuedResourceError):
    """A QR with this name exists with a different spec; `differences` names the fields."""

    def __init__(self, name: str, differences: list[str]) -> None:
        self.differences = differences
        super().__init__(
            f"queued resource {name} exists with a different spec: {'; '.join(differences)} "
            "-> delete it (python -m tpuserve.queued_resource delete --name NAME) or redeploy "
            "with its settings"
        )


# ----------------------------------------------------------------------------- names


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


def queued_resource_id(d: Deployment) -> str:
    """The QR is named like its node: `gcloud ... queued-resources describe tpuserve-flex`."""
    return d.node_name


def ref_for(d: Deployment) -> QueuedResourceRef:
    return QueuedResourceRef(d.gcp.project, d.gcp.zone, queued_resource_id(d))


# ----------------------------------------------------------------------------- body


def duration_json(seconds: int) -> str:
    """google.protobuf.Duration's JSON form."""
    return f"{seconds}s"


def build_body(d: Deployment, startup_script: str) -> dict[str, Any]:
    """The v2alpha1 QueuedResource create body for a flex deployment (issue 3's shape).

    Pure: config in, dict out. The generation label is added at create time
    (`with_generation`), because only the plan knows it.
    """
    from tpuserve.settings.base import parse_duration

    if d.stack.provisioning_model != "flex":
        raise ValueError(
            f"stack.provisioning_model = {d.stack.provisioning_model!r}: a queued-resource body "
            "is built for the flex stack only"
        )
    body: dict[str, Any] = {
        "provisioningModel": "FLEX_START",
        # SPEC 2: flex-start is the only model that accepts a max run duration.
        "runDuration": {"maxRunDuration": duration_json(parse_duration(d.stack.max_run_duration))},
        "tpu": {
            "nodeSpec": [
                {
                    "parent": f"projects/{d.gcp.project}/locations/{d.gcp.zone}",
                    "nodeId": d.node_name,
                    "node": {
                        "acceleratorType": d.tpu.accelerator_type,
                        "runtimeVersion": d.tpu.runtime_version,
                        # Raw REST without enableExternalIps means no external IP (issue 3).
                        "networkConfig": network_config(d),
                        "shieldedInstanceConfig": {"enableSecureBoot": True},
                        "metadata": node_metadata(startup_script),
                        "serviceAccount": {
                            "email": d.service_account_email,
                            "scope": [CLOUD_PLATFORM_SCOPE],
                        },
                        "tags": [d.network_tag],
                        "labels": dict(d.labels),
                    },
                }
            ]
        },
    }
    if d.stack.valid_until_duration:
        body["queueingPolicy"] = {
            "validUntilDuration": duration_json(parse_duration(d.stack.valid_until_duration))
        }
    return body


def network_config(d: Deployment) -> dict[str, Any]:
    """The node's networkConfig: the deployment's own network and subnet (issue 10 section
    3), or the network the user brings (gcp.network)."""
    out: dict[str, Any] = {"network": d.network_name}
    if d.subnet_name:
        out["subnetwork"] = d.subnet_name
    out["enableExternalIps"] = True
    return out


def with_generation(body: Mapping[str, Any], generation: str) -> dict[str, Any]:
    """A copy of `body` whose node labels carry the plan's generation token."""
    if not re.fullmatch(r"[a-z0-9_-]{1,63}", generation):
        raise ValueError(
            f"generation {generation!r}: a label value is 1-63 lowercase letters, digits, "
            "'-' or '_'"
        )
    out = copy.deepcopy(dict(body))
    for spec in out["tpu"]["nodeSpec"]:
        spec["node"].setdefault("labels", {})[GENERATION_LABEL] = generation
    return out


def new_generation(now: float | None = None) -> str:
    """A fresh token (UTC time + 4 hex digits), valid as a label value."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def check_body(ref: QueuedResourceRef, body: object) -> dict[str, Any]:
    """Reject a body the API would reject for reasons we can see locally."""
    if not isinstance(body, dict):
        raise BodyError(f"queued resource body: must be a JSON object, got {type(body).__name__}")
    specs = body.get("tpu", {}).get("nodeSpec") if isinstance(body.get("tpu"), dict) else None
    if not isinstance(specs, list) or not specs:
        raise BodyError("queued resource body: tpu.nodeSpec must be a non-empty list")
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("node"), dict):
            raise BodyError(f"queued resource body: tpu.nodeSpec[{i}].node must be an object")
        if spec.get("parent") != ref.parent:
            raise BodyError(
                f"queued resource body: tpu.nodeSpec[{i}].parent = {spec.get('parent')!r}: must "
                f"be {ref.parent!r} (the queued resource's own project and zone)"
            )
        if not spec.get("nodeId"):
            raise BodyError(f"queued resource body: tpu.nodeSpec[{i}].nodeId is required")
    return body


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if len(text) > 60:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return f"<{len(text)} chars, sha256 {digest}>"
    return repr(value)


def spec_differences(wanted: object, actual: object, path: str = "") -> list[str]:
    """Fields of `wanted` that `actual` lacks or holds differently (output-only fields and
    server-side defaults in `actual` are ignored)."""
    if isinstance(wanted, dict):
        if not isinstance(actual, dict):
            return [f"{path or '(body)'}: {_short(actual)}, want an object"]
        out: list[str] = []
        for key, value in wanted.items():
            sub = f"{path}.{key}" if path else key
            if key not in actual:
                out.append(f"{sub}: missing, want {_short(value)}")
            else:
                out.extend(spec_differences(value, actual[key], sub))
        return out
    if isinstance(wanted, list) and wanted and all(isinstance(w, dict) for w in wanted):
        if not isinstance(actual, list) or len(actual) != len(wanted):
            return [f"{path}: {_short(actual)}, want {len(wanted)} item(s)"]
        return [d for i, w in enumerate(wanted) for d in spec_differences(w, actual[i],
                                                                         f"{path}[{i}]")]
    if path.endswith(("networkConfig.network", "networkConfig.subnetwork")) and isinstance(
        actual, str
    ):
        # The API may return the network and subnet as full URLs; the name is what matters.
        actual = actual.rsplit("/", 1)[-1]
        wanted = str(wanted).rsplit("/", 1)[-1]
    if wanted != actual:
        return [f"{path}: {_short(actual)}, want {_short(wanted)}"]
    return []


# ----------------------------------------------------------------------------- views


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
class Node:
    name: str
    state: str
    external_ip: str | None
    internal_ip: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Node:
        endpoints = data.get("networkEndpoints") or [{}]
        first = endpoints[0] if isinstance(endpoints[0], dict) else {}
        return cls(
            name=str(data.get("name", "")),
            state=str(data.get("state", "STATE_UNSPECIFIED")),
            external_ip=(first.get("accessConfig") or {}).get("externalIp") or None,
            internal_ip=first.get("ipAddress") or None,
            raw=dict(data),
        )


@dataclass(frozen=True)
class CreateResult:
    queued_resource: QueuedResource
    adopted: bool  # True: an existing QR with the same spec was kept


# ----------------------------------------------------------------------------- progress


class StatePrinter:
    """A Progress callback that prints one line whenever the state changes."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream
        self.last: str | None = None

    def __call__(self, state: str, elapsed: float) -> None:
        if state != self.last:
            self.last = state
            print(f"tpuserve: {self.label}: {state} ({elapsed:.0f} s)",
                  file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def rich_progress(label: str, stream: IO[str] | None = None) -> Iterator[Progress]:
    """A spinner for terminals (rich); one line per state change otherwise (provisioners)."""
    out = stream or sys.stderr
    if not out.isatty():  # Terraform's local-exec, CI, a pipe: plain lines, and no rich import
        yield StatePrinter(label, out)
        return
    from rich.console import Console

    console = Console(file=out)
    with console.status(f"{label}: ...") as status:
        printer = StatePrinter(label, console.file)

        def update(state: str, elapsed: float) -> None:
            if state != printer.last:
                console.log(f"{label}: {state}")
                printer.last = state
            status.update(f"{label}: {state} ({elapsed:.0f} s)")

        yield update


def _no_progress(state: str, elapsed: float) -> None:
    return None


# ----------------------------------------------------------------------------- client


class TpuClient(GoogleApi):
    """TPU API calls: queued resources (v2alpha1) and nodes (v2 or v2alpha1)."""

    def __init__(
        self, *, session: Any = None, root: str | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval: float = DEFAULT_POLL_S, policy: RetryPolicy | None = None,
        rand: Callable[[], float] | None = None,
    ) -> None:
        extra: dict[str, Any] = {"rand": rand} if rand is not None else {}
        super().__init__("tpu", TPU_API, session=session, root=root, environ=environ,
                         sleep=sleep, clock=clock, policy=policy, **extra)
        self.clock = clock
        self.sleep = sleep
        self.poll_interval = poll_interval

    # -- queued resources

    def get_queued_resource(self, ref: QueuedResourceRef) -> QueuedResource | None:
        """The QR, or None when it does not exist."""
        try:
            data = self.request("GET", f"{API_VERSION}/{ref.name}",
                                action=f"get queued resource {ref.name}")
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return QueuedResource.from_json(data)

    def _list(self, path: str, key: str, action: str) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list call (nextPageToken / pageToken)."""
        token: str | None = None
        while True:
            data = self.request("GET", path, params={"pageToken": token} if token else None,
                                action=action)
            yield from data.get(key, [])
            token = data.get("nextPageToken")
            if not token:
                return

    def list_queued_resources(self, project: str, zone: str) -> list[QueuedResource]:
        parent = f"projects/{project}/locations/{zone}"
        items = self._list(f"{API_VERSION}/{parent}/queuedResources", "queuedResources",
                           f"list queued resources in {parent}")
        return [QueuedResource.from_json(q) for q in items]

    @contextlib.contextmanager
    def _command(self, timeout: float) -> Iterator[float]:
        """Retries inside this block end with the command's timeout; yields its start."""
        start, outer = self.clock(), self.deadline
        end = start + timeout
        self.deadline = end if outer is None else min(outer, end)
        try:
            yield start
        finally:
            self.deadline = outer

    def _poll(self, ref: QueuedResourceRef) -> tuple[QueuedResource | None, str]:
        """One read of the QR for a wait loop: (QR or None, state). A read whose transient
        errors outlasted their retries is UNREADABLE, not a verdict: the loop polls again."""
        try:
            qr = self.get_queued_resource(ref)
        except ApiError as exc:
            if not self.policy.is_transient(exc.code):
                raise
            return None, f"{UNREADABLE} ({exc.code} {exc.status})"
        return qr, qr.state if qr else MISSING

    def create_queued_resource(
        self, ref: QueuedResourceRef, body: Mapping[str, Any], *,
        timeout: float = ACCEPT_TIMEOUT_S, on_progress: Progress | None = None,
    ) -> CreateResult:
        """Create the QR and return once it is ACCEPTED or further.

        Idempotent: a live QR with the same spec is adopted; a different one raises
        SpecMismatch naming the fields. A dead one (SUSPENDED, FAILED) holds the name and
        quota, so it is deleted first; a DELETING one is waited out; one in a state this
        client does not know is left alone (UnknownState).

        What this create made is deleted again only on a definitive outcome (the QR FAILED
        or was SUSPENDED, or the create operation refused the spec); any other failure (a
        timeout, reads that keep failing) leaves it, and the error says how to resume.
        """
        body = check_body(ref, dict(body))
        progress = on_progress or _no_progress
        with self._command(timeout) as start:
            existing = self.get_queued_resource(ref)
            if existing is not None and existing.state not in KNOWN_STATES:
                raise UnknownState(existing)
            if existing is not None and existing.state not in ALIVE_STATES:
                self.delete_queued_resource(ref, timeout=timeout, on_progress=progress)
                existing = None
            op: dict[str, Any] = {}
            if existing is None:
                try:
                    # Retried on 5xx and resets: the id makes a repeat answer 409, judged below.
                    op = self.request(
                        "POST", f"{API_VERSION}/{ref.parent}/queuedResources",
                        params={"queuedResourceId": ref.queued_resource_id}, body=body,
                        action=f"create queued resource {ref.name}", idempotent=True,
                        transient_codes=CREATE_TRANSIENT_CODES,
                    )
                except ApiError as exc:
                    if exc.code != 409:
                        raise
                    ours = self.earlier_try_unanswered
                    existing = self.get_queued_resource(ref)  # lost a race: judge what is there
                    if existing is None:
                        raise
                    if ours:
                        # An earlier try of this very POST may have acted (its answer was lost
                        # or a 5xx): the QR is this create's own, cleanup included.
                        existing = None
            if existing is not None:
                diffs = spec_differences(body, existing.raw)
                if diffs:
                    raise SpecMismatch(ref.name, diffs)
            remaining = max(0.0, timeout - (self.clock() - start))
            try:
                qr = self._wait_accepted(ref, op, remaining, progress)
            except _Definitive as failed:
                if existing is None:
                    self._remove_failed_create(ref, failed.error, progress)
                raise failed.error from None
            except (ApiError, QueuedResourceError) as exc:
                if existing is None:
                    exc.add_note(
                        f"the queued resource {ref.name} was left in place (it keeps its place "
                        "in the queue): deploy again (cdktf deploy flex) to adopt it, or delete "
                        f"it with `python -m tpuserve.queued_resource delete --name {ref.name}`"
                    )
                raise
        return CreateResult(qr, adopted=existing is not None)

    def _remove_failed_create(
        self, ref: QueuedResourceRef, exc: Exception, progress: Progress
    ) -> None:
        """Delete what a definitively failed create made: Terraform skips destroy provisioners
        of a tainted resource, so a QR left here could provision later and bill with nothing
        tracking it."""
        try:
            if self.delete_queued_resource(ref, timeout=CLEANUP_TIMEOUT_S, on_progress=progress):
                exc.add_note("the queued resource this create made was deleted again")
        except (ApiError, QueuedResourceError) as cleanup:
            exc.add_note(
                f"removing the queued resource this create made failed too ({cleanup}): delete "
                f"it with `python -m tpuserve.queued_resource delete --name {ref.name}`"
            )

    def _wait_accepted(
        self, ref: QueuedResourceRef, op: Mapping[str, Any], timeout: float, progress: Progress
    ) -> QueuedResource:
        start = self.clock()
        action = f"create queued resource {ref.name}"
        while True:
            if op.get("done") and isinstance(op.get("error"), dict):
                raise _Definitive(ApiError.from_status(op["error"], action=action,
                                                       service="tpu"))
            qr, state = self._poll(ref)
            elapsed = self.clock() - start
            progress(state, elapsed)
            if qr is not None and qr.state in ACCEPTED_OR_LATER:
                return qr
            if qr is not None and qr.state in DEAD_STATES:
                raise _Definitive(QueuedResourceError(_dead_message(qr)))
            if elapsed >= timeout:
                raise WaitTimeout(
                    f"queued resource {ref.name} is {state} after {elapsed:.0f} s, not "
                    "ACCEPTED yet -> check it with `python -m tpuserve.queued_resource "
                    "describe`, then deploy again (create is idempotent)"
                )
            self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))
            if op.get("name") and not op.get("done"):
                op = self._poll_operation(op)

    def _poll_operation(self, op: Mapping[str, Any]) -> dict[str, Any]:
        """The operation's next state; the last one known while reads fail transiently."""
        try:
            return self.get_operation(str(op["name"]))
        except ApiError as exc:
            if not self.policy.is_transient(exc.code):
                raise
            return dict(op)

    def _raise_if_failed_op(self, op: Mapping[str, Any], action: str) -> None:
        if op.get("done") and isinstance(op.get("error"), dict):
            raise ApiError.from_status(op["error"], action=action, service="tpu")

    def delete_queued_resource(
        self, ref: QueuedResourceRef, *, force: bool = True,
        timeout: float = DELETE_TIMEOUT_S, on_progress: Progress | None = None,
    ) -> bool:
        """Delete the QR (with force: its node first) and wait until it is gone.

        A missing QR is success (returns False: nothing was deleted). A QR in PROVISIONING
        cannot be deleted (SPEC 2): a refused delete (400, 409 or 412, whatever its status
        says) is retried within `timeout` while the QR, read again, is PROVISIONING.
        """
        progress = on_progress or _no_progress
        with self._command(timeout) as start:
            op: dict[str, Any] = {}
            refused = False
            waiting = (f"PROVISIONING (cannot be deleted until provisioning ends; retrying for "
                       f"up to {timeout:.0f} s)")
            while True:
                qr, state = self._poll(ref)
                elapsed = self.clock() - start
                if state.startswith(UNREADABLE):  # transient faults outlasted their retries
                    progress(state, elapsed)
                    self._unreadable_pause(ref, elapsed, timeout)
                    continue
                if qr is None:
                    progress(MISSING, elapsed)
                    return False
                progress(waiting if refused and qr.state == "PROVISIONING" else qr.state,
                         elapsed)
                if qr.state == "DELETING":
                    break
                try:
                    op = self.request(
                        "DELETE", f"{API_VERSION}/{ref.name}",
                        params={"force": "true"} if force else None,
                        action=f"delete queued resource {ref.name}",
                    )
                    break
                except ApiError as exc:
                    if exc.code == 404:
                        progress(MISSING, self.clock() - start)
                        return False
                    if exc.code not in DELETE_REFUSAL_CODES:
                        raise
                    # The refusal's words vary; the QR's own state says whether to wait.
                    now, state = self._poll(ref)
                    if state.startswith(UNREADABLE):
                        progress(state, elapsed)
                        self._unreadable_pause(ref, elapsed, timeout)
                        continue
                    if now is None:
                        progress(MISSING, self.clock() - start)
                        return False
                    if now.state == "DELETING":
                        break
                    if now.state != "PROVISIONING":
                        raise
                    if not refused:
                        refused = True
                        progress(waiting, elapsed)
                    if elapsed >= timeout:
                        raise WaitTimeout(
                            f"queued resource {ref.name} is still PROVISIONING after "
                            f"{elapsed:.0f} s and cannot be deleted until it finishes (SPEC 2) "
                            "-> run the delete again in a few minutes (cdktf destroy flex)"
                        ) from None
                    self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))
            remaining = max(0.0, timeout - (self.clock() - start))
            self.wait_for_state(ref, {MISSING}, timeout=remaining, fail_states=(),
                                on_progress=progress, operation=op)
        return True

    def _unreadable_pause(self, ref: QueuedResourceRef, elapsed: float, timeout: float) -> None:
        """In a delete's wait: past `timeout` a WaitTimeout, else one poll interval."""
        if elapsed >= timeout:
            raise WaitTimeout(
                f"queued resource {ref.name} could not be read for {elapsed:.0f} s (transient "
                "API errors) -> run the delete again (cdktf destroy flex)"
            )
        self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))

    def wait_for_state(
        self, ref: QueuedResourceRef, targets: Collection[str], *, timeout: float,
        fail_states: Collection[str] | None = None, on_progress: Progress | None = None,
        operation: Mapping[str, Any] | None = None,
    ) -> QueuedResource | None:
        """Poll until the QR's state is in `targets` (MISSING = gone); return it (None if gone).

        `fail_states` (default: the dead states, and MISSING unless targeted) raise at once.
        A done `operation` with an error raises it. Reads that fail transiently (after their
        own retries) are polled again until `timeout`.
        """
        if fail_states is None:
            fail_states = DEAD_STATES | ({MISSING} - set(targets))
        progress = on_progress or _no_progress
        op = dict(operation or {})
        start = self.clock()
        while True:
            qr, state = self._poll(ref)
            elapsed = self.clock() - start
            progress(state, elapsed)
            if state in targets:
                return qr
            if state in fail_states:
                raise QueuedResourceError(
                    _dead_message(qr) if qr else f"queued resource {ref.name} disappeared "
                    f"while waiting for {'/'.join(sorted(targets))}"
                )
            self._raise_if_failed_op(op, f"wait for queued resource {ref.name}")
            if elapsed >= timeout:
                raise WaitTimeout(
                    f"queued resource {ref.name} is {state} after {elapsed:.0f} s, not "
                    f"{'/'.join(sorted(targets))} -> wait longer, or check it with `python -m "
                    "tpuserve.gcp.queued_resource describe`"
                )
            self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))
            if op.get("name") and not op.get("done"):
                op = self._poll_operation(op)

    # -- operations

    def get_operation(self, name: str, *, api_version: str = API_VERSION) -> dict[str, Any]:
        return self.request("GET", f"{api_version}/{name}", action=f"get operation {name}")

    def wait_operation(
        self, operation: Mapping[str, Any], *, timeout: float,
        api_version: str = API_VERSION, on_progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Poll a long-running operation until done; return its `response`, raise its error."""
        progress = on_progress or _no_progress
        op = dict(operation)
        name = str(op.get("name", ""))
        start = self.clock()
        while True:
            elapsed = self.clock() - start
            progress("DONE" if op.get("done") else "RUNNING", elapsed)
            if op.get("done"):
                self._raise_if_failed_op(op, f"operation {name}")
                return dict(op.get("response") or {})
            if not name:
                raise QueuedResourceError("operation has no name and is not done")
            if elapsed >= timeout:
                raise WaitTimeout(f"operation {name} is not done after {elapsed:.0f} s")
            self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))
            op = self.get_operation(name, api_version=api_version)

    # -- nodes

    def get_node(
        self, project: str, zone: str, node_id: str, *, api_version: str = "v2"
    ) -> Node | None:
        """The node (state, external IP), or None when it does not exist."""
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        try:
            return Node.from_json(
                self.request("GET", f"{api_version}/{name}", action=f"get node {name}")
            )
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list_nodes(self, project: str, zone: str, *, api_version: str = "v2") -> list[Node]:
        parent = f"projects/{project}/locations/{zone}"
        items = self._list(f"{api_version}/{parent}/nodes", "nodes", f"list nodes in {parent}")
        return [Node.from_json(n) for n in items]

    def get_guest_attributes(
        self, project: str, zone: str, node_id: str, query_path: str = "", *,
        api_version: str = "v2",
    ) -> dict[str, str]:
        """The node's guest attributes under `query_path` ("" = all), as {"ns/key": value}."""
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        data = self.request(
            "POST", f"{api_version}/{name}:getGuestAttributes", body={"queryPath": query_path},
            action=f"get guest attributes of {name}", idempotent=True,  # a read, as a POST
        )
        out: dict[str, str] = {}
        for attrs in data.get("guestAttributes", []):
            for item in (attrs.get("queryValue") or {}).get("items", []):
                out[f"{item.get('namespace', '')}/{item.get('key', '')}"] = str(
                    item.get("value", "")
                )
        return out


def _dead_message(qr: QueuedResource) -> str:
    why = f": {qr.failure}" if qr.failure else ""
    return (
        f"queued resource {qr.name} is {qr.state}{why} -> deploy again to create a fresh one "
        "(cdktf deploy flex), or delete it (cdktf destroy flex)"
    )


# ----------------------------------------------------------------------------- probe


def probe(client: TpuClient, ref: QueuedResourceRef) -> dict[str, str]:
    """The replacement token the flex stack puts in triggers_replace.

    A live QR answers with the generation label it was created with, so the plan is a no-op;
    a missing, SUSPENDED, FAILED or DELETING one answers with a new token, so Terraform plans
    a replacement exactly when the QR is dead. A state this client does not know
    (STATE_UNSPECIFIED) is not a reason to replace: the QR keeps its token, reported as
    unknown; without a token to keep, the probe fails (UnknownState) rather than guess.
    """
    qr = client.get_queued_resource(ref)
    state = qr.state if qr else MISSING
    if qr is not None and state not in KNOWN_STATES:
        if not qr.generation:
            raise UnknownState(qr)
        return {"generation": qr.generation, "state": f"UNKNOWN ({state})"}
    if qr is not None and state in ALIVE_STATES and qr.generation:
        return {"generation": qr.generation, "state": state}
    return {"generation": new_generation(), "state": state}


# ----------------------------------------------------------------------------- CLI


class _UsageError(Exception):
    pass


def _env_poll(environ: Mapping[str, str]) -> float:
    raw = environ.get(ENV_POLL, "")
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 600:
        raise _UsageError(f"{ENV_POLL} = {raw!r}: seconds between polls, 0-600")
    return value


def _ref_arg(args: argparse.Namespace, environ: Mapping[str, str]) -> QueuedResourceRef:
    name = args.name or environ.get(ENV_NAME, "")
    if not name:
        raise _UsageError(f"the queued resource name is missing: pass --name or set {ENV_NAME}")
    try:
        return QueuedResourceRef.parse(name)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _body_arg(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    if args.body_file:
        source, text = f"--body-file {args.body_file}", _read(args.body_file)
    elif environ.get(ENV_BODY):
        source, text = ENV_BODY, environ[ENV_BODY]
    else:
        raise _UsageError(f"the queued resource body is missing: set {ENV_BODY} or --body-file")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise _UsageError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _UsageError(f"{source}: must be a JSON object")
    return body


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise _UsageError(f"--body-file {path}: {exc.strerror}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tpuserve.queued_resource",
        description="Flex-start queued resources (TPU API v2alpha1); used by the flex stack.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    name_help = f"projects/P/locations/Z/queuedResources/ID (default: ${ENV_NAME})"
    create = sub.add_parser("create", help="create (or adopt) and wait until ACCEPTED")
    create.add_argument("--name", help=name_help)
    create.add_argument("--body-file", help=f"the JSON body (default: ${ENV_BODY})")
    create.add_argument("--generation", help=f"label token (default: ${ENV_GENERATION})")
    create.add_argument("--timeout", type=float, default=ACCEPT_TIMEOUT_S)
    delete = sub.add_parser("delete", help="delete with force and wait until gone")
    delete.add_argument("--name", help=name_help)
    delete.add_argument("--timeout", type=float, default=DELETE_TIMEOUT_S)
    describe = sub.add_parser("describe", help="print the queued resource as JSON")
    describe.add_argument("--name", help=name_help)
    sub.add_parser("probe", help='Terraform external data source: stdin {"name": ...}')
    return parser


def _run(
    args: argparse.Namespace, environ: Mapping[str, str], stdin: IO[str], stdout: IO[str],
    stderr: IO[str],
) -> int:
    try:
        client = TpuClient(environ=environ, poll_interval=_env_poll(environ))
    except ValueError as exc:  # a malformed endpoint override or TPUSERVE_TIME_SCALE
        raise _UsageError(str(exc)) from None
    if args.command == "probe":
        try:
            query = json.loads(stdin.read() or "{}")
        except ValueError as exc:
            raise _UsageError(f"probe: stdin is not a JSON object ({exc})") from None
        if not isinstance(query, dict) or not isinstance(query.get("name"), str):
            raise _UsageError('probe: stdin must be a JSON object like {"name": "projects/..."}')
        try:
            ref = QueuedResourceRef.parse(query["name"])
        except ValueError as exc:
            raise _UsageError(f"probe: {exc}") from None
        json.dump(probe(client, ref), stdout)
        stdout.write("\n")
        return 0
    ref = _ref_arg(args, environ)
    if args.command == "describe":
        qr = client.get_queued_resource(ref)
        if qr is None:
            print(f"tpuserve: queued resource {ref.name} does not exist", file=stderr)
            return 1
        json.dump(qr.raw, stdout, indent=2, sort_keys=True)
        stdout.write("\n")
        return 0
    label = f"queued resource {ref.queued_resource_id}"
    if args.command == "create":
        body = _body_arg(args, environ)
        generation = args.generation or environ.get(ENV_GENERATION, "")
        try:
            check_body(ref, body)
            if generation:
                body = with_generation(body, generation)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
        with rich_progress(label, stderr) as progress:
            result = client.create_queued_resource(
                ref, body, timeout=args.timeout, on_progress=progress
            )
        verb = "adopted" if result.adopted else "created"
        print(
            f"tpuserve: {verb} {ref.name}: {result.queued_resource.state}; ACTIVE can take a "
            "while: wait for it with `tpuserve wait flex`", file=stdout,
        )
        return 0
    with rich_progress(label, stderr) as progress:
        deleted = client.delete_queued_resource(ref, timeout=args.timeout, on_progress=progress)
    print(f"tpuserve: {'deleted' if deleted else 'already gone:'} {ref.name}", file=stdout)
    return 0


def main(
    argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None,
    stdin: IO[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
) -> int:
    env = os.environ if environ is None else environ
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = _parser().parse_args(argv)
    try:
        return _run(args, env, stdin or sys.stdin, out, err)
    except _UsageError as exc:
        print(f"tpuserve: {exc}", file=err)
        return 2
    except (ApiError, QueuedResourceError) as exc:
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
        print(f"tpuserve: {exc}{notes}", file=err)
        return 1
    except KeyboardInterrupt:
        print("tpuserve: interrupted", file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main())
