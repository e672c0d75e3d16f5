"""A fake Compute Engine API (v1 REST) on 127.0.0.1: `regions.get` only.

  GET /compute/v1/projects/PROJECT/regions/REGION
answers the Region resource (compute.v1 discovery: {"kind": "compute#region", "id", "name",
"status", "zones", "quotas": [{"metric", "limit", "usage"}], "selfLink", ...}) with
`Authorization: Bearer <token>`; `quotas` holds what the test set (`set_quota`), and
`quota_warning` makes it answer `quotaStatusWarning` instead, as Compute does when it could not
fetch the quotas. Errors the way Compute answers them ({"error": {"code", "message",
"errors": [{"message", "domain", "reason"}], "status", "details"}}): 401; 403 for another
project or when "compute.regions.get" is in `denied`; 403 SERVICE_DISABLED (with ErrorInfo)
when `disabled`; 404 notFound for a region it does not know; 400 for a query parameter the
method does not take. Point code at it with `CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=<endpoint>`.
Requests and answers go through tests/fakes/discovery.guarded (compute.v1's document); a raw
answer a test injects (`answer_next`) is marked deliberate and passes as it is.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

from werkzeug import Request, Response

from .discovery import Discovery, deliberate, guarded
from .metadata import FaultQueue, LoopbackServer

_GET = re.compile(r"/compute/v1/projects/([^/]+)/regions/([^/]+)")
# The system parameters every Google API takes (discovery "parameters"); regions.get none else.
STANDARD_PARAMS = frozenset({"$.xgafv", "access_token", "alt", "callback", "fields", "key",
                             "oauth_token", "prettyPrint", "quotaUser", "upload_protocol",
                             "uploadType", "userIp"})
REGIONS = {"us-west4": ("us-west4-a", "us-west4-b", "us-west4-c"),
           "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
           "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c")}


@dataclass(frozen=True)
class ComputeCall:
    method: str
    path: str
    status: int


class FakeCompute:
    """One project's regions and their quotas."""

    def __init__(self, *, project: str, access_token: str) -> None:
        self.project = project
        self.access_token = access_token
        self.quotas: dict[str, dict[str, tuple[float, float]]] = {}  # region -> metric -> (l, u)
        self.quota_warning: str | None = None  # e.g. "QUOTA_INFO_UNAVAILABLE"
        self.denied: set[str] = set()
        self.disabled = False
        self.calls: list[ComputeCall] = []
        self.faults = FaultQueue()
        self._lock = threading.Lock()
        # Every request and answer checked against compute.v1's discovery document.
        self.server = LoopbackServer(guarded(Discovery.load("compute", "v1"), self._handle))

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE (gcloud's carries the path)."""
        return f"http://127.0.0.1:{self.server.port}/compute/v1/"

    def start(self) -> FakeCompute:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def set_quota(self, region: str, metric: str, limit: float, usage: float = 0.0) -> None:
        with self._lock:
            self.quotas.setdefault(region, {})[metric] = (limit, usage)

    def answer_next(self, body: object, status: int = 200, *, times: int = 1) -> None:
        """The next answers are exactly this JSON (a hostile or empty one), unchecked."""
        self.faults.add(lambda r: True, lambda: deliberate(Response(
            json.dumps(body), status, mimetype="application/json")), times)

    def _handle(self, request: Request) -> Response:
        response = self.faults.take(request)
        if response is None:
            response = self._answer(request)
        with self._lock:
            self.calls.append(ComputeCall(request.method, request.path, response.status_code))
        return response

    def _answer(self, request: Request) -> Response:
        m = _GET.fullmatch(request.path)
        if m is None or request.method != "GET":
            return error(404, "NOT_FOUND", "The requested URL was not found on this server.",
                         "notFound")
        unknown = sorted(set(request.args) - STANDARD_PARAMS)
        if unknown:
            return error(400, "INVALID_ARGUMENT",
                         f"Invalid JSON payload received. Unknown name \"{unknown[0]}\": "
                         "Cannot bind query parameter.", "badRequest")
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request is missing required authentication "
                         "credential. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.", "required", domain="global")
        project, region = m[1], m[2]
        if self.disabled:
            return service_disabled(project, "compute.googleapis.com",
                                    "Compute Engine API")
        if project != self.project or "compute.regions.get" in self.denied:
            return error(403, "PERMISSION_DENIED", "Required 'compute.regions.get' permission "
                         f"for 'projects/{project}/regions/{region}'", "forbidden")
        if region not in REGIONS:
            return error(404, "NOT_FOUND", f"The resource 'projects/{project}/regions/{region}'"
                         " was not found", "notFound")
        base = f"https://www.googleapis.com/compute/v1/projects/{project}"
        body: dict[str, object] = {
            "kind": "compute#region", "id": str(1000 + sum(map(ord, region))),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "name": region,
            "description": region, "status": "UP",
            "zones": [f"{base}/zones/{z}" for z in REGIONS[region]],
            "selfLink": f"{base}/regions/{region}", "supportsPzs": False,
        }
        with self._lock:
            rows = dict(self.quotas.get(region, {}))
            warning = self.quota_warning
        if warning:
            body["quotaStatusWarning"] = {
                "code": warning, "message": "Quota information is temporarily unavailable.",
                "data": [{"key": "region", "value": region}]}
        else:
            body["quotas"] = [{"metric": k, "limit": lim, "usage": use}
                              for k, (lim, use) in rows.items()]
        return Response(json.dumps(body), 200, mimetype="application/json")


def error(code: int, status: str, message: str, reason: str, *, domain: str = "global",
          details: list[dict[str, object]] | None = None) -> Response:
    """Compute's error body: the legacy `errors` list beside google.rpc.Status's fields."""
    body: dict[str, object] = {
        "code": code, "message": message, "status": status,
        "errors": [{"message": message, "domain": domain, "reason": reason}]}
    if details:
        body["details"] = details
    return Response(json.dumps({"error": body}), code, mimetype="application/json")


def service_disabled(project: str, service: str, title: str) -> Response:
    """403 with ErrorInfo SERVICE_DISABLED, as any Google API answers when not enabled."""
    message = (f"{title} has not been used in project {project} before or it is disabled. "
               f"Enable it by visiting https://console.developers.google.com/apis/api/{service}"
               f"/overview?project={project} then retry.")
    return error(403, "PERMISSION_DENIED", message, "accessNotConfigured",
                 domain="usageLimits", details=[{
                     "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                     "reason": "SERVICE_DISABLED", "domain": "googleapis.com",
                     "metadata": {"service": service, "consumer": f"projects/{project}",
                                  "serviceTitle": title}}])
