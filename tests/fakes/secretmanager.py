"""A fake Secret Manager (v1 REST) on 127.0.0.1: `versions/{version}:access` and `secrets.get`.

  GET /v1/projects/PROJECT/secrets/SECRET/versions/VERSION:access   (VERSION: a number or latest)
answers {"name", "payload": {"data": base64, "dataCrc32c": "<int64 as string>"}} with
`Authorization: Bearer <token>`, and the real API's errors otherwise: 401 UNAUTHENTICATED,
403 PERMISSION_DENIED (another project), 404 NOT_FOUND "... not found or has no versions.",
400 FAILED_PRECONDITION for a disabled or destroyed latest version.
  GET /v1/projects/PROJECT/secrets/SECRET                           (secrets.get: metadata)
answers the Secret resource {"name": "projects/<number>/secrets/SECRET", "replication",
"createTime", "etag"} whether or not it has versions; 404 NOT_FOUND "Secret [...] not found.";
403 PERMISSION_DENIED for another project or a permission in `denied`
(e.g. {"secretmanager.secrets.get"}: the caller lacks it). Point code at it with
`CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER=<fake.endpoint>`.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from dataclasses import dataclass

from werkzeug import Request, Response

from .discovery import Discovery, guarded
from .metadata import FaultQueue, LoopbackServer, dripping
from .storage import crc32c

PROJECT_NUMBER = "123456789012"
_ACCESS = re.compile(r"/v1/projects/([^/]+)/secrets/([^/]+)/versions/([^/:]+):access")
_SECRET = re.compile(r"/v1/projects/([^/]+)/secrets/([^/:]+)")


@dataclass
class SecretVersion:
    data: bytes
    state: str = "ENABLED"  # ENABLED, DISABLED or DESTROYED


@dataclass(frozen=True)
class AccessCall:
    at: float
    secret: str
    status: int


class FakeSecretManager:
    """Secrets of one project. `secrets[id]` lists versions, version N at index N-1."""

    def __init__(self, *, project: str, access_token: str) -> None:
        self.project = project
        self.access_token = access_token
        self.secrets: dict[str, list[SecretVersion]] = {}
        self.calls: list[AccessCall] = []
        self.outage = False
        self.denied: set[str] = set()  # permissions the caller lacks (secretmanager.secrets.get)
        self.faults = FaultQueue()  # front-end pages, dropped connections (see fail_next)
        self.drip_accesses = 0  # the next N :access answers drip (drip_next)
        self._drip_stop = threading.Event()
        self._lock = threading.Lock()
        # Requests and answers checked against secretmanager.v1's discovery document.
        self._checked = guarded(Discovery.load("secretmanager", "v1"), self._handle)
        self.server = LoopbackServer(self._serve)  # _checked, some answers dripped

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER."""
        return f"http://127.0.0.1:{self.server.port}/"

    def start(self) -> FakeSecretManager:
        self.server.start()
        return self

    def stop(self) -> None:
        self._drip_stop.set()
        self.server.stop()

    def drip_next(self, times: int = 1) -> None:
        """The next TIMES :access answers are sent one byte every 0.5 s (status and headers at
        once): a read bounded per recv only never ends."""
        with self._lock:
            self.drip_accesses += times

    def _serve(self, request: Request) -> Response:
        response = self._checked(request)
        with self._lock:
            drip = _ACCESS.fullmatch(request.path) is not None and self.drip_accesses > 0
            if drip:
                self.drip_accesses -= 1
        return dripping(response, 0.5, self._drip_stop) if drip else response

    def create_secret(self, secret: str) -> None:
        with self._lock:
            self.secrets.setdefault(secret, [])

    def add_version(self, secret: str, data: bytes) -> int:
        with self._lock:
            versions = self.secrets.setdefault(secret, [])
            versions.append(SecretVersion(data))
            return len(versions)

    def set_state(self, secret: str, version: int, state: str) -> None:
        with self._lock:
            self.secrets[secret][version - 1].state = state

    def fail_next(self, code: int, status: str, message: str, *, times: int = 1,
                  retry_after: str | None = None) -> None:
        """The next `times` accesses get this error ({"error": {"code", "message", "status"}}
        with status "" left out), with Retry-After when given."""
        def answer() -> Response:
            response = _error(code, status, message)
            if retry_after is not None:
                response.headers["Retry-After"] = retry_after
            return response

        self.faults.add(lambda r: ":access" in r.path, answer, times)

    def calls_for(self, secret: str) -> list[AccessCall]:
        with self._lock:
            return [c for c in self.calls if c.secret == secret]

    def _handle(self, request: Request) -> Response:
        m = _ACCESS.fullmatch(request.path)
        meta = None if m else _SECRET.fullmatch(request.path)
        response = self.faults.take(request)
        if response is None and meta:
            response = self._get_secret(request, meta)
        if response is None:
            response = self._access(request, m) if m else _error(404, "NOT_FOUND", "Not Found")
        with self._lock:
            secret = m[2] if m else meta[2] if meta else ""
            self.calls.append(AccessCall(time.time(), secret, response.status_code))
        return response

    def fail_next_get(self, code: int, status: str, message: str, *, times: int = 1) -> None:
        """The next `times` secrets.get calls (metadata, not :access) get this error."""
        self.faults.add(lambda r: bool(_SECRET.fullmatch(r.path)),
                        lambda: _error(code, status, message), times)

    def _get_secret(self, request: Request, m: re.Match[str]) -> Response:
        """secrets.get: the Secret resource (its metadata; no payload)."""
        project, secret = m[1], m[2]
        if request.method != "GET":
            return _error(404, "NOT_FOUND", "Method not found.")
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return _error(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials. "
                "Expected OAuth 2 access token, login cookie or other valid authentication "
                "credential.",
            )
        if self.outage:
            return _error(503, "UNAVAILABLE", "The service is currently unavailable.")
        if project not in (self.project, PROJECT_NUMBER) or (
                "secretmanager.secrets.get" in self.denied):
            return _error(
                403, "PERMISSION_DENIED", "Permission 'secretmanager.secrets.get' denied for "
                f"resource 'projects/{project}/secrets/{secret}' (or it may not exist).",
            )
        with self._lock:
            exists = secret in self.secrets
        name = f"projects/{PROJECT_NUMBER}/secrets/{secret}"
        if not exists:
            return _error(404, "NOT_FOUND", f"Secret [{name}] not found.")
        body = {"name": name, "replication": {"automatic": {}},
                "createTime": "2025-01-01T00:00:00.000000Z", "etag": '"1617e0b4a3c2f0"'}
        return Response(json.dumps(body), 200, mimetype="application/json")

    def _access(self, request: Request, m: re.Match[str]) -> Response:
        project, secret, version = m[1], m[2], m[3]
        if request.method != "GET":
            return _error(404, "NOT_FOUND", "Method not found.")
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return _error(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials. "
                "Expected OAuth 2 access token, login cookie or other valid authentication "
                "credential.",
            )
        if self.outage:
            return _error(503, "UNAVAILABLE", "The service is currently unavailable.")
        resource = f"projects/{project}/secrets/{secret}/versions/{version}"
        if project not in (self.project, PROJECT_NUMBER):
            return _error(
                403, "PERMISSION_DENIED", f"Permission 'secretmanager.versions.access' denied "
                f"for resource '{resource}' (or it may not exist).",
            )
        with self._lock:
            versions = list(self.secrets.get(secret, []))
        if not versions:
            return _error(
                404, "NOT_FOUND",
                f"Secret [projects/{PROJECT_NUMBER}/secrets/{secret}] not found or has no "
                "versions.",
            )
        if version == "latest":
            number = len(versions)
        elif version.isdigit() and 1 <= int(version) <= len(versions):
            number = int(version)
        else:
            return _error(
                404, "NOT_FOUND",
                f"Secret Version [projects/{PROJECT_NUMBER}/secrets/{secret}/versions/"
                f"{version}] not found.",
            )
        name = f"projects/{PROJECT_NUMBER}/secrets/{secret}/versions/{number}"
        found = versions[number - 1]
        if found.state != "ENABLED":
            return _error(400, "FAILED_PRECONDITION", f"Secret Version [{name}] is in "
                          f"{found.state} state.")
        body = {
            "name": name,
            "payload": {
                "data": base64.b64encode(found.data).decode(),
                "dataCrc32c": str(crc32c(found.data)),
            },
        }
        return Response(json.dumps(body), 200, mimetype="application/json")


def _error(code: int, status: str, message: str) -> Response:
    error: dict[str, object] = {"code": code, "message": message}
    if status:
        error["status"] = status
    body = {"error": error}
    return Response(json.dumps(body), code, mimetype="application/json")
