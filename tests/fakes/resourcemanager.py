"""A fake Cloud Resource Manager API (v1 REST) on 127.0.0.1: `projects.get` only.

  GET /v1/projects/PROJECT_ID
answers the Project {"projectNumber", "projectId", "lifecycleState", "name", "createTime"}
with `Authorization: Bearer <token>` (requests and answers checked against the
cloudresourcemanager.v1 discovery document, tests/fakes/discovery.py), and google.rpc.Status
errors otherwise: 401 UNAUTHENTICATED; 403 PERMISSION_DENIED "The caller
does not have permission" for any other project (the real API answers 403, not 404, for a
project the caller cannot see) or when "resourcemanager.projects.get" is in `denied`.
Faults (`fail_next`, `answer_next`) answer the next requests instead. Point code at it with
`CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER=<fake.endpoint>`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping

from werkzeug import Request, Response

from .container import error, error_info
from .discovery import Discovery, guarded
from .metadata import FaultQueue, LoopbackServer

_GET = re.compile(r"/v1/projects/([^/:]+)")


class FakeResourceManager:
    """One project: its id and number."""

    def __init__(self, *, project: str, number: str, access_token: str) -> None:
        self.project = project
        self.number = number
        self.access_token = access_token
        self.denied: set[str] = set()
        self.calls: list[str] = []  # request paths
        self.faults = FaultQueue()
        self._lock = threading.Lock()
        self._answer = guarded(Discovery.load("cloudresourcemanager", "v1"), self._get)
        self.server = LoopbackServer(self._handle)

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER."""
        return f"http://127.0.0.1:{self.server.port}/"

    def start(self) -> FakeResourceManager:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def fail_next(self, code: int, status: str, message: str, *, times: int = 1) -> None:
        self.faults.add(lambda r: True, lambda: error(code, status, message), times)

    def answer_next(self, status: int, body: str = "", *,
                    headers: Mapping[str, str] | None = None, times: int = 1) -> None:
        self.faults.add(lambda r: True,
                        lambda: Response(body, status, headers=dict(headers or {}),
                                         content_type="application/json"), times)

    def _handle(self, request: Request) -> Response:
        with self._lock:
            self.calls.append(request.path)
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                         "credentials. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.")
        faulted = self.faults.take(request)
        if faulted is not None:
            return faulted
        return self._answer(request)  # checked against cloudresourcemanager.v1's document

    def _get(self, request: Request) -> Response:
        m = _GET.fullmatch(request.path)
        if not m or request.method != "GET":  # the document routes only projects.get here
            return error(404, "NOT_FOUND", f"Method not found: {request.method} {request.path}")
        if m.group(1) != self.project or "resourcemanager.projects.get" in self.denied:
            return error(403, "PERMISSION_DENIED", "The caller does not have permission",
                         [error_info("IAM_PERMISSION_DENIED",
                                     {"permission": "resourcemanager.projects.get"},
                                     "cloudresourcemanager.googleapis.com")])
        body = {"projectNumber": self.number, "projectId": self.project,
                "lifecycleState": "ACTIVE", "name": self.project,
                "createTime": "2026-01-05T10:00:00.000Z"}
        return Response(json.dumps(body), 200, content_type="application/json; charset=UTF-8")
