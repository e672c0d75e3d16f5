"""The shared edge for every Google REST call made by the CLI and the Terraform provisioners.

Endpoints and credentials follow gcloud's own environment variables, so one override points
both gcloud and this code at a fake (issue 3, "Conventions"):

- `CLOUDSDK_API_ENDPOINT_OVERRIDES_<SERVICE>` replaces a service's API root
  (`api_root("tpu", TPU_API)`, `api_root("secretmanager", ...)`, `api_root("storage", ...)`).
- `CLOUDSDK_AUTH_ACCESS_TOKEN` is used as a bearer token; otherwise Application Default
  Credentials (google-auth) with the cloud-platform scope.

Errors come back as `ApiError`, whose `str()` is ONE line: what failed, the API's status and
message, and what to do about it. Nothing here logs a token or puts one in a URL.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TPU_API = "https://tpu.googleapis.com/"
SECRETMANAGER_API = "https://secretmanager.googleapis.com/"
STORAGE_API = "https://storage.googleapis.com/"
TOKEN_ENV = "CLOUDSDK_AUTH_ACCESS_TOKEN"
DEFAULT_TIMEOUT_S = 30.0
# Gateway hiccups are worth a retry; 429 is not: for TPU creates it means quota.
_TRANSIENT_CODES = frozenset({502, 503, 504})
_TRANSIENT_TRIES = 3

# google.rpc.Code numbers (as found in Operation.error) -> their names.
GRPC_STATUS = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
# ... and the HTTP code each maps to (google.rpc.Code's documented mapping).
GRPC_HTTP = {
    1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401,
}


def api_root(service: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """gcloud's endpoint override for `service` (e.g. "tpu"), else `default`; ends with '/'."""
    env = os.environ if environ is None else environ
    root = env.get(f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()}") or default
    if not re.match(r"https?://[^/\s]+", root):
        raise ValueError(
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()} = {root!r}: must be an API root "
            "URL like https://tpu.googleapis.com/ or http://127.0.0.1:8123/"
        )
    return root if root.endswith("/") else root + "/"


class ApiError(Exception):
    """A failed Google API call. `str()` is one line: what, status, message, what to do."""

    def __init__(
        self, code: int, status: str, message: str, *, action: str = "", service: str = "",
        hint: str | None = None,
    ) -> None:
        self.code = code
        self.status = status
        self.message = " ".join(message.split())
        self.action = action
        self.service = service
        self.hint = hint_for(code, status, self.message, service) if hint is None else hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.action}: " if self.action else ""
        hint = f" -> {self.hint}" if self.hint else ""
        return f"{where}{self.code} {self.status}: {self.message}{hint}"

    @classmethod
    def from_response(cls, resp: requests.Response, *, action: str, service: str) -> ApiError:
        code, status, message = resp.status_code, "", ""
        try:
            err = resp.json().get("error", {})
            if isinstance(err, dict):
                status, message = str(err.get("status", "")), str(err.get("message", ""))
        except ValueError:
            pass
        status = status or _http_status_name(code)
        message = message or (resp.text.strip()[:200] or resp.reason or "no message")
        return cls(code, status, message, action=action, service=service)

    @classmethod
    def from_status(cls, status: Mapping[str, Any], *, action: str, service: str) -> ApiError:
        """From a google.rpc.Status (an Operation's `error`, a failed QR's `failedData.error`)."""
        grpc = int(status.get("code", 2))
        return cls(
            GRPC_HTTP.get(grpc, 500), GRPC_STATUS.get(grpc, "UNKNOWN"),
            str(status.get("message", "no message")), action=action, service=service,
        )


def _http_status_name(code: int) -> str:
    return {
        400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
        404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
        501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
    }.get(code, "UNKNOWN")


def hint_for(code: int, status: str, message: str, service: str = "") -> str:
    """What to do about an API error, in one clause."""
    api = f"{service}.googleapis.com" if service else "the API"
    if "FLEX_START" in message and "not supported" in message:
        # SPEC 1: europe-west4-a/-b rejected flex-start for v5litepod-1; us-west4-a accepted it.
        return ("flex-start is not offered for this accelerator in this zone; us-west4-a "
                "accepted v5litepod-1 (SPEC 1): set TPUSERVE_ZONE")
    if code == 0:
        return f"could not reach {api}: check the network or the endpoint override"
    if code == 401 or status == "UNAUTHENTICATED":
        return (f"credentials missing or expired: run `gcloud auth application-default login` "
                f"or refresh {TOKEN_ENV}")
    if code == 403 or status == "PERMISSION_DENIED":
        return (f"check IAM (your account needs the permission named above in this project) and "
                f"that {api} is enabled: gcloud services enable {api}")
    if code == 404 or status == "NOT_FOUND":
        return "it does not exist (any more): check gcp.project, gcp.zone and the name"
    if code == 409 or status in ("ALREADY_EXISTS", "ABORTED"):
        return "a resource with this name exists or is changing: wait, or delete it first"
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        return ("quota or rate limit exhausted: flex-start and spot draw on the preemptible TPU "
                "quota of the zone (SPEC 2); check IAM & Admin > Quotas, or retry later")
    if status == "FAILED_PRECONDITION":
        return "the resource is in a state that forbids this right now: wait and retry"
    if status == "INVALID_ARGUMENT" or code == 400:
        return "the request was rejected: fix the setting the message names"
    if code >= 500:
        return "a Google-side error: retry in a minute"
    return ""


class CredentialsError(ApiError):
    """No usable credentials: neither a token variable nor Application Default Credentials."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            401, "UNAUTHENTICATED", detail, action="credentials",
            hint=f"run `gcloud auth application-default login`, or set {TOKEN_ENV}",
        )


def authorized_session(environ: Mapping[str, str] | None = None) -> requests.Session:
    """A requests session that authenticates every call (token variable, else ADC)."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        return session
    # lazy: the token path (provisioners, tests) never pays for google.auth
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(default_credentials())


def default_credentials() -> Any:
    """Application Default Credentials for the cloud-platform scope, or CredentialsError."""
    import google.auth
    import google.auth.exceptions

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise CredentialsError(f"no Application Default Credentials ({exc})") from None
    return credentials


def credentials(environ: Mapping[str, str] | None = None) -> Any:
    """google-auth credentials: CLOUDSDK_AUTH_ACCESS_TOKEN as a bearer token, else ADC."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        from google.oauth2.credentials import Credentials

        return Credentials(token=token)
    return default_credentials()


class GoogleApi:
    """One Google REST API: its root, an authorized session, one-line errors."""

    def __init__(
        self, service: str, default_root: str, *, session: requests.Session | None = None,
        root: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.service = service
        self.root = root or api_root(service, default_root, environ)
        self._environ = environ
        self._session = session
        self.timeout = timeout
        self._sleep = sleep

    @property
    def session(self) -> requests.Session:
        if self._session is None:  # created on first use: constructing a client is free
            self._session = authorized_session(self._environ)
        return self._session

    def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
        body: Any = None, action: str | None = None,
    ) -> dict[str, Any]:
        """Call ROOT + path; return the JSON object, or raise ApiError (one line)."""
        url = self.root + path.lstrip("/")
        action = action or f"{method} {path.lstrip('/')}"
        for attempt in range(_TRANSIENT_TRIES):
            try:
                resp = self.session.request(
                    method, url, params=params, json=body, timeout=self.timeout
                )
            except requests.RequestException as exc:
                if attempt + 1 < _TRANSIENT_TRIES:
                    self._sleep(2.0**attempt)
                    continue
                raise ApiError(
                    0, "UNAVAILABLE", f"{type(exc).__name__} reaching {self.root}",
                    action=action, service=self.service,
                ) from None
            if resp.status_code in _TRANSIENT_CODES and attempt + 1 < _TRANSIENT_TRIES:
                self._sleep(2.0**attempt)
                continue
            if resp.status_code >= 400:
                raise ApiError.from_response(resp, action=action, service=self.service)
            if not resp.content:
                return {}
            try:
                data = resp.json()
            except ValueError:
                raise ApiError(
                    resp.status_code, "UNKNOWN", "the response is not JSON",
                    action=action, service=self.service,
                ) from None
            return data if isinstance(data, dict) else {"value": data}
        raise AssertionError("unreachable")  # pragma: no cover
