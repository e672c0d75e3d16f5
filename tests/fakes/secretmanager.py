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

Writes, as the v1 discovery document (secretmanager.v1.json) shapes them:
  POST /v1/projects/PROJECT/secrets/SECRET:addVersion        {"payload": {"data": base64,
       "dataCrc32c"?: "<int64>"}} (nothing else; data at most 64 KiB; a checksum that does not
       match is 400 INVALID_ARGUMENT) -> the SecretVersion {name, createTime, state, etag,
       replicationStatus, clientSpecifiedPayloadChecksum}
  POST /v1/projects/PROJECT/secrets/SECRET/versions/N:disable {} or {"etag": E} -> SecretVersion
  GET  /v1/projects/PROJECT/secrets/SECRET/versions[?filter=state:ENABLED|state:DISABLED
       &pageSize=N] -> {"versions": [newest first], "totalSize"} (other filters: 400)
Every request is in `requests` as (method, path, status).
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
_ADD = re.compile(r"/v1/projects/([^/]+)/secrets/([^/:]+):addVersion")
_DISABLE = re.compile(r"/v1/projects/([^/]+)/secrets/([^/:]+)/versions/([^/:]+):disable")
_LIST = re.compile(r"/v1/projects/([^/]+)/secrets/([^/:]+)/versions")
MAX_PAYLOAD = 64 * 1024


@dataclass
class SecretVersion:
    data: bytes
    state: str = "ENABLED"  # ENABLED, DISABLED or DESTROYED
    checksummed: bool = False  # added with a dataCrc32c


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
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) of every one
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
        response = self._write(request)
        if response is None:
            response = self._read(request)
        with self._lock:
            self.requests.append((request.method, request.path, response.status_code))
        return response

    def _write(self, request: Request) -> Response | None:
        """addVersion, versions.disable and versions.list; None for any other path."""
        for pattern, method, handler in ((_ADD, "POST", self._add), (_DISABLE, "POST",
                                          self._disable), (_LIST, "GET", self._list)):
            m = pattern.fullmatch(request.path)
            if m is None:
                continue
            if request.method != method:
                return _error(404, "NOT_FOUND", "Method not found.")
            denied = self._deny(request, m[1], m[2])
            return denied if denied is not None else handler(request, m)
        return None

    def _deny(self, request: Request, project: str, secret: str) -> Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return _error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                          "credentials. Expected OAuth 2 access token, login cookie or other "
                          "valid authentication credential.")
        if self.outage:
            return _error(503, "UNAVAILABLE", "The service is currently unavailable.")
        if project not in (self.project, PROJECT_NUMBER):
            return _error(403, "PERMISSION_DENIED", "Permission denied on resource "
                          f"'projects/{project}/secrets/{secret}' (or it may not exist).")
        with self._lock:
            exists = secret in self.secrets
        if not exists:
            return _error(404, "NOT_FOUND",
                          f"Secret [projects/{PROJECT_NUMBER}/secrets/{secret}] not found.")
        return None

    def _version_doc(self, secret: str, number: int) -> dict[str, object]:
        v = self.secrets[secret][number - 1]
        return {"name": f"projects/{PROJECT_NUMBER}/secrets/{secret}/versions/{number}",
                "createTime": "2026-01-01T00:00:00.000000Z", "state": v.state,
                "etag": f'"{number:x}{v.state[0].lower()}"',
                "replicationStatus": {"automatic": {}},
                "clientSpecifiedPayloadChecksum": v.checksummed}

    def _add(self, request: Request, m: re.Match[str]) -> Response:
        try:
            body = json.loads(request.get_data(as_text=True) or "null")
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        if not isinstance(body, dict) or set(body) != {"payload"} or \
                not isinstance(body["payload"], dict) or \
                not set(body["payload"]) <= {"data", "dataCrc32c"} or \
                not isinstance(body["payload"].get("data"), str):
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received. Unknown "
                          "name or missing payload.data.")
        try:
            data = base64.b64decode(body["payload"]["data"], validate=True)
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "Invalid value at 'payload.data' (TYPE_BYTES)")
        if not data or len(data) > MAX_PAYLOAD:
            return _error(400, "INVALID_ARGUMENT", "Secret payload data must be between 1 "
                          f"byte and {MAX_PAYLOAD} bytes.")
        crc = body["payload"].get("dataCrc32c")
        if crc is not None and str(crc) != str(crc32c(data)):
            return _error(400, "INVALID_ARGUMENT", "Checksum mismatch: the provided "
                          "data_crc32c does not match the data.")
        with self._lock:
            versions = self.secrets[m[2]]
            versions.append(SecretVersion(data, checksummed=crc is not None))
            doc = self._version_doc(m[2], len(versions))
        return Response(json.dumps(doc), 200, mimetype="application/json")

    def _disable(self, request: Request, m: re.Match[str]) -> Response:
        try:
            body = json.loads(request.get_data(as_text=True) or "{}")
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        if not isinstance(body, dict) or not set(body) <= {"etag"}:
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        with self._lock:
            versions = self.secrets[m[2]]
            number = int(m[3]) if m[3].isdigit() else 0
            if not 1 <= number <= len(versions):
                return _error(404, "NOT_FOUND", f"Secret Version [projects/{PROJECT_NUMBER}/"
                              f"secrets/{m[2]}/versions/{m[3]}] not found.")
            if versions[number - 1].state == "DESTROYED":
                return _error(400, "FAILED_PRECONDITION", "Secret Version is in DESTROYED "
                              "state.")
            versions[number - 1].state = "DISABLED"
            doc = self._version_doc(m[2], number)
        return Response(json.dumps(doc), 200, mimetype="application/json")

    def _list(self, request: Request, m: re.Match[str]) -> Response:
        allowed = {"filter", "pageSize", "pageToken"}
        if not set(request.args) <= allowed:
            return _error(400, "INVALID_ARGUMENT", "Invalid query parameter.")
        flt = request.args.get("filter", "")
        if flt not in ("", "state:ENABLED", "state:DISABLED", "state:DESTROYED"):
            return _error(400, "INVALID_ARGUMENT", f"Invalid filter: {flt}")
        with self._lock:
            docs = [self._version_doc(m[2], n) for n in range(len(self.secrets[m[2]]), 0, -1)]
        if flt:
            docs = [d for d in docs if d["state"] == flt.split(":", 1)[1]]
        return Response(json.dumps({"versions": docs, "totalSize": len(docs)} if docs else {}),
                        200, mimetype="application/json")

    def _read(self, request: Request) -> Response:
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
