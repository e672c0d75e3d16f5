"""google.rpc.Status details as the edge reads them: only the documented types prove anything."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.gcp.errors import ApiError, ErrorDetails

ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def _status(code: int, details: Any) -> dict[str, Any]:
    return {"code": code, "message": "m", "details": details}


def test_error_info_reason_domain_and_string_metadata() -> None:
    d = ErrorDetails.parse([{"@type": ERROR_INFO, "reason": "SERVICE_DISABLED",
                             "domain": "googleapis.com",
                             "metadata": {"consumer": "projects/123", "n": 5}}])
    assert (d.reason, d.domain, dict(d.metadata)) == (
        "SERVICE_DISABLED", "googleapis.com", {"consumer": "projects/123"})


@pytest.mark.parametrize("details", [None, {}, "x", [1, "a"], [{"reason": "SERVICE_DISABLED"}],
                                     [{"@type": ERROR_INFO, "reason": 7}]])
def test_malformed_details_prove_nothing(details: Any) -> None:
    assert ErrorDetails.parse(details) == ErrorDetails()


def test_rate_limit_is_not_quota() -> None:
    rate = ApiError(429, "RESOURCE_EXHAUSTED", "m",
                    details=ErrorDetails.parse([{"@type": ERROR_INFO,
                                                 "reason": "RATE_LIMIT_EXCEEDED"}]))
    quota = ApiError(429, "RESOURCE_EXHAUSTED", "m", retry_after=5,
                     details=ErrorDetails.parse([{"@type": QUOTA_FAILURE, "violations": []}]))
    bare = ApiError(429, "RESOURCE_EXHAUSTED", "m")
    after = ApiError(429, "RESOURCE_EXHAUSTED", "m", retry_after=3)
    assert rate.is_rate_limit and after.is_rate_limit
    assert not quota.is_rate_limit and not bare.is_rate_limit


def test_retry_info_fills_retry_after_when_no_header() -> None:
    details = ErrorDetails.parse([{"@type": RETRY_INFO, "retryDelay": "2.5s"}])
    assert ApiError(429, "", "m", details=details).retry_after == 2.5
    assert ApiError(429, "", "m", details=details, retry_after=7).retry_after == 7


def test_operation_error_details_are_read() -> None:
    exc = ApiError.from_status(
        _status(8, [{"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED"}]),
        action="a", service="tpu")
    assert exc.code == 429 and exc.is_rate_limit
