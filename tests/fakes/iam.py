"""A fake IAM API (v1 REST) on 127.0.0.1: `projects.serviceAccounts.get` only.

  GET /v1/projects/PROJECT/serviceAccounts/EMAIL       (PROJECT: the project id, or "-")
answers the ServiceAccount resource {"name", "projectId", "uniqueId", "email", "displayName",
"etag", "oauth2ClientId"} with `Authorization: Bearer <token>`, and the real API's errors
otherwise ({"error": {"code", "message", "status"}}): 401 UNAUTHENTICATED; 403
PERMISSION_DENIED "Permission 'iam.serviceAccounts.get' denied on resource (or it may not
exist)." for another project or when "iam.serviceAccounts.get" is in `denied`; 404 NOT_FOUND
"Unknown service account" for an account the project does not have. Point code at it with
`CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM=<fake.endpoint>`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass

from werkzeug import Request, Response

from .discovery import Discovery, guarded
from .metadata import FaultQueue, LoopbackServer

_GET = re.compile(r"/v1/projects/([^/]+)/serviceAccounts/([^/:]+)")


@dataclass(frozen=True)
class IamCall:
    at: float
    method: str
    email: str
    status: int


class FakeIam:
    """Service accounts of one project: `accounts` holds their emails."""

    def __init__(self, *, project: str, access_token: str) -> None:
        self.project = project
        self.access_token = access_token
        self.accounts: set[str] = set()
        self.denied: set[str] = set()  # permissions the caller lacks ("iam.serviceAccounts.get")
        self.calls: list[IamCall] = []
        self.faults = FaultQueue()
        self._lock = threading.Lock()
        # Requests and answers checked against iam.v1's discovery document.
        self.server = LoopbackServer(guarded(Discovery.load("iam", "v1"), self._handle))

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM."""
        return f"http://127.0.0.1:{self.server.port}/"

    def start(self) -> FakeIam:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def create_account(self, account_id: str) -> str:
        """Add ACCOUNT_ID@PROJECT.iam.gserviceaccount.com; returns the email."""
        email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
        with self._lock:
            self.accounts.add(email)
        return email

    def fail_next(self, code: int, status: str, message: str, *, times: int = 1) -> None:
        self.faults.add(lambda r: True, lambda: _error(code, status, message), times)

    def _handle(self, request: Request) -> Response:
        m = _GET.fullmatch(request.path)
        response = self.faults.take(request)
        if response is None:
            response = self._get(request, m) if m else _error(404, "NOT_FOUND", "Not Found")
        with self._lock:
            self.calls.append(IamCall(time.time(), request.method, m[2] if m else "",
                                      response.status_code))
        return response

    def _get(self, request: Request, m: re.Match[str]) -> Response:
        project, email = m[1], m[2]
        if request.method != "GET":
            return _error(404, "NOT_FOUND", "Method not found.")
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return _error(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials. "
                "Expected OAuth 2 access token, login cookie or other valid authentication "
                "credential.",
            )
        if project not in (self.project, "-") or "iam.serviceAccounts.get" in self.denied:
            return _error(403, "PERMISSION_DENIED", "Permission 'iam.serviceAccounts.get' "
                          "denied on resource (or it may not exist).")
        with self._lock:
            exists = email in self.accounts
        if not exists:
            return _error(404, "NOT_FOUND", "Unknown service account")
        unique_id = str(100000000000000000000 + sum(map(ord, email)))
        body = {
            "name": f"projects/{self.project}/serviceAccounts/{email}",
            "projectId": self.project, "uniqueId": unique_id, "email": email,
            "displayName": email.split("@", 1)[0], "etag": "MDEwMjE5MjA=",
            "oauth2ClientId": unique_id,
        }
        return Response(json.dumps(body), 200, mimetype="application/json")


def _error(code: int, status: str, message: str) -> Response:
    body = {"error": {"code": code, "message": message, "status": status}}
    return Response(json.dumps(body), code, mimetype="application/json")
