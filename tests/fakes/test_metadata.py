"""The fake metadata server's "waiting for updates" protocol (wait_for_change, last_etag,
timeout_sec, the ETag header), answered the way the real one documents it."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import suppress

import pytest

from tests.fakes.metadata import ATTRIBUTES_PREFIX, FakeMetadata

KEY = "startup-script"


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata(access_token="ya29.fake-token", attributes={KEY: "#!/bin/bash\n"}).start()
    yield fake
    fake.stop()


def _get(metadata: FakeMetadata, query: str = "", *, key: str = KEY,
         headers: dict[str, str] | None = None) -> tuple[int, str, str | None, float]:
    """(status, body, ETag header, seconds taken) of one GET of an instance attribute."""
    conn = http.client.HTTPConnection("127.0.0.1", metadata.server.port, timeout=10)
    started = time.monotonic()
    conn.request("GET", ATTRIBUTES_PREFIX + key + (f"?{query}" if query else ""),
                 headers={"Metadata-Flavor": "Google"} if headers is None else headers)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body, resp.getheader("ETag"), time.monotonic() - started


def test_every_attribute_answer_carries_an_etag_that_changes_with_each_write(
    metadata: FakeMetadata,
) -> None:
    status, body, etag, _ = _get(metadata)
    assert (status, body) == (200, "#!/bin/bash\n")
    assert etag is not None and len(etag) == 16 and etag == metadata.etag(KEY)
    assert _get(metadata)[2] == etag  # stable while nothing is written
    metadata.touch_attribute(KEY)  # the same content written again: a new ETag
    touched = _get(metadata)
    assert touched[1] == body and touched[2] not in (None, etag)
    assert _get(metadata, key="absent")[0] == 404


def test_a_stale_last_etag_answers_at_once_and_the_current_one_waits_for_the_timeout(
    metadata: FakeMetadata,
) -> None:
    etag = metadata.etag(KEY)
    status, body, got, took = _get(metadata, "wait_for_change=true&last_etag=0&timeout_sec=5")
    assert (status, body, got) == (200, "#!/bin/bash\n", etag) and took < 1
    status, body, got, took = _get(metadata, f"wait_for_change=true&last_etag={etag}"
                                             "&timeout_sec=1")
    # Nothing changed: after timeout_sec, the current value and ETag.
    assert (status, body, got) == (200, "#!/bin/bash\n", etag) and 0.9 < took < 3
    # wait_for_change=false (the default) never waits, whatever the ETag.
    assert _get(metadata, f"wait_for_change=false&last_etag={etag}&timeout_sec=5")[3] < 1


def test_a_change_wakes_a_waiting_request_with_the_new_value(metadata: FakeMetadata) -> None:
    etag = metadata.etag(KEY)
    answers: list[tuple[int, str, str | None, float]] = []
    waiter = threading.Thread(target=lambda: answers.append(
        _get(metadata, f"wait_for_change=true&last_etag={etag}&timeout_sec=30")))
    waiter.start()
    time.sleep(0.2)
    assert answers == []  # still held
    metadata.set_attribute(KEY, "#!/bin/bash\necho new\n")
    waiter.join(5)
    status, body, new_etag, took = answers[0]
    assert (status, body) == (200, "#!/bin/bash\necho new\n")
    assert new_etag == metadata.etag(KEY) != etag and took < 5
    # Without last_etag a waiting request holds until the next change.
    waiter = threading.Thread(target=lambda: answers.append(
        _get(metadata, "wait_for_change=true&timeout_sec=30")))
    waiter.start()
    time.sleep(0.2)
    assert len(answers) == 1
    metadata.set_attribute(KEY, None)  # deleted while waited on: a 404
    waiter.join(5)
    assert answers[1][0] == 404


def test_the_fake_refuses_what_the_real_server_refuses(metadata: FakeMetadata) -> None:
    for query in ("wait_for_change=true&timeout_sec=1.5", "wait_for_change=true&timeout_sec=x",
                  "wait_for_change=true&timeout_sec=-1", "wait_for_change=yes"):
        assert _get(metadata, query)[0] == 400, query
    assert _get(metadata, headers={})[0] == 403  # no Metadata-Flavor: Google
    assert _get(metadata, headers={"Metadata-Flavor": "Google",
                                   "X-Forwarded-For": "10.0.0.1"})[0] == 403
    polls = metadata.attribute_polls(KEY)
    assert [status for _, _, status in polls] == [400, 400, 400, 400]


def test_stopping_the_fake_ends_requests_that_wait(metadata: FakeMetadata) -> None:
    done = threading.Event()

    def wait() -> None:
        with suppress(OSError, http.client.HTTPException):
            _get(metadata, "wait_for_change=true&timeout_sec=60")
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    time.sleep(0.2)
    started = time.monotonic()
    metadata.stop()
    assert done.wait(5) and time.monotonic() - started < 5
