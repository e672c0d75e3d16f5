"""The shared Google API edge (tpuserve.gcp.api) as the TPU client meets it: one-line errors
with what to do, retries of gateway errors, endpoints and credentials from gcloud's variables."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.gcp.tpu_support import REF
from tpuserve.gcp import endpoints
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.credentials import authorized_session
from tpuserve.gcp.endpoints import api_root
from tpuserve.gcp.errors import ApiError, CredentialsError
from tpuserve.gcp.tpu.client import TpuClient


@pytest.mark.parametrize(("code", "status", "advice"), [
    (403, "PERMISSION_DENIED", "gcloud services enable tpu.googleapis.com"),
    (429, "RESOURCE_EXHAUSTED", "preemptible TPU quota"),
    (401, "UNAUTHENTICATED", "was refused or has expired"),
    (500, "INTERNAL", "retry in a minute"),
])
def test_api_errors_are_one_line_with_what_to_do(api, client, code, status, advice) -> None:
    # times=50: transient ones (429, 500) are retried first, then reported the same way.
    api.fail_next(code, status, "Permission 'tpu.queuedResources.get' denied\non resource",
                  times=50)
    with pytest.raises(ApiError) as err:
        client.get_queued_resource(REF)
    text = str(err.value)
    assert text.startswith(f"get queued resource {REF.name}: {code} {status}: Permission")
    assert advice in text and "\n" not in text

def test_gateway_errors_are_retried(api, client, clock) -> None:
    api.fail_next(503, "UNAVAILABLE", "try again", times=2)
    assert client.get_queued_resource(REF) is None
    # Full jitter: each pause is uniform in [0, 1 s doubling]; never above its step.
    assert len(clock.slept) == 2 and clock.slept[0] <= 1.0 and clock.slept[1] <= 2.0

def test_unreachable_api_is_one_line(clock) -> None:
    dead = TpuClient(root="http://127.0.0.1:9/", environ={"CLOUDSDK_AUTH_ACCESS_TOKEN": "t"},
                     clock=clock, sleep=clock.sleep)
    with pytest.raises(ApiError) as err:
        dead.get_queued_resource(REF)
    assert err.value.code == 0 and "could not reach tpu.googleapis.com" in str(err.value)

def test_api_root_follows_gcloud_variables() -> None:
    assert api_root("tpu", endpoints.TPU_API, {}) == "https://tpu.googleapis.com/"
    env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": "http://127.0.0.1:8123"}
    assert api_root("secretmanager", endpoints.SECRETMANAGER_API, env) == (
        "http://127.0.0.1:8123/")
    bad = re.escape("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU = 'tpu.local'")
    with pytest.raises(ValueError, match=bad):
        api_root("tpu", endpoints.TPU_API, {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": "tpu.local"})

def test_credentials_token_variable_else_adc(monkeypatch) -> None:
    session = authorized_session({"CLOUDSDK_AUTH_ACCESS_TOKEN": "tok-123"})
    assert session.headers["Authorization"] == "Bearer tok-123"
    import google.auth
    import google.auth.exceptions

    def no_adc(**_: Any) -> None:
        raise google.auth.exceptions.DefaultCredentialsError("Could not find credentials")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(CredentialsError) as err:
        authorized_session({})
    assert "application-default login" in str(err.value) and "\n" not in str(err.value)


# An answer proves only what it says: the edge returns JSON objects, nothing else.

def _edge(api: Any, clock: Any) -> GoogleApi:
    return GoogleApi("tpu", "https://tpu.googleapis.com/", environ=api.environ(),
                     clock=clock, sleep=clock.sleep)


@pytest.mark.parametrize(("body", "said"), [
    ("", "200 OK: the answer is empty: it proves nothing"),
    ("null", "200 OK: the answer is null, not a JSON object: it proves nothing"),
    ("[]", "200 OK: the answer is a list, not a JSON object: it proves nothing"),
    ('"done"', "200 OK: the answer is a string, not a JSON object: it proves nothing"),
    ("7", "200 OK: the answer is a number, not a JSON object: it proves nothing"),
])
def test_an_answer_that_is_not_an_object_is_an_error(api, clock, body, said) -> None:
    api.answer_next(200, body)
    with pytest.raises(ApiError) as err:
        _edge(api, clock).request("GET", f"v2alpha1/{REF.name}", action="get it")
    assert str(err.value) == f"get it: {said}"
    assert len(api.calls("GET")) == 1 and clock.slept == []  # not retried: not transient


def test_an_empty_answer_is_empty_only_where_the_method_documents_it(api, clock) -> None:
    api.answer_next(204, "")
    assert _edge(api, clock).request("DELETE", f"v2alpha1/{REF.name}", empty_ok=True) == {}
    api.answer_next(200, "null")  # empty_ok is about an empty body, not about other JSON
    with pytest.raises(ApiError, match="the answer is null"):
        _edge(api, clock).request("DELETE", f"v2alpha1/{REF.name}", empty_ok=True)


def test_a_redirect_is_not_followed(api, clock) -> None:
    target = f"{api.url}v2alpha1/projects/p/locations/z/queuedResources?token=secret"
    api.answer_next(302, "", headers={"Location": target})
    with pytest.raises(ApiError) as err:
        _edge(api, clock).request("GET", f"v2alpha1/{REF.name}", action="get it")
    host = api.url.split("/")[2]
    assert str(err.value) == (
        f"get it: 302 FOUND: the answer is a redirect (to {host}), not an API answer; "
        "redirects are not followed -> check the endpoint override and any proxy in between")
    assert [r.path for r in api.calls()] == [f"/v2alpha1/{REF.name}"]
