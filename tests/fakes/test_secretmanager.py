"""The fake Secret Manager's secrets.get (metadata) answers as the v1 REST API does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.fakes.secretmanager import PROJECT_NUMBER, FakeSecretManager

TOKEN = "ya29.fake-token"


@pytest.fixture
def sm() -> Iterator[FakeSecretManager]:
    fake = FakeSecretManager(project="proj-test-1", access_token=TOKEN).start()
    yield fake
    fake.stop()


def _get(sm: FakeSecretManager, path: str, token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{sm.endpoint}{path}", headers=headers, timeout=5)


def test_secrets_get_answers_the_secret_resource_with_or_without_versions(sm) -> None:
    sm.create_secret("tpuserve-api-key")  # no version yet: it exists all the same
    secret = _get(sm, "v1/projects/proj-test-1/secrets/tpuserve-api-key").json()
    assert secret["name"] == f"projects/{PROJECT_NUMBER}/secrets/tpuserve-api-key"
    assert secret["replication"] == {"automatic": {}} and "payload" not in secret
    missing = _get(sm, "v1/projects/proj-test-1/secrets/tpuserve-hf-token")
    assert missing.status_code == 404 and missing.json()["error"] == {
        "code": 404, "status": "NOT_FOUND",
        "message": f"Secret [projects/{PROJECT_NUMBER}/secrets/tpuserve-hf-token] not found."}
    other = _get(sm, "v1/projects/someone-else/secrets/tpuserve-api-key").json()["error"]
    assert other["status"] == "PERMISSION_DENIED"
    assert "'secretmanager.secrets.get' denied" in other["message"]
    assert _get(sm, "v1/projects/proj-test-1/secrets/x", token=None).status_code == 401
    sm.denied.add("secretmanager.secrets.get")
    assert _get(sm, "v1/projects/proj-test-1/secrets/tpuserve-api-key").status_code == 403
    # versions:access is unchanged beside it
    sm.add_version("tpuserve-api-key", b"k")
    access = _get(sm, "v1/projects/proj-test-1/secrets/tpuserve-api-key/versions/latest:access")
    assert access.status_code == 200
    assert [c.secret for c in sm.calls] == ["tpuserve-api-key", "tpuserve-hf-token",
                                            "tpuserve-api-key", "x", "tpuserve-api-key",
                                            "tpuserve-api-key"]
