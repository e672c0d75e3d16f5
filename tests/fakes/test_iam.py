"""The fake IAM API's serviceAccounts.get answers as the v1 REST API does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.fakes.iam import FakeIam

TOKEN = "ya29.fake-token"


@pytest.fixture
def iam() -> Iterator[FakeIam]:
    fake = FakeIam(project="proj-test-1", access_token=TOKEN).start()
    yield fake
    fake.stop()


def _get(iam: FakeIam, path: str, token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{iam.endpoint}{path}", headers=headers, timeout=5)


def test_service_accounts_get_as_documented(iam) -> None:
    email = iam.create_account("tpuserve-node")
    assert email == "tpuserve-node@proj-test-1.iam.gserviceaccount.com"
    for project in ("proj-test-1", "-"):
        account = _get(iam, f"v1/projects/{project}/serviceAccounts/{email}").json()
        assert account["name"] == f"projects/proj-test-1/serviceAccounts/{email}"
        assert account["email"] == email and account["projectId"] == "proj-test-1"
    gone = _get(iam, "v1/projects/proj-test-1/serviceAccounts/x@proj-test-1.iam."
                     "gserviceaccount.com")
    assert gone.status_code == 404 and gone.json()["error"]["status"] == "NOT_FOUND"
    other = _get(iam, f"v1/projects/someone-else/serviceAccounts/{email}").json()["error"]
    assert other["code"] == 403 and "'iam.serviceAccounts.get' denied" in other["message"]
    assert _get(iam, f"v1/projects/-/serviceAccounts/{email}", token=None).status_code == 401
    iam.denied.add("iam.serviceAccounts.get")
    assert _get(iam, f"v1/projects/-/serviceAccounts/{email}").status_code == 403
