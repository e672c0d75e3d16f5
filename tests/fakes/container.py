"""A fake Kubernetes Engine API (Container API v1 REST) on 127.0.0.1: clusters.list and
getServerConfig, the two read methods this project's checks call.

  GET /v1/projects/PROJECT/locations/LOCATION/clusters        (projects.locations.clusters.list)
LOCATION is a zone, a region or "-" ("matches all zones and all regions", container.v1's
discovery document). Answers the ListClustersResponse {"clusters": [Cluster], "missingZones":
[zone]} (each field left out when empty, as proto3 JSON does); a Cluster carries `name`,
`location`, `zone`, `status`, `selfLink`, `id`, `createTime`, `currentMasterVersion`,
`currentNodeVersion` and its labels as `resourceLabels`. A zone in `missing_zones` is left out
of every answer that covers it and named in its `missingZones` (a regional cluster of that
zone's region is left out too: its control plane may be there). A zone or region location
matches the clusters whose `location` is exactly it (this fake's reading; the document does
not say whether a region also lists its zones' clusters: this project lists with "-").
  GET /v1/projects/PROJECT/locations/LOCATION/serverConfig    (projects.locations.getServerConfig)
answers the ServerConfig {"defaultClusterVersion", "validMasterVersions", "validNodeVersions",
"defaultImageType", "validImageTypes", "channels": [{"channel", "defaultVersion",
"validVersions", "upgradeTargetVersion"}]} from `channels` (versions: illustrative, not
measured; a test sets what it needs).

Every request is checked against container.v1's discovery document (tests/fakes/discovery.py:
method, path, query parameters; an unknown one is a 400 INVALID_ARGUMENT "Cannot bind query
parameter"; an unknown path the front end's HTML 404), and so is every answer but the faults a
test queues. Every request needs `Authorization: Bearer <token>` (401
otherwise). Errors are google.rpc.Status JSON ({"error": {"code", "message", "status",
"details"}}): 403 PERMISSION_DENIED with an ErrorInfo for another project or a permission in
`denied`; `disabled = True`: 403 SERVICE_DISABLED ("Kubernetes Engine API has not been used in
project N before or it is disabled", ErrorInfo reason SERVICE_DISABLED, domain googleapis.com,
metadata consumer "projects/N" with N `consumer_number`, the project's number unless a test
sets another: a quota project's). Faults (`fail_next`, `html_next`, `drop_next`, `answer_next`
for any raw status/body/headers: an empty 200, `null`, a redirect) answer the next matching
requests instead. Point code at it with `CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER=<endpoint>`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from werkzeug import Request, Response

from .discovery import Discovery, guarded
from .metadata import FaultQueue, LoopbackServer

PROJECT_NUMBER = "123456789012"
SERVICE = "container.googleapis.com"
_LIST = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/clusters")
_CONFIG = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/serverConfig")
_ZONE_RE = re.compile(r"([a-z]+(?:-[a-z]+)*\d+)-[a-z]")
_REGION_RE = re.compile(r"[a-z]+(?:-[a-z]+)*\d+")
STATUSES = frozenset({"STATUS_UNSPECIFIED", "PROVISIONING", "RUNNING", "RECONCILING",
                      "STOPPING", "ERROR", "DEGRADED"})
CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
# Illustrative versions (not measured): tests that need a floor set `channels` themselves.
DEFAULT_CHANNELS: dict[str, list[str]] = {
    "RAPID": ["1.35.0-gke.1100000", "1.34.2-gke.1200000"],
    "REGULAR": ["1.34.2-gke.1200000", "1.33.5-gke.1300000"],
    "STABLE": ["1.33.5-gke.1300000", "1.32.9-gke.1400000"],
    "EXTENDED": ["1.33.5-gke.1300000", "1.32.9-gke.1400000", "1.31.13-gke.1500000"],
}


@dataclass(frozen=True)
class ContainerCall:
    method: str
    path: str
    query: dict[str, str]
    status: int
    authorized: bool  # a bearer token was present (the token itself is never stored)


@dataclass
class Cluster:
    name: str
    location: str  # a zone (zonal cluster) or a region (regional cluster)
    labels: dict[str, str] = field(default_factory=dict)
    status: str = "RUNNING"
    version: str = "1.34.2-gke.1200000"
    id: str = ""

    def region(self) -> str:
        m = _ZONE_RE.fullmatch(self.location)
        return m.group(1) if m else self.location

    def json(self, project: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "location": self.location, "zone": self.location,
            "status": self.status, "id": self.id,
            "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/"
                        f"{self.location}/clusters/{self.name}",
            "createTime": "2026-11-30T12:00:00+00:00",
            "currentMasterVersion": self.version, "currentNodeVersion": self.version,
        }
        if self.labels:
            out["resourceLabels"] = dict(self.labels)
            digest = hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode())
            out["labelFingerprint"] = digest.hexdigest()[:16]
        return out


class FakeContainer:
    """The clusters of one project (`clusters`, keyed by (location, name)) and its server
    config (`channels`: channel -> valid versions, newest first; the first is the default)."""

    def __init__(self, *, project: str, access_token: str,
                 project_number: str = PROJECT_NUMBER) -> None:
        self.project = project
        self.project_number = project_number
        self.access_token = access_token
        self.clusters: dict[tuple[str, str], Cluster] = {}
        self.missing_zones: set[str] = set()
        self.channels: dict[str, list[str]] = {k: list(v) for k, v in DEFAULT_CHANNELS.items()}
        # permissions the caller lacks: "container.clusters.list", "...getServerConfig"
        self.denied: set[str] = set()
        self.disabled = False
        self.consumer_number = project_number  # SERVICE_DISABLED's consumer: a quota project?
        self.calls: list[ContainerCall] = []
        self.faults = FaultQueue()
        self._lock = threading.Lock()
        self._ids = 0
        self.server = LoopbackServer(self._handle)
        # Requests and answers checked against container.v1's discovery document; the faults
        # a test queues (taken before it) are answered as they are.
        self._answer: Callable[[Request], Response] = guarded(Discovery.load("container", "v1"),
                                                              self._route)

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER."""
        return f"http://127.0.0.1:{self.server.port}/"

    def start(self) -> FakeContainer:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> FakeContainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- seeding and steering (test side)

    def add_cluster(self, location: str, name: str, *, labels: Mapping[str, str] | None = None,
                    status: str = "RUNNING") -> Cluster:
        if status not in STATUSES:
            raise ValueError(f"unknown cluster status {status!r}")
        with self._lock:
            self._ids += 1
            cluster = Cluster(name, location, dict(labels or {}), status,
                              id=f"{self._ids:032x}")
            self.clusters[(location, name)] = cluster
        return cluster

    def remove_cluster(self, location: str, name: str) -> None:
        with self._lock:
            del self.clusters[(location, name)]

    def fail_next(self, code: int, status: str, message: str, *,
                  details: list[dict[str, Any]] | None = None, path_contains: str = "",
                  times: int = 1) -> None:
        """The next `times` requests (whose path contains `path_contains`) get this error."""
        self.faults.add(lambda r: path_contains in r.path,
                        lambda: error(code, status, message, details), times)

    def answer_next(self, status: int, body: bytes | str = b"", *,
                    headers: Mapping[str, str] | None = None,
                    content_type: str = "application/json; charset=UTF-8",
                    path_contains: str = "", times: int = 1) -> None:
        """The next requests get exactly this answer (hostile ones: an empty 200, `null`,
        `[]`, a 302 with a Location)."""
        def answer() -> Response:
            return Response(body, status, headers=dict(headers or {}), content_type=content_type)
        self.faults.add(lambda r: path_contains in r.path, answer, times)

    def html_next(self, code: int = 502, *, times: int = 1) -> None:
        self.faults.html(lambda r: True, code, times)

    def drop_next(self, *, times: int = 1) -> None:
        self.faults.drop(lambda r: True, times)

    def calls_of(self, kind: str) -> list[ContainerCall]:
        """"clusters" or "serverConfig" calls."""
        with self._lock:
            return [c for c in self.calls if c.path.endswith(f"/{kind}")]

    # -- HTTP

    def _handle(self, request: Request) -> Response:
        response = self._first(request)
        with self._lock:
            self.calls.append(ContainerCall(
                request.method, request.path, dict(request.args.items()), response.status_code,
                request.headers.get("Authorization", "").startswith("Bearer ")))
        return response

    def _first(self, request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                         "credentials. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.",
                         [error_info("ACCESS_TOKEN_TYPE_UNSUPPORTED", {"service": SERVICE})])
        faulted = self.faults.take(request)
        if faulted is not None:
            return faulted
        return self._answer(request)

    def _route(self, request: Request) -> Response:
        for pattern, method, permission, handler in (
            (_LIST, "GET", "container.clusters.list", self._list),
            (_CONFIG, "GET", "container.clusters.getServerConfig", self._server_config),
        ):
            m = pattern.fullmatch(request.path)
            if not m:
                continue
            if request.method != method:  # another method of the document (a create)
                return error(501, "UNIMPLEMENTED", f"fake: {request.method} {request.path} is "
                             "a method this fake does not serve")
            project, location = m.group(1), m.group(2)
            if self.disabled:
                return service_disabled(self.consumer_number)
            if project not in (self.project, self.project_number) or permission in self.denied:
                return error(403, "PERMISSION_DENIED", f'Required "{permission}" permission(s) '
                             f'for "projects/{project}".',
                             [error_info("IAM_PERMISSION_DENIED",
                                         {"permission": permission,
                                          "resource": f"projects/{project}"})])
            return handler(location)
        return error(404, "NOT_FOUND", f"Method not found: {request.method} {request.path}")

    def _list(self, location: str) -> Response:
        if location != "-" and not (_ZONE_RE.fullmatch(location)
                                    or _REGION_RE.fullmatch(location)):
            return error(400, "INVALID_ARGUMENT", f"Location \"{location}\" is not a valid "
                         "zone or region.")
        with self._lock:
            clusters = sorted(self.clusters.values(), key=lambda c: (c.location, c.name))
            missing_all = set(self.missing_zones)
        covered = [z for z in sorted(missing_all) if self._covers(location, z)]
        listed = []
        for c in clusters:
            if location != "-" and c.location != location:
                continue
            if c.location in missing_all or any(
                    c.location == z.rsplit("-", 1)[0] for z in missing_all):
                continue  # its zone (or a zone of its region) did not answer
            listed.append(c.json(self.project))
        body: dict[str, Any] = {}
        if listed:
            body["clusters"] = listed
        if covered:
            body["missingZones"] = covered
        return _json(body)

    @staticmethod
    def _covers(location: str, zone: str) -> bool:
        return location in ("-", zone) or zone.rsplit("-", 1)[0] == location

    def _server_config(self, location: str) -> Response:
        if not (_ZONE_RE.fullmatch(location) or _REGION_RE.fullmatch(location)):
            return error(400, "INVALID_ARGUMENT", f"Location \"{location}\" is not a valid "
                         "zone or region.")
        with self._lock:
            channels = {k: list(v) for k, v in self.channels.items()}
        every = sorted({v for vs in channels.values() for v in vs}, key=_version_key,
                       reverse=True)
        default = (channels.get("REGULAR") or every or [""])[0]
        body: dict[str, Any] = {
            "defaultClusterVersion": default,
            "validNodeVersions": every,
            "defaultImageType": "COS_CONTAINERD",
            "validImageTypes": ["COS_CONTAINERD", "UBUNTU_CONTAINERD"],
            "validMasterVersions": every,
            "channels": [
                {"channel": name, "defaultVersion": versions[0], "validVersions": versions,
                 "upgradeTargetVersion": versions[0]}
                for name, versions in channels.items() if versions
            ],
        }
        return _json(body)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def _json(body: Any) -> Response:
    return Response(json.dumps(body), 200, content_type="application/json; charset=UTF-8")


def error_info(reason: str, metadata: Mapping[str, str], domain: str = "googleapis.com",
               ) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": domain, "metadata": dict(metadata)}


def error(code: int, status: str, message: str,
          details: list[dict[str, Any]] | None = None) -> Response:
    """google.rpc.Status JSON (`status` left out when empty, as some front-end answers do)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if status:
        err["status"] = status
    if details:
        err["details"] = details
    return Response(json.dumps({"error": err}), code,
                    content_type="application/json; charset=UTF-8")


def service_disabled(number: str, *, service: str = SERVICE,
                     title: str = "Kubernetes Engine API") -> Response:
    """What Google answers when `service` is not enabled in the consumer project (the one
    the call is billed to: the resource's project, or the caller's quota project)."""
    return error(
        403, "PERMISSION_DENIED",
        f"{title} has not been used in project {number} before or it is disabled. Enable it by "
        f"visiting https://console.developers.google.com/apis/api/{service}/overview?project="
        f"{number} then retry. If you enabled this API recently, wait a few minutes for the "
        "action to propagate to our systems and retry.",
        [error_info("SERVICE_DISABLED", {
            "service": service, "consumer": f"projects/{number}", "serviceTitle": title,
            "containerInfo": number,
            "activationUrl": f"https://console.developers.google.com/apis/api/{service}/"
                             f"overview?project={number}"}),
         {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
          "message": f"{title} has not been used in project {number} before or it is "
                     "disabled."},
         {"@type": "type.googleapis.com/google.rpc.Help", "links": [{
             "description": "Google developers console API activation",
             "url": f"https://console.developers.google.com/apis/api/{service}/overview?"
                    f"project={number}"}]}],
    )
