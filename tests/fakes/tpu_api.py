"""A fake Cloud TPU API on 127.0.0.1: v2alpha1 queued resources, v2/v2alpha1 nodes, operations.

Every request is checked against Google's discovery document of its version (tpu.v2 or
tpu.v2alpha1, by the path's prefix; tests/fakes/discovery.py): method and URL path, query
parameters, the body's fields, types and enums, read-only fields refused; and every answer
against the method's response schema. Anything else gets the real API's error JSON
({"error": {"code", "message", "status"}}). It is stricter than the real API in three ways
that guard this project's own rules: a create must carry provisioningModel and runDuration,
networkConfig.enableExternalIps must be true (raw REST without it gives no external IP), and
snake_case field names are refused (the real parser accepts them; the document names only
the camelCase ones).

Usage:

    with FakeTpuApi() as api:                    # manual state machine
        env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": api.url,
               "CLOUDSDK_AUTH_ACCESS_TOKEN": api.token}
        ...                                       # client calls
        api.advance()                             # every QR one step along its chain
        api.set_state("tpuserve-flex", "SUSPENDED")
        api.calls("POST")                         # what it received

    FakeTpuApi(durations=ZERO_DURATIONS)          # time-based: states advance on each request
                                                  # once they have lasted their duration
                                                  # (clock injectable); ACTIVE lasts the body's
                                                  # maxRunDuration, then SUSPENDED, node deleted

State chain: CREATING -> ACCEPTED -> WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE ->
SUSPENDING -> SUSPENDED; DELETING -> (gone). PROVISIONING refuses deletion (FAILED_PRECONDITION).
A node takes nodes.patch (updateMask: description, tags, labels, metadata,
networkConfig.enable_external_ips); the change lands when its operation is done (after
`patch_reads_until_done` reads), on the node only: its queued resource keeps its spec.
No sleeps anywhere: time only moves when the clock says so.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Self

from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from .discovery import Call, Discovery, DiscoveryRefusal, check_answer, raw_path

DEFAULT_TOKEN = "fake-access-token"
CHAIN = {
    "CREATING": "ACCEPTED",
    "ACCEPTED": "WAITING_FOR_RESOURCES",
    "WAITING_FOR_RESOURCES": "PROVISIONING",
    "PROVISIONING": "ACTIVE",
    "ACTIVE": "SUSPENDING",
    "SUSPENDING": "SUSPENDED",
}
# STATE_UNSPECIFIED: the enum's zero value, which the API may report (tests set it by hand).
QR_STATES = frozenset(CHAIN) | {"SUSPENDED", "FAILED", "DELETING", "STATE_UNSPECIFIED"}
# Everything happens at once: a create is ACTIVE on the next request, a delete gone on the next.
ZERO_DURATIONS: Mapping[str, float] = {
    "CREATING": 0, "ACCEPTED": 0, "WAITING_FOR_RESOURCES": 0, "PROVISIONING": 0,
    "SUSPENDING": 0, "DELETING": 0,
}
_STATE_DATA = {
    "CREATING": "creatingData", "ACCEPTED": "acceptedData", "PROVISIONING": "provisioningData",
    "FAILED": "failedData", "DELETING": "deletingData", "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData", "SUSPENDED": "suspendedData",
}

# ---------------------------------------------------------------- the documented shapes
# Request and answer shapes come from the discovery documents (tests/fakes/discovery.py);
# what follows is the fake's own bookkeeping: the fields it never copies from a body into
# state (it writes them itself) and the patchable fields nodes.patch's updateMask documents.
NODE_OUTPUT_ONLY = frozenset({
    "name", "state", "healthDescription", "health", "id", "createTime", "networkEndpoints",
    "apiVersion", "symptoms", "queuedResource", "multisliceNode",
})
QR_OUTPUT_ONLY = frozenset({"name", "createTime", "state"})
# nodes.patch's updateMask: "Supported fields: [description, tags, labels, metadata,
# networkConfig.enable_external_ips]" (a FieldMask's JSON form is camelCase; both spellings
# of the nested one are accepted).
NODE_PATCHABLE = {
    "description": ("description",), "tags": ("tags",), "labels": ("labels",),
    "metadata": ("metadata",),
    "networkConfig.enableExternalIps": ("networkConfig", "enableExternalIps"),
    "networkConfig.enable_external_ips": ("networkConfig", "enableExternalIps"),
    "network_config.enable_external_ips": ("networkConfig", "enableExternalIps"),
}
MAX_FLEX_RUN_S = 7 * 24 * 3600  # flex-start lasts at most 7 days
_ID_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class ApiFault(Exception):
    """Becomes the real API's error JSON ({"error": {"code", "message", "status"}}; `status`
    left out when empty, as some front-end answers do), with Retry-After when given."""

    def __init__(self, code: int, status: str, message: str, *,
                 retry_after: str | None = None,
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message
        self.retry_after = retry_after
        self.details = details  # google.rpc.Status details (ErrorInfo, QuotaFailure, ...)

    def response(self) -> Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.status:
            error["status"] = self.status
        if self.details is not None:
            error["details"] = self.details
        headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
        return Response(json.dumps({"error": error}), self.code, headers=headers,
                        mimetype="application/json")


# What Google's front end (not the API) answers when a backend is unreachable: an HTML page.
HTML_ERROR_PAGE = """<!DOCTYPE html>
<html lang=en><meta charset=utf-8><title>Error {code} ({phrase})!!1</title>
<p><b>{code}.</b> <ins>That's an error.</ins><p>The server encountered a temporary error and
could not complete your request.<p>Please try again in 30 seconds. <ins>That's all we know.</ins>
"""


@dataclass
class Fault:
    """One entry of the fault queue: what the next `times` matching requests get instead of an
    answer. kind: "error" (the API's error JSON), "html" (the front end's HTML page), "drop"
    (the connection is closed without an answer), "stall" (the answer starts, then no byte
    comes for `seconds`) or "raw" (exactly `raw`: status, body, headers)."""

    kind: str
    method: str | None
    path_contains: str | None
    times: int
    error: ApiFault | None = None
    seconds: float = 0.0
    skip: int = 0  # matching requests answered normally before this fault starts
    raw: tuple[int, bytes, dict[str, str]] | None = None

    def matches(self, request: Request) -> bool:
        return (self.method is None or self.method == request.method) and (
            self.path_contains is None or self.path_contains in request.path)


def _invalid(message: str) -> ApiFault:
    return ApiFault(400, "INVALID_ARGUMENT", message)


def _node_fields(version: str) -> Mapping[str, Any]:
    """Node's fields in the discovery document of `version` (v2, v2alpha1)."""
    return Discovery.load("tpu", version).schemas["Node"]["properties"]


def _seconds(duration: str) -> float:
    return float(duration[:-1])


def flex_body(
    project: str, zone: str, node_id: str, *, max_run_duration: str = "14400s",
    labels: Mapping[str, str] | None = None, startup_script: str = "#!/bin/bash\ntrue\n",
) -> dict[str, Any]:
    """A valid flex-start create body, for seeding and for tests."""
    return {
        "provisioningModel": "FLEX_START",
        "runDuration": {"maxRunDuration": max_run_duration},
        "tpu": {"nodeSpec": [{
            "parent": f"projects/{project}/locations/{zone}",
            "nodeId": node_id,
            "node": {
                "acceleratorType": "v5litepod-1",
                "runtimeVersion": "v2-alpha-tpuv5-lite",
                "networkConfig": {"network": "default", "enableExternalIps": True},
                "metadata": {"startup-script": startup_script},
                "serviceAccount": {"email": f"sa@{project}.iam.gserviceaccount.com",
                                   "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
                "tags": [node_id],
                "labels": dict(labels or {}),
            },
        }]},
    }


# ---------------------------------------------------------------- records


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorized: bool  # a bearer token was present (the token itself is never stored)


@dataclass
class _QueuedResource:
    name: str
    body: dict[str, Any]
    state: str
    entered: float
    created: float
    failure: str = ""

    @property
    def parent(self) -> str:
        return self.name.split("/queuedResources/")[0]

    @property
    def node_names(self) -> list[str]:
        return [f"{s['parent']}/nodes/{s['nodeId']}" for s in self.body["tpu"]["nodeSpec"]]

    def json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in QR_OUTPUT_ONLY}
        state: dict[str, Any] = {"state": self.state, "stateInitiator": "USER"}
        if self.state in _STATE_DATA:
            state[_STATE_DATA[self.state]] = (
                {"error": {"code": 9, "message": self.failure}} if self.state == "FAILED" else {}
            )
        return {"name": self.name, "createTime": _rfc3339(self.created), **out, "state": state}


@dataclass
class _Node:
    name: str
    spec: dict[str, Any]
    state: str
    external_ip: str | None
    internal_ip: str
    queued_resource: str | None
    created: float
    entered: float
    guest_attributes: dict[tuple[str, str], str] = field(default_factory=dict)

    def json(self, api_version: str) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.spec.items() if k not in NODE_OUTPUT_ONLY}
        out.update(name=self.name, state=self.state, createTime=_rfc3339(self.created),
                   apiVersion="V2" if api_version == "v2" else "V2_ALPHA1")
        if self.state == "READY":
            out["health"] = "HEALTHY"
            endpoint: dict[str, Any] = {"ipAddress": self.internal_ip, "port": 8470}
            if self.external_ip:
                endpoint["accessConfig"] = {"externalIp": self.external_ip}
            out["networkEndpoints"] = [endpoint]
        if self.queued_resource:
            out["queuedResource"] = self.queued_resource
        return out


@dataclass
class _Operation:
    name: str
    verb: str
    target: str
    api_version: str
    created: float
    done: Callable[[], bool]
    response: Callable[[], dict[str, Any]]
    error: dict[str, Any] | None = None

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "metadata": {
                "@type": f"type.googleapis.com/google.cloud.tpu.{self.api_version}."
                         "OperationMetadata",
                "createTime": _rfc3339(self.created), "target": self.target, "verb": self.verb,
                "apiVersion": self.api_version,
            },
            "done": False,
        }
        if self.error is not None:
            out.update(done=True, error=self.error)
        elif self.done():
            out.update(done=True, response=self.response())
        return out


def _document(path: str) -> Discovery:
    """The discovery document of the version the path names (v2alpha1 or v2)."""
    return Discovery.load("tpu", "v2alpha1" if path.startswith("/v2alpha1/") else "v2")


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---------------------------------------------------------------- the server

_V = r"(?P<v>v2alpha1|v2)"
_LOC = r"projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"/v2alpha1/{_LOC}/queuedResources"), "create_qr"),
    ("GET", re.compile(rf"/v2alpha1/{_LOC}/queuedResources"), "list_qrs"),
    ("GET", re.compile(rf"/v2alpha1/{_LOC}/queuedResources/(?P<id>[^/:]+)"), "get_qr"),
    ("DELETE", re.compile(rf"/v2alpha1/{_LOC}/queuedResources/(?P<id>[^/:]+)"), "delete_qr"),
    ("GET", re.compile(rf"/{_V}/{_LOC}/operations/(?P<op>[^/:]+)"), "get_operation"),
    ("GET", re.compile(rf"/{_V}/{_LOC}/nodes"), "list_nodes"),
    ("GET", re.compile(rf"/{_V}/{_LOC}/nodes/(?P<id>[^/:]+)"), "get_node"),
    ("DELETE", re.compile(rf"/{_V}/{_LOC}/nodes/(?P<id>[^/:]+)"), "delete_node"),
    ("PATCH", re.compile(rf"/{_V}/{_LOC}/nodes/(?P<id>[^/:]+)"), "patch_node"),
    ("POST", re.compile(rf"/{_V}/{_LOC}/nodes/(?P<id>[^/:]+):getGuestAttributes"),
     "guest_attributes"),
]
class _QuietHandler(WSGIRequestHandler):
    # Headers and body go out as separate writes: without TCP_NODELAY the second waits for
    # the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True

    def log_request(self, *args: Any, **kwargs: Any) -> None:  # tests read api.requests
        return None


class FakeTpuApi:
    """The fake server plus handles to seed, advance and inspect it (thread-safe)."""

    def __init__(
        self, *, token: str | None = DEFAULT_TOKEN,
        durations: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token or DEFAULT_TOKEN
        self._require_exact_token = token is not None
        self.durations = dict(durations) if durations is not None else None
        self.clock = clock
        self.requests: list[Recorded] = []
        self.queued_resources: dict[str, _QueuedResource] = {}
        self.nodes: dict[str, _Node] = {}
        self.operations: dict[str, _Operation] = {}
        self._faults: list[Fault] = []
        self._stopping = threading.Event()  # ends a stall early: stop() stays fast
        self._create_errors: list[dict[str, Any]] = []
        self._patch_errors: list[dict[str, Any]] = []
        self._afters: list[tuple[Fault, Callable[[], None]]] = []
        self._patch_hooks: list[Callable[[], None]] = []
        # Zones whose nodes.list / queuedResources.list answers leave their items out and name
        # the zone in `unreachable` ("Locations that could not be reached", tpu v2/v2alpha1).
        self.unreachable: set[str] = set()
        # How many reads of a nodes.patch operation answer done=false before it is applied
        # (the change lands when the operation is done, as the real API reports it).
        self.patch_reads_until_done = 1
        # How a delete of a PROVISIONING QR is refused: (HTTP code, status; "" = no status
        # field). The docs promise no exact shape: 400, 409 and 412 have all been seen.
        self.provisioning_delete_refusal: tuple[int, str] = (400, "FAILED_PRECONDITION")
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> Self:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True,
                                   request_handler=_QuietHandler)
        # A short poll keeps stop() fast (shutdown waits for the loop to look at its flag).
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The API root, for CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU."""
        return f"http://127.0.0.1:{self._server.server_port}/"

    def environ(self) -> dict[str, str]:
        """The variables that point gcloud-convention clients at this fake."""
        return {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.url,
                "CLOUDSDK_AUTH_ACCESS_TOKEN": self.token}

    # -- seeding and steering (test side)

    @staticmethod
    def qr_name(project: str, zone: str, qr_id: str) -> str:
        return f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"

    def seed_queued_resource(
        self, project: str, zone: str, qr_id: str, *, state: str = "ACTIVE",
        body: Mapping[str, Any] | None = None, generation: str | None = None,
    ) -> str:
        body = dict(body or flex_body(project, zone, qr_id))
        if generation is not None:
            for spec in body["tpu"]["nodeSpec"]:
                spec["node"].setdefault("labels", {})["tpuserve-generation"] = generation
        name = self.qr_name(project, zone, qr_id)
        with self._lock:
            now = self.clock()
            self.queued_resources[name] = _QueuedResource(name, json.loads(json.dumps(body)),
                                                          "CREATING", now, now)
            self._enter(self.queued_resources[name], state)
        return name

    def seed_node(
        self, project: str, zone: str, node_id: str, *, state: str = "READY",
        spec: Mapping[str, Any] | None = None, external_ip: str | None = "auto",
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """A standalone TPU VM (spot / on-demand stacks)."""
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        spec = dict(spec or {"acceleratorType": "v5litepod-1",
                             "runtimeVersion": "v2-alpha-tpuv5-lite",
                             "networkConfig": {"network": "default",
                                               "enableExternalIps": True}})
        if labels is not None:
            spec["labels"] = dict(labels)
        with self._lock:
            n = next(self._ids)
            ip = f"203.0.113.{n % 250 + 1}" if external_ip == "auto" else external_ip
            now = self.clock()
            self.nodes[name] = _Node(name, spec, state, ip, f"10.128.0.{n % 250 + 1}", None,
                                     now, now)
        return name

    def set_node_state(self, node_id: str, state: str) -> None:
        """Jump a node to `state` (e.g. PREEMPTED), as the platform would."""
        with self._lock:
            self._node(node_id).state = state

    def set_node_ip(self, node_id: str, ip: str | None) -> None:
        with self._lock:
            self._node(node_id).external_ip = ip

    def set_state(self, qr: str, state: str, *, failure: str = "") -> None:
        """Jump a QR to `state` (by full name or id), with the node side effects."""
        if state not in QR_STATES:
            raise ValueError(f"unknown QR state {state!r}")
        with self._lock:
            record = self._qr(qr)
            record.failure = failure or "fake: capacity could not be provisioned"
            self._enter(record, state)

    def remove_queued_resource(self, qr: str) -> None:
        """As if deleted by hand outside Terraform: QR and node vanish."""
        with self._lock:
            record = self._qr(qr)
            for node in record.node_names:
                self.nodes.pop(node, None)
            del self.queued_resources[record.name]

    def advance(self, qr: str | None = None) -> None:
        """Every QR (or one) one step along the chain; DELETING ones and nodes go away."""
        with self._lock:
            targets = [self._qr(qr)] if qr else list(self.queued_resources.values())
            for record in targets:
                self._step(record)
            if qr is None:
                for name in [n for n, node in self.nodes.items() if node.state == "DELETING"]:
                    del self.nodes[name]

    def set_guest_attribute(self, node: str, key: str, value: str,
                            namespace: str = "tpuserve") -> None:
        with self._lock:
            self._node(node).guest_attributes[(namespace, key)] = value

    def fail_next(
        self, code: int, status: str, message: str, *, method: str | None = None,
        path_contains: str | None = None, times: int = 1, retry_after: str | None = None,
        skip: int = 0, details: list[dict[str, Any]] | None = None,
    ) -> None:
        """The next `times` matching requests (after `skip` answered ones) get this error
        instead of an answer (status "" leaves the JSON's status field out; retry_after adds
        the Retry-After header; details are the google.rpc.Status details, e.g. ErrorInfo)."""
        self._queue(Fault("error", method, path_contains, times,
                          ApiFault(code, status, message, retry_after=retry_after,
                                   details=details), skip=skip))

    def after_next(self, action: Callable[[], None], *, method: str | None = None,
                   path_contains: str | None = None, skip: int = 0) -> None:
        """Run `action` (e.g. another client's metadata write) once, right after the next
        matching request (after `skip` of them) is answered: a change that lands between
        two of the client's calls."""
        with self._lock:
            self._afters.append((Fault("after", method, path_contains, 1, skip=skip), action))

    def on_next_patch_applied(self, action: Callable[[], None]) -> None:
        """Run `action` once, right after the next nodes.patch lands (its operation is done):
        another writer's stale read-modify-write landing just after this client's."""
        with self._lock:
            self._patch_hooks.append(action)

    def set_node_metadata(self, node: str, metadata: Mapping[str, str]) -> None:
        """Another client's write of the node's whole metadata map."""
        with self._lock:
            record = self._node(node)
            record.spec = {**record.spec, "metadata": dict(metadata)}

    def html_next(self, code: int = 502, *, method: str | None = None,
                  path_contains: str | None = None, times: int = 1) -> None:
        """The next matching requests get the front end's HTML error page (text/html)."""
        self._queue(Fault("html", method, path_contains, times, ApiFault(code, "", "")))

    def drop_next(self, *, method: str | None = None, path_contains: str | None = None,
                  times: int = 1) -> None:
        """The next matching requests take effect, then see their connection closed without
        an answer (a reset after the server acted: a create that did happen, unknown to its
        caller)."""
        self._queue(Fault("drop", method, path_contains, times))

    def stall_next(self, seconds: float, *, method: str | None = None,
                   path_contains: str | None = None, times: int = 1) -> None:
        """The next matching answers send their status line and headers, then nothing for
        `seconds` (a client's read timeout fires first), then the rest."""
        self._queue(Fault("stall", method, path_contains, times, seconds=seconds))

    def answer_next(self, status: int, body: bytes | str = b"", *,
                    headers: Mapping[str, str] | None = None, method: str | None = None,
                    path_contains: str | None = None, times: int = 1) -> None:
        """The next matching requests get exactly this answer (an empty 200, `null`, `[]`, a
        302 with a Location: what a proxy or a broken front end may send)."""
        data = body.encode() if isinstance(body, str) else body
        self._queue(Fault("raw", method, path_contains, times,
                          raw=(status, data, {"Content-Type": "application/json",
                                              **(headers or {})})))

    def _queue(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def fail_next_create_operation(self, code: int, message: str) -> None:
        """The next create is accepted but its operation ends with this google.rpc error."""
        with self._lock:
            self._create_errors.append({"code": code, "message": message})

    def fail_next_patch_operation(self, code: int, message: str) -> None:
        """The next nodes.patch is accepted but its operation ends with this google.rpc error
        (and changes nothing)."""
        with self._lock:
            self._patch_errors.append({"code": code, "message": message})

    def node_json(self, node: str) -> dict[str, Any]:
        """A node as GET nodes/N answers it on v2 (by full name or id)."""
        with self._lock:
            return self._node(node).json("v2")

    # -- inspection

    def calls(self, method: str | None = None, path_contains: str | None = None,
              ) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests
                    if (method is None or r.method == method)
                    and (path_contains is None or path_contains in r.path)]

    def state_of(self, qr: str) -> str | None:
        with self._lock:
            self._tick()
            try:
                return self._qr(qr).state
            except KeyError:
                return None

    def queued_resource(self, qr: str) -> dict[str, Any] | None:
        with self._lock:
            self._tick()
            try:
                return self._qr(qr).json()
            except KeyError:
                return None

    # -- the state machine

    def _qr(self, key: str) -> _QueuedResource:
        if key in self.queued_resources:
            return self.queued_resources[key]
        hits = [r for n, r in self.queued_resources.items() if n.endswith(f"/{key}")]
        if len(hits) != 1:
            raise KeyError(f"no (unique) queued resource {key!r}")
        return hits[0]

    def _node(self, key: str) -> _Node:
        if key in self.nodes:
            return self.nodes[key]
        hits = [n for name, n in self.nodes.items() if name.endswith(f"/{key}")]
        if len(hits) != 1:
            raise KeyError(f"no (unique) node {key!r}")
        return hits[0]

    def _enter(self, record: _QueuedResource, state: str, at: float | None = None) -> None:
        record.state = state
        record.entered = self.clock() if at is None else at
        if state == "PROVISIONING":
            self._make_nodes(record, "CREATING")
        elif state == "ACTIVE":
            self._make_nodes(record, "READY")
        elif state in ("SUSPENDING", "SUSPENDED", "FAILED", "DELETING"):
            for node in record.node_names:  # run duration over / force delete: node first
                self.nodes.pop(node, None)

    def _make_nodes(self, record: _QueuedResource, state: str) -> None:
        for spec, name in zip(record.body["tpu"]["nodeSpec"], record.node_names, strict=True):
            node = self.nodes.get(name)
            if node is None:
                n = next(self._ids)
                external = spec["node"].get("networkConfig", {}).get("enableExternalIps")
                node = _Node(name, spec["node"], state,
                             f"203.0.113.{n % 250 + 1}" if external else None,
                             f"10.128.0.{n % 250 + 1}", record.name, self.clock(), self.clock())
                self.nodes[name] = node
            node.state = state

    def _step(self, record: _QueuedResource, at: float | None = None) -> None:
        if record.state == "DELETING":
            self.queued_resources.pop(record.name, None)
        elif record.state in CHAIN:
            self._enter(record, CHAIN[record.state], at)

    def _duration(self, record: _QueuedResource) -> float | None:
        assert self.durations is not None
        if record.state == "ACTIVE" and "ACTIVE" not in self.durations:
            return _seconds(record.body["runDuration"]["maxRunDuration"])
        return self.durations.get(record.state)

    def _tick(self) -> None:
        """Time-based mode: move every QR (and deleting node) whose state has lasted long enough."""
        if self.durations is None:
            return
        now = self.clock()
        for record in list(self.queued_resources.values()):
            while record.name in self.queued_resources:
                limit = self._duration(record)
                if limit is None or now - record.entered < limit:
                    break
                self._step(record, record.entered + limit)
        limit = self.durations.get("DELETING")
        if limit is not None:
            for name in [n for n, node in self.nodes.items()
                         if node.state == "DELETING" and now - node.entered >= limit]:
                del self.nodes[name]

    # -- HTTP

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            response = self._handle(request)
            fault = getattr(response, "fault", None)
            self._run_afters(request)
        if fault is not None and fault.kind == "drop":
            # Shut, not closed: werkzeug's own writes then fail as a dropped peer, quietly.
            environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
            start_response("500 INTERNAL SERVER ERROR", [])
            return []
        if fault is not None and fault.kind == "stall":
            start_response(f"{response.status}", list(response.headers.items()))
            data = response.get_data()

            def slow() -> Iterator[bytes]:
                yield data[:1]  # the first byte, then silence (outside the lock)
                self._stopping.wait(fault.seconds)
                yield data[1:]

            return slow()
        return response(environ, start_response)

    def _handle(self, request: Request) -> Response:
        raw = request.get_data(as_text=True)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = ValueError
        auth = request.headers.get("Authorization", "")
        record = Recorded(request.method, request.path, dict(request.args.items()),
                          None if body is ValueError else body, auth.startswith("Bearer "))
        self.requests.append(record)
        doc = _document(request.path)
        refusal: DiscoveryRefusal | None = None
        try:
            call = doc.check_request(request.method, raw_path(request), request.args.to_dict(
                flat=False), None if body is ValueError else body)
        except DiscoveryRefusal as refused:
            refusal = refused
            doc.refusals.append(f"{request.method} {request.full_path}: {refused.message}")
        if body is ValueError:
            refusal = DiscoveryRefusal(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        if refusal is not None and refusal.html_page:  # the front end: before any auth
            return refusal.response()
        try:
            if not auth.startswith("Bearer ") or (
                self._require_exact_token and auth != f"Bearer {self.token}"
            ):
                raise ApiFault(
                    401, "UNAUTHENTICATED",
                    "Request is missing required authentication credential. Expected OAuth 2 "
                    "access token, login cookie or other valid authentication credential.",
                )
            if refusal is not None:
                return refusal.response()
            fault = self._take_fault(request)
            if fault is not None and fault.kind == "error":
                assert fault.error is not None
                raise fault.error
            if fault is not None and fault.kind == "raw":
                assert fault.raw is not None
                status, data, headers = fault.raw
                return Response(data, status, headers=headers)
            if fault is not None and fault.kind == "html":
                assert fault.error is not None
                code = fault.error.code
                page = HTML_ERROR_PAGE.format(code=code, phrase=HTTPStatus(code).phrase)
                return Response(page, code, mimetype="text/html")
            if fault is not None:  # drop or stall: done by _wsgi, outside the lock
                answer = self._answer(request, body, doc, call)
                answer.fault = fault  # type: ignore[attr-defined]
                return answer
            return self._answer(request, body, doc, call)
        except ApiFault as fault:
            return fault.response()

    def _answer(self, request: Request, body: Any, doc: Discovery, call: Call) -> Response:
        try:
            self._tick()
            for method, pattern, handler in ROUTES:
                m = pattern.fullmatch(request.path)
                if m and method == request.method:
                    status, payload = getattr(self, f"_h_{handler}")(m.groupdict(), request, body)
                    answer = Response(json.dumps(payload), status, mimetype="application/json")
                    return check_answer(doc, call, answer)
            raise ApiFault(404, "NOT_FOUND",
                           f"Method not found: {request.method} {request.path} (documented "
                           f"as {call.method_id}, not served by this fake)")
        except ApiFault as fault:
            return fault.response()

    def _run_afters(self, request: Request) -> None:
        for entry in list(self._afters):
            match, action = entry
            if match.matches(request):
                if match.skip > 0:
                    match.skip -= 1
                    continue
                self._afters.remove(entry)
                action()

    def _take_fault(self, request: Request) -> Fault | None:
        for fault in self._faults:
            if fault.matches(request):
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _operation(self, project: str, zone: str, verb: str, target: str, api_version: str,
                   done: Callable[[], bool], response: Callable[[], dict[str, Any]],
                   error: dict[str, Any] | None = None) -> dict[str, Any]:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}"
        op = _Operation(name, verb, target, api_version, self.clock(), done, response, error)
        self.operations[name] = op
        return op.json()

    # -- handlers: (groups, request, body) -> (status, payload)

    def _h_create_qr(self, g: dict[str, str], request: Request, body: Any,
                     ) -> tuple[int, dict[str, Any]]:
        qr_id = request.args.get("queuedResourceId", "")
        if not _ID_RE.fullmatch(qr_id):
            raise _invalid(
                f"queuedResourceId {qr_id!r} is required and must match "
                "[a-z]([-a-z0-9]*[a-z0-9])?"
            )
        if not isinstance(body, dict):
            raise _invalid("Invalid JSON payload received: a QueuedResource object is required.")
        self._check_flex(body, g)
        name = self.qr_name(g["project"], g["zone"], qr_id)
        if name in self.queued_resources:
            raise ApiFault(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        clean = {k: v for k, v in body.items() if k not in QR_OUTPUT_ONLY}
        if self._create_errors:
            error = self._create_errors.pop(0)
            return 200, self._operation(g["project"], g["zone"], "create", name, "v2alpha1",
                                        lambda: True, dict, error)
        now = self.clock()
        self.queued_resources[name] = _QueuedResource(name, clean, "CREATING", now, now)

        def done() -> bool:
            qr = self.queued_resources.get(name)
            return qr is None or qr.state != "CREATING"

        def response() -> dict[str, Any]:
            qr = self.queued_resources.get(name)
            typ = {"@type": "type.googleapis.com/google.cloud.tpu.v2alpha1.QueuedResource"}
            return {**typ, **(qr.json() if qr else {"name": name})}

        return 200, self._operation(g["project"], g["zone"], "create", name, "v2alpha1", done,
                                    response)

    @staticmethod
    def _check_flex(body: dict[str, Any], g: dict[str, str]) -> None:
        """Required fields of a flex-start create, as this project sends it."""
        specs = body.get("tpu", {}).get("nodeSpec")
        if not specs:
            raise _invalid("Invalid argument: tpu.nodeSpec is required.")
        if body.get("provisioningModel") != "FLEX_START":
            raise _invalid("Invalid argument: provisioningModel must be FLEX_START "
                           "(fake policy: this project only creates flex-start QRs).")
        max_run = body.get("runDuration", {}).get("maxRunDuration")
        if not max_run:
            raise _invalid("Invalid argument: runDuration.maxRunDuration is required for the "
                           "FLEX_START provisioning model.")
        if not 0 < _seconds(max_run) <= MAX_FLEX_RUN_S:
            raise _invalid(f"Invalid argument: runDuration.maxRunDuration {max_run} must be "
                           "more than 0 and at most 7 days.")
        parent = f"projects/{g['project']}/locations/{g['zone']}"
        for i, spec in enumerate(specs):
            if spec.get("parent") != parent:
                raise _invalid(f"Invalid argument: tpu.nodeSpec[{i}].parent must be {parent}.")
            if not _ID_RE.fullmatch(str(spec.get("nodeId", ""))):
                raise _invalid(f"Invalid argument: tpu.nodeSpec[{i}].nodeId is required.")
            node = spec.get("node")
            if not isinstance(node, dict):
                raise _invalid(f"Invalid argument: tpu.nodeSpec[{i}].node is required.")
            if not (node.get("acceleratorType") or node.get("acceleratorConfig")):
                raise _invalid(f"Invalid argument: tpu.nodeSpec[{i}].node.acceleratorType is "
                               "required.")
            if not node.get("runtimeVersion"):
                raise _invalid(f"Invalid argument: tpu.nodeSpec[{i}].node.runtimeVersion is "
                               "required.")
            if node.get("networkConfig", {}).get("enableExternalIps") is not True:
                raise _invalid(
                    f"Invalid argument: tpu.nodeSpec[{i}].node.networkConfig.enableExternalIps "
                    "must be true (fake policy: without it the node gets no external IP)."
                )

    def _h_list_qrs(self, g: dict[str, str], request: Request, body: Any,
                    ) -> tuple[int, dict[str, Any]]:
        parent = f"projects/{g['project']}/locations/{g['zone']}/"
        if g["zone"] in self.unreachable:
            return 200, {"unreachable": [g["zone"]]}
        items = [r.json() for n, r in sorted(self.queued_resources.items())
                 if n.startswith(parent)]
        return 200, _page(items, "queuedResources", request)

    def _h_get_qr(self, g: dict[str, str], request: Request, body: Any,
                  ) -> tuple[int, dict[str, Any]]:
        return 200, self._existing_qr(g).json()

    def _existing_qr(self, g: dict[str, str]) -> _QueuedResource:
        name = self.qr_name(g["project"], g["zone"], g["id"])
        if name not in self.queued_resources:
            raise ApiFault(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return self.queued_resources[name]

    def _h_delete_qr(self, g: dict[str, str], request: Request, body: Any,
                     ) -> tuple[int, dict[str, Any]]:
        force = request.args.get("force", "false")  # a boolean: the document checked it
        record = self._existing_qr(g)
        if record.state == "PROVISIONING":
            code, status = self.provisioning_delete_refusal
            raise ApiFault(code, status,
                           f"Cannot delete queued resource '{record.name}' in state "
                           "PROVISIONING; retry once provisioning finishes.")
        if force != "true" and any(n in self.nodes for n in record.node_names):
            raise ApiFault(400, "FAILED_PRECONDITION",
                           f"Queued resource '{record.name}' still has nodes; delete them "
                           "first or pass force=true.")
        if record.state != "DELETING":
            self._enter(record, "DELETING")
        name = record.name
        return 200, self._operation(
            g["project"], g["zone"], "delete", name, "v2alpha1",
            lambda: name not in self.queued_resources,
            lambda: {"@type": "type.googleapis.com/google.protobuf.Empty"},
        )

    def _h_get_operation(self, g: dict[str, str], request: Request, body: Any,
                         ) -> tuple[int, dict[str, Any]]:
        name = f"projects/{g['project']}/locations/{g['zone']}/operations/{g['op']}"
        if name not in self.operations:
            raise ApiFault(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return 200, self.operations[name].json()

    def _existing_node(self, g: dict[str, str]) -> _Node:
        name = f"projects/{g['project']}/locations/{g['zone']}/nodes/{g['id']}"
        if name not in self.nodes:
            raise ApiFault(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return self.nodes[name]

    def _h_list_nodes(self, g: dict[str, str], request: Request, body: Any,
                      ) -> tuple[int, dict[str, Any]]:
        parent = f"projects/{g['project']}/locations/{g['zone']}/"
        if g["zone"] in self.unreachable:
            return 200, {"unreachable": [g["zone"]]}
        items = [n.json(g["v"]) for name, n in sorted(self.nodes.items())
                 if name.startswith(parent)]
        return 200, _page(items, "nodes", request)

    def _h_get_node(self, g: dict[str, str], request: Request, body: Any,
                    ) -> tuple[int, dict[str, Any]]:
        return 200, self._existing_node(g).json(g["v"])

    def _h_delete_node(self, g: dict[str, str], request: Request, body: Any,
                       ) -> tuple[int, dict[str, Any]]:
        node = self._existing_node(g)
        node.state, node.entered = "DELETING", self.clock()
        name = node.name
        return 200, self._operation(
            g["project"], g["zone"], "delete", name, g["v"], lambda: name not in self.nodes,
            lambda: {"@type": "type.googleapis.com/google.protobuf.Empty"},
        )

    def _h_patch_node(self, g: dict[str, str], request: Request, body: Any,
                      ) -> tuple[int, dict[str, Any]]:
        """nodes.patch: updateMask names what changes (a field in the mask but not in the body
        is cleared); the answer is an Operation, and the change lands when it is done."""
        mask = [p.strip() for p in request.args.get("updateMask", "").split(",") if p.strip()]
        if not mask:
            raise _invalid("Invalid argument: update_mask is required; supported fields: "
                           f"{', '.join(sorted(NODE_PATCHABLE))}.")
        for path in mask:
            if path not in NODE_PATCHABLE:
                known = path.split(".")[0] in _node_fields(g["v"])
                raise _invalid(
                    f"Invalid argument: update_mask field '{path}' "
                    + ("cannot be updated" if known else "is not a field of Node")
                    + f"; supported fields: {', '.join(sorted(NODE_PATCHABLE))}."
                )
        if not isinstance(body, dict):
            raise _invalid("Invalid JSON payload received: a Node object is required.")
        name = f"projects/{g['project']}/locations/{g['zone']}/nodes/{g['id']}"
        if "name" in body and body["name"] != name:
            raise _invalid(f"Invalid argument: node.name {body['name']!r} does not match the "
                           f"URL's {name!r}.")
        node = self._existing_node(g)
        if node.state == "DELETING":
            raise ApiFault(400, "FAILED_PRECONDITION",
                           f"Node '{name}' is being deleted and cannot be updated.")
        if self._patch_errors:
            error = self._patch_errors.pop(0)
            return 200, self._operation(g["project"], g["zone"], "update", name, g["v"],
                                        lambda: True, dict, error)
        fields = [NODE_PATCHABLE[p] for p in mask]
        reads = [self.patch_reads_until_done]
        applied: list[bool] = []

        def done() -> bool:
            if not applied:
                if reads[0] > 0:
                    reads[0] -= 1
                    return False
                if name in self.nodes:
                    self._apply_patch(self.nodes[name], body, fields)
                    if self._patch_hooks:
                        self._patch_hooks.pop(0)()
                applied.append(True)
            return True

        def response() -> dict[str, Any]:
            typ = {"@type": f"type.googleapis.com/google.cloud.tpu.{g['v']}.Node"}
            live = self.nodes.get(name)
            return {**typ, **(live.json(g["v"]) if live else {"name": name})}

        # The answer itself counts as the first read of the operation.
        return 200, self._operation(g["project"], g["zone"], "update", name, g["v"], done,
                                    response)

    @staticmethod
    def _apply_patch(node: _Node, body: dict[str, Any], fields: list[tuple[str, ...]]) -> None:
        # A fresh spec: the node's spec may be its queued resource's body (which keeps what it
        # was created with; only the node changes).
        spec = json.loads(json.dumps(node.spec))
        for path in fields:
            src: Any = body
            for key in path[:-1]:
                src = src.get(key, {}) if isinstance(src, dict) else {}
            dst = spec
            for key in path[:-1]:
                dst = dst.setdefault(key, {})
            if isinstance(src, dict) and path[-1] in src:
                dst[path[-1]] = json.loads(json.dumps(src[path[-1]]))
            else:
                dst.pop(path[-1], None)  # in the mask, not in the body: cleared
        node.spec = spec

    def _h_guest_attributes(self, g: dict[str, str], request: Request, body: Any,
                            ) -> tuple[int, dict[str, Any]]:
        node = self._existing_node(g)
        query = (body or {}).get("queryPath", "")
        items = []
        for (namespace, key), value in sorted(node.guest_attributes.items()):
            full = f"{namespace}/{key}"
            if not query or full == query or (query.endswith("/") and full.startswith(query)):
                items.append({"namespace": namespace, "key": key, "value": value})
        value = {"items": items} if items else {}
        return 200, {"guestAttributes": [{"queryPath": query, "queryValue": value}]}


def _page(items: list[dict[str, Any]], key: str, request: Request) -> dict[str, Any]:
    try:
        start = int(request.args.get("pageToken") or 0)
        size = int(request.args.get("pageSize") or 100)
    except ValueError:
        raise _invalid("Invalid pageToken or pageSize.") from None
    page = items[start:start + size]
    out: dict[str, Any] = {key: page} if page else {}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return out


# ---------------------------------------------------------------- locations.list
# Kept apart from the routes above: GET /{v2,v2alpha1}/projects/P/locations answers
# {"locations": [{"name": "projects/P/locations/ZONE", "locationId": "ZONE"}],
#  "nextPageToken"} (the ListLocationsResponse of the REST reference), paged with
# pageSize/pageToken. The zones are TPU_LOCATIONS (or `api.locations`, when a test sets it)
# plus every zone a node or queued resource was seeded in.

TPU_LOCATIONS = (
    "asia-east1-c", "asia-northeast1-b", "europe-west4-a", "europe-west4-b", "us-central1-a",
    "us-central1-b", "us-central2-b", "us-east1-c", "us-east1-d", "us-east5-a", "us-east5-b",
    "us-south1-a", "us-west1-c", "us-west4-a", "us-west4-b",
)


def _h_list_locations(self: FakeTpuApi, g: dict[str, str], request: Request, body: Any,
                      ) -> tuple[int, dict[str, Any]]:
    if request.args.get("filter"):
        raise _invalid("fake: locations.list's filter is not supported (refused, not ignored)")
    zones = set(getattr(self, "locations", TPU_LOCATIONS))
    for name in [*self.nodes, *self.queued_resources]:
        if name.startswith(f"projects/{g['project']}/locations/"):
            zones.add(name.split("/")[3])
    items = [{"name": f"projects/{g['project']}/locations/{zone}", "locationId": zone}
             for zone in sorted(zones)]
    return 200, _page(items, "locations", request)


FakeTpuApi._h_list_locations = _h_list_locations  # type: ignore[attr-defined]
ROUTES.append(("GET", re.compile(rf"/{_V}/projects/(?P<project>[^/]+)/locations"),
               "list_locations"))
