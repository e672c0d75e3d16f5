"""A fake Service Usage API (v1 REST) on 127.0.0.1: `services.batchGet` and `services.get`.

  GET /v1/projects/PROJECT/services:batchGet?names=projects/PROJECT/services/NAME&names=...
  GET /v1/projects/PROJECT/services/NAME
answer BatchGetServicesResponse {"services": [Service]} and Service {"name", "parent",
"config": {"name", "title"}, "state"} (serviceusage.v1 discovery; the names come back with the
project NUMBER, as the real API answers them): state ENABLED for a service in `enabled`,
DISABLED for another service it knows (KNOWN). Errors as the real API answers them, google.rpc.
Status with details: 401; 403 for another project or when "serviceusage.services.get" is in
`denied`; 400 for more than 30 names, a name outside the parent, no names, or a query parameter
the method does not take; 403 "Not found or permission denied" for a service it does not know.
Point code at it with `CLOUDSDK_API_ENDPOINT_OVERRIDES_SERVICEUSAGE=<endpoint>`. Requests and
answers go through tests/fakes/discovery.guarded (serviceusage.v1's document); a raw answer a
test injects (`answer_next`) is marked deliberate and passes as it is.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

from werkzeug import Request, Response

from .compute import STANDARD_PARAMS
from .discovery import Discovery, deliberate, guarded
from .metadata import FaultQueue, LoopbackServer

_BATCH = re.compile(r"/v1/projects/([^/]+)/services:batchGet")
_GET = re.compile(r"/v1/projects/([^/]+)/services/([^/:]+)")
MAX_NAMES = 30  # services.batchGet: "a maximum of 30 services at a time"
KNOWN = {
    "container.googleapis.com": "Kubernetes Engine API",
    "compute.googleapis.com": "Compute Engine API",
    "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
    "networkservices.googleapis.com": "Network Services API",
    "monitoring.googleapis.com": "Cloud Monitoring API",
    "logging.googleapis.com": "Cloud Logging API",
    "certificatemanager.googleapis.com": "Certificate Manager API",
    "tpu.googleapis.com": "Cloud TPU API",
    "serviceusage.googleapis.com": "Service Usage API",
}


@dataclass(frozen=True)
class UsageCall:
    method: str
    path: str
    names: tuple[str, ...]
    status: int


class FakeServiceUsage:
    """One project's enabled services."""

    def __init__(self, *, project: str, number: str, access_token: str) -> None:
        self.project = project
        self.number = number
        self.access_token = access_token
        self.enabled: set[str] = set()
        self.denied: set[str] = set()
        self.calls: list[UsageCall] = []
        self.faults = FaultQueue()
        self._lock = threading.Lock()
        # Every request and answer checked against serviceusage.v1's discovery document.
        self.server = LoopbackServer(guarded(Discovery.load("serviceusage", "v1"), self._handle))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/"

    def start(self) -> FakeServiceUsage:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def enable(self, *names: str) -> None:
        with self._lock:
            self.enabled.update(names)

    def answer_next(self, body: object, status: int = 200, *, times: int = 1) -> None:
        """The next answers are exactly this JSON (a hostile or empty one), unchecked."""
        self.faults.add(lambda r: True, lambda: deliberate(Response(
            json.dumps(body), status, mimetype="application/json")), times)

    def _handle(self, request: Request) -> Response:
        response = self.faults.take(request)
        if response is None:
            response = self._answer(request)
        with self._lock:
            self.calls.append(UsageCall(request.method, request.path,
                                        tuple(request.args.getlist("names")),
                                        response.status_code))
        return response

    def _service(self, name: str) -> dict[str, object]:
        with self._lock:
            state = "ENABLED" if name in self.enabled else "DISABLED"
        parent = f"projects/{self.number}"
        return {"name": f"{parent}/services/{name}", "parent": parent,
                "config": {"name": name, "title": KNOWN[name]}, "state": state}

    def _answer(self, request: Request) -> Response:
        batch, get = _BATCH.fullmatch(request.path), _GET.fullmatch(request.path)
        if request.method != "GET" or not (batch or get):
            return error(404, "NOT_FOUND", "The requested URL was not found on this server.")
        allowed = STANDARD_PARAMS | ({"names"} if batch else set())
        unknown = sorted(set(request.args) - allowed)
        if unknown:
            return error(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. Unknown "
                         f"name \"{unknown[0]}\": Cannot bind query parameter.")
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                         "credentials. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.")
        project = (batch or get)[1]  # type: ignore[index]
        if project not in (self.project, self.number) or \
                "serviceusage.services.get" in self.denied:
            return error(403, "PERMISSION_DENIED", "Permission denied to get service",
                         reason="AUTH_PERMISSION_DENIED",
                         metadata={"permission": "serviceusage.services.get"})
        if get:
            names = [get[2]]
        else:
            full = request.args.getlist("names")
            if not full:
                return error(400, "INVALID_ARGUMENT", "names must be specified")
            if len(full) > MAX_NAMES:
                return error(400, "INVALID_ARGUMENT",
                             f"A maximum of {MAX_NAMES} services can be requested at a time.")
            prefix = f"projects/{project}/services/"
            outside = [n for n in full if not n.startswith(prefix) or "/" in n[len(prefix):]]
            if outside:
                return error(400, "INVALID_ARGUMENT", f"Invalid service name {outside[0]!r}: "
                             "must be in the parent.")
            names = [n[len(prefix):] for n in full]
        strange = [n for n in names if n not in KNOWN]
        if strange:
            return error(403, "PERMISSION_DENIED", "Not found or permission denied for "
                         f"service(s): {', '.join(strange)}.",
                         reason="SERVICE_CONFIG_NOT_FOUND_OR_PERMISSION_DENIED")
        if get:
            return Response(json.dumps(self._service(names[0])), 200,
                            mimetype="application/json")
        body = {"services": [self._service(n) for n in names]}
        return Response(json.dumps(body), 200, mimetype="application/json")


def error(code: int, status: str, message: str, *, reason: str | None = None,
          metadata: dict[str, str] | None = None) -> Response:
    body: dict[str, object] = {"code": code, "message": message, "status": status}
    if reason:
        body["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": reason, "domain": "serviceusage.googleapis.com",
                            "metadata": metadata or {}}]
    return Response(json.dumps({"error": body}), code, mimetype="application/json")
