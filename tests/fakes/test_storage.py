"""The fake Cloud Storage the boot's cache part talks to: customTime and resumable uploads, as
documented."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from tests.fakes.storage import FakeStorage


@pytest.fixture
def storage() -> Iterator[FakeStorage]:
    fake = FakeStorage(bucket="tpuserve-test-cache", access_token="ya29.fake-token").start()
    yield fake
    fake.stop()


def _storage_patch(storage: FakeStorage, name: str, body: object,
                   content_type: str = "application/json") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", storage.server.port, timeout=5)
    path = f"/storage/v1/b/{storage.bucket}/o/{name.replace('/', '%2F')}"
    conn.request("PATCH", path, json.dumps(body), {
        "Authorization": f"Bearer {storage.access_token}", "Content-Type": content_type})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    return resp.status, answer


def test_the_fake_storage_patches_custom_time_as_documented(storage: FakeStorage) -> None:
    name = "xla-cache/k-0123456789ab.tar.gz"
    assert _storage_patch(storage, name, {"customTime": "2030-01-01T00:00:00Z"})[0] == 404
    storage.put(name, b"x")
    status, resource = _storage_patch(storage, name, {"customTime": "2030-01-01T00:00:00.5Z"})
    assert status == 200 and resource["customTime"] == "2030-01-01T00:00:00.5Z"
    assert resource["metageneration"] == "2"
    refused = [
        ({"customTime": "2029-12-31T23:59:59Z"}, "application/json"),  # moves backwards
        ({"customTime": None}, "application/json"),  # removes it
        ({"customTime": "2030-01-02"}, "application/json"),  # not an RFC 3339 date-time
        ({"custom_time": "2031-01-01T00:00:00Z"}, "application/json"),  # unknown field
        ({"contentType": "text/plain"}, "application/json"),  # not supported by the fake
        ({"customTime": "2031-01-01T00:00:00Z"}, "application/x-www-form-urlencoded"),
    ]
    for body, content_type in refused:
        status, answer = _storage_patch(storage, name, body, content_type)
        assert status == 400 and answer["error"]["code"] == 400, body
        assert answer["error"]["errors"][0]["reason"] in ("invalid", "parseError")
    assert storage.objects[name].custom_time == "2030-01-01T00:00:00.5Z"
    storage.put(name, b"y")  # a new generation starts without one
    assert storage.objects[name].custom_time is None


def _storage_call(storage: FakeStorage, method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", storage.server.port, timeout=5)
    conn.request(method, path, body, {"Authorization": f"Bearer {storage.access_token}",
                                      **(headers or {})})
    resp = conn.getresponse()
    answer = (resp.status, dict(resp.getheaders()), resp.read())
    conn.close()
    return answer


def test_the_fake_storage_speaks_the_resumable_upload_protocol(storage: FakeStorage) -> None:
    name = "xla-cache/k-0123456789ab.tar.gz"
    base = f"/upload/storage/v1/b/{storage.bucket}/o"
    opened = f"{base}?uploadType=resumable&name={name.replace('/', '%2F')}&ifGenerationMatch=0"
    status, headers, _ = _storage_call(storage, "POST", opened, b"{}",
                                       {"Content-Type": "application/json"})
    assert status == 200
    session = headers["Location"].split(str(storage.server.port), 1)[1]
    assert "upload_id=" in session
    # Chunks must continue where the last one ended; a short one is refused.
    assert _storage_call(storage, "PUT", session, b"abc",
                         {"Content-Range": "bytes 1-3/6"})[0] == 400
    status, headers, _ = _storage_call(storage, "PUT", session, b"abc",
                                       {"Content-Range": "bytes 0-2/*"})
    assert status == 308 and headers["Range"] == "bytes=0-2"
    assert _storage_call(storage, "PUT", session, b"",
                         {"Content-Range": "bytes */*"})[0] == 308
    # Another writer creates the object meanwhile: ifGenerationMatch=0 no longer holds.
    storage.put(name, b"theirs")
    status, _, body = _storage_call(storage, "PUT", session, b"def",
                                    {"Content-Range": "bytes 3-5/6"})
    assert status == 412 and json.loads(body)["error"]["errors"][0]["reason"] == "conditionNotMet"
    assert storage.objects[name].data == b"theirs"
    # Over the live generation, it is accepted.
    generation = storage.objects[name].generation
    status, headers, _ = _storage_call(
        storage, "POST", f"{base}?uploadType=resumable&name={name}&ifGenerationMatch={generation}")
    session = headers["Location"].split(str(storage.server.port), 1)[1]
    status, _, body = _storage_call(storage, "PUT", session, b"mine")
    assert status == 200 and json.loads(body)["generation"] == str(generation + 1)
    # Shapes the real API refuses.
    assert _storage_call(storage, "PUT", f"{base}?uploadType=resumable&upload_id=nope", b"x",
                         )[0] == 404
    assert _storage_call(storage, "POST", f"{base}?name={name}", b"x",
                         {"Content-Type": "application/gzip"})[0] == 400  # no uploadType
    assert _storage_call(storage, "POST", f"{base}?uploadType=resumable&name={name}"
                         "&ifGenerationMatch=1", b"")[0] == 412
    assert _storage_call(storage, "POST", f"{base}?uploadType=resumable&name={name}", b"[1]",
                         {"Content-Type": "application/json"})[0] == 400


def test_the_fake_storage_answers_buckets_get_as_documented(storage: FakeStorage) -> None:
    storage.add_bucket("proj-tpuserve-weights")
    for bucket in (storage.bucket, "proj-tpuserve-weights"):
        status, _, body = _storage_call(storage, "GET", f"/storage/v1/b/{bucket}")
        resource = json.loads(body)
        assert status == 200 and resource["kind"] == "storage#bucket"
        assert resource["name"] == resource["id"] == bucket
    status, _, body = _storage_call(storage, "GET", "/storage/v1/b/nope-bucket")
    error = json.loads(body)["error"]
    assert status == 404 and error["errors"][0]["reason"] == "notFound"
    assert error["message"] == "The specified bucket does not exist."
    assert _storage_call(storage, "DELETE", f"/storage/v1/b/{storage.bucket}")[0] == 405
    storage.denied.add("storage.buckets.get")
    status, _, body = _storage_call(storage, "GET", f"/storage/v1/b/{storage.bucket}")
    assert status == 403 and "Permission 'storage.buckets.get' denied" in body.decode()
    assert [c.kind for c in storage.calls] == ["bucket"] * 5
