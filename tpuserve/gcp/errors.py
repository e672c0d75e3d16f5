"""`ApiError`: a failed Google API call whose `str()` is ONE line: what failed, the API's status
and message, and what to do about it (an HTML error page from the front end becomes its HTTP
status and name). Nothing here logs a token or puts one in a URL."""

from __future__ import annotations

import http
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuserve.gcp.endpoints import TOKEN_ENV
from tpuserve.gcp.retry import retry_after_seconds

if TYPE_CHECKING:
    import requests

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


class ApiError(Exception):
    """A failed Google API call. `str()` is one line: what, status, message, what to do."""

    def __init__(
        self, code: int, status: str, message: str, *, action: str = "", service: str = "",
        hint: str | None = None, token_in_env: bool = False, retry_after: float | None = None,
        details: ErrorDetails | None = None, status_from_api: bool = True,
    ) -> None:
        self.code = code
        self.status = status
        # False when `status` is only the HTTP code's name (an HTML page, an empty body):
        # such an answer says nothing about the resource.
        self.status_from_api = status_from_api
        self.message = " ".join(message.split())
        self.action = action
        self.service = service
        self.details = details or ErrorDetails()
        # The answer's Retry-After header, else its RetryInfo.retryDelay, in seconds.
        self.retry_after = retry_after if retry_after is not None else self.details.retry_delay
        self.hint = (hint_for(code, status, self.message, service, token_in_env=token_in_env)
                     if hint is None else hint)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.action}: " if self.action else ""
        hint = f" -> {self.hint}" if self.hint else ""
        return f"{where}{self.code} {self.status}: {self.message}{hint}"

    @property
    def reason(self) -> str:
        """ErrorInfo.reason ("SERVICE_DISABLED", "RATE_LIMIT_EXCEEDED", ...), or ""."""
        return self.details.reason

    @property
    def proves_not_found(self) -> bool:
        """The API's own word that the resource does not exist: a 404 whose NOT_FOUND status
        the API sent (a google.rpc.Status body, or gRPC's code). A front end's 404 page or an
        empty body proves nothing, so a caller keeps it an error instead of "it is gone"."""
        return self.code == 404 and self.status == "NOT_FOUND" and self.status_from_api

    @property
    def is_rate_limit(self) -> bool:
        """A 429 that says "slow down", not "no quota": ErrorInfo reason RATE_LIMIT_EXCEEDED
        or a Retry-After/RetryInfo, and no QuotaFailure detail (a quota refusal stays one)."""
        if self.code != 429 or self.details.quota_failure:
            return False
        return self.details.reason in RATE_LIMIT_REASONS or self.retry_after is not None

    @classmethod
    def from_response(cls, resp: requests.Response, *, action: str, service: str,
                      token_in_env: bool = False) -> ApiError:
        code, status, message = resp.status_code, "", ""
        details = ErrorDetails()
        try:
            err = resp.json().get("error", {})
            if isinstance(err, dict):
                status, message = str(err.get("status", "")), str(err.get("message", ""))
                details = ErrorDetails.parse(err.get("details"))
        except (ValueError, AttributeError):
            pass
        return cls.from_parts(
            code, status, message, body=resp.text, reason=resp.reason or "",
            content_type=resp.headers.get("Content-Type", ""), action=action,
            service=service, token_in_env=token_in_env,
            retry_after=retry_after_seconds(resp.headers.get("Retry-After")), details=details,
        )

    @classmethod
    def from_parts(
        cls, code: int, status: str, message: str, *, body: str = "", reason: str = "",
        content_type: str = "", action: str, service: str, token_in_env: bool = False,
        retry_after: float | None = None, details: ErrorDetails | None = None,
    ) -> ApiError:
        """From an answer's pieces: the API's JSON status/message when it sent them, else the
        HTTP status and its name (an HTML page from the front end is never shown raw)."""
        status_from_api = bool(status)
        status = status or _http_status_name(code)
        if not message:
            text = " ".join(body.split())
            if text and "html" not in content_type.lower() and "<" not in text:
                message = _strip_urls(text)[:200]
            else:
                message = _http_phrase(code, reason)
                if text:
                    message += " (an error page from Google's front end, not an API answer)"
        return cls(code, status, _strip_urls(message) or "no message", action=action,
                   service=service, token_in_env=token_in_env, retry_after=retry_after,
                   details=details, status_from_api=status_from_api)

    @classmethod
    def from_status(cls, status: Mapping[str, Any], *, action: str, service: str) -> ApiError:
        """From a google.rpc.Status (an Operation's `error`, a failed QR's `failedData.error`)."""
        grpc = int(status.get("code", 2))
        return cls(
            GRPC_HTTP.get(grpc, 500), GRPC_STATUS.get(grpc, "UNKNOWN"),
            str(status.get("message", "no message")), action=action, service=service,
            details=ErrorDetails.parse(status.get("details")),
        )


# ErrorInfo reasons that mean "too many requests now" (retry later), as opposed to a quota
# limit (RESOURCE_EXHAUSTED with a QuotaFailure detail), which a retry does not cure.
RATE_LIMIT_REASONS = frozenset({"RATE_LIMIT_EXCEEDED"})
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION_RE = re.compile(r"(\d+(?:\.\d{1,9})?)s")


@dataclass(frozen=True)
class ErrorDetails:
    """What a google.rpc.Status's `details` prove, parsed from the documented types only
    (https://cloud.google.com/apis/design/errors#error_details): anything else, or a
    malformed entry, proves nothing and is left out."""

    reason: str = ""  # ErrorInfo.reason
    domain: str = ""  # ErrorInfo.domain
    metadata: Mapping[str, str] = field(default_factory=dict)  # ErrorInfo.metadata
    quota_failure: bool = False  # a QuotaFailure detail was present
    retry_delay: float | None = None  # RetryInfo.retryDelay, seconds

    @classmethod
    def parse(cls, details: Any) -> ErrorDetails:
        if not isinstance(details, list):
            return cls()
        reason, domain, metadata = "", "", {}
        quota_failure, retry_delay = False, None
        for item in details:
            if not isinstance(item, dict):
                continue
            kind = item.get("@type")
            if kind == _ERROR_INFO and not reason:
                r, dom, meta = item.get("reason"), item.get("domain"), item.get("metadata")
                if isinstance(r, str):
                    reason = r
                    domain = dom if isinstance(dom, str) else ""
                    if isinstance(meta, dict):
                        metadata = {k: v for k, v in meta.items()
                                    if isinstance(k, str) and isinstance(v, str)}
            elif kind == _QUOTA_FAILURE:
                quota_failure = True
            elif kind == _RETRY_INFO:
                m = _DURATION_RE.fullmatch(str(item.get("retryDelay", "")))
                if m:
                    retry_delay = float(m.group(1))
        return cls(reason, domain, metadata, quota_failure, retry_delay)


def _strip_urls(text: str) -> str:
    """Request URLs say nothing the action does not, and may carry query parameters."""
    return re.sub(r"\b[a-z]+://\S+", "<url>", text)


def _http_phrase(code: int, reason: str = "") -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return reason or "HTTP error"


def _http_status_name(code: int) -> str:
    """The google.rpc status an HTTP code stands for; else the HTTP name (BAD_GATEWAY)."""
    known = {
        400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
        404: "NOT_FOUND", 409: "ALREADY_EXISTS", 412: "FAILED_PRECONDITION",
        429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
    }
    if code in known:
        return known[code]
    try:
        return http.HTTPStatus(code).name
    except ValueError:
        return "UNKNOWN"


def hint_for(code: int, status: str, message: str, service: str = "", *,
             token_in_env: bool = False) -> str:
    """What to do about an API error, in one clause."""
    api = f"{service}.googleapis.com" if service else "the API"
    if "FLEX_START" in message and "not supported" in message:
        # SPEC 1: europe-west4-a/-b rejected flex-start for v5litepod-1; us-west4-a accepted it.
        return ("flex-start is not offered for this accelerator in this zone; us-west4-a "
                "accepted v5litepod-1 (SPEC 1): set TPUSERVE_ZONE")
    if code == 0:
        return f"could not reach {api}: check the network or the endpoint override"
    if (code == 401 or status == "UNAUTHENTICATED") and token_in_env:
        return (f"the access token in {TOKEN_ENV} was refused or has expired (they last about "
                f"an hour): set a new one with `export {TOKEN_ENV}=$(gcloud auth "
                "print-access-token)`, or unset it to use Application Default Credentials")
    if code == 401 or status == "UNAUTHENTICATED":
        return (f"credentials missing or expired: run `gcloud auth application-default login` "
                f"or refresh {TOKEN_ENV}")
    if code == 403 or status == "PERMISSION_DENIED":
        return (f"check IAM (your account needs the permission named above in this project) and "
                f"that {api} is enabled: gcloud services enable {api}")
    if code == 404 or status == "NOT_FOUND":
        return "it does not exist (any more): check gcp.project, gcp.zone and the name"
    # Never "delete it": the resource may be a node or queued resource holding capacity.
    if status == "ALREADY_EXISTS":
        return ("a resource with this name exists already, or its name is still held after a "
                "delete: look at what holds the name before changing anything")
    if code == 409 or status == "ABORTED":
        return ("another operation is changing the resource: wait until it finishes, then "
                "retry")
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        return ("quota or rate limit exhausted: flex-start and spot draw on the preemptible TPU "
                "quota of the zone (SPEC 2); check IAM & Admin > Quotas, or retry later")
    if status == "FAILED_PRECONDITION":
        return "the resource is in a state that forbids this right now: wait and retry"
    if status == "INVALID_ARGUMENT" or code == 400:
        return "the request was rejected: fix the setting the message names"
    if code >= 500:
        return "a Google-side error (retried; it persisted): retry in a minute"
    return ""


class CredentialsError(ApiError):
    """No usable credentials: neither a token variable nor Application Default Credentials."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            401, "UNAUTHENTICATED", detail, action="credentials",
            hint=f"run `gcloud auth application-default login`, or set {TOKEN_ENV}",
        )
