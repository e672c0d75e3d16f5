"""A refused or throttled write never silences the rest, and every retry of the boot waits at
least what the server's Retry-After asks (templates/boot/lib.sh.j2: ga, retry_after,
pause_before_retry; api.sh.j2: api_retry, api_tries; cache.sh.j2 upload_cache).

Gaps are read from the fakes' own request times and only bounded from below: a retry sooner than
the server asked is the failure (the old backoff retried after 1 s and 2 s whatever it asked).
"""

from __future__ import annotations

import time
from email.utils import formatdate
from itertools import pairwise

from werkzeug import Request

from tests.fakes.metadata import GUEST_PREFIX, throttled
from tests.render.boot.support import BOOT_STORY, Cloud

SCALE = 0.02  # Retry-After 20 s = 0.4 s here, against the 1 s backoff's 0.02 s
RETRY_AFTER_MAX_S = 60  # lib.sh.j2: a longer ask is capped


def _gap_after(times: list[tuple[float, int]], status: int) -> float:
    """Seconds from the first answer with STATUS to the request after it."""
    for (at, code), (next_at, _) in pairwise(times):
        if code == status:
            return next_at - at
    raise AssertionError(f"no {status} followed by another request in {times}")


def test_every_retry_waits_for_the_retry_after_it_was_given(cloud: Cloud) -> None:
    first = cloud.node(TPUSERVE_TIME_SCALE=str(SCALE))
    # The publish of the first node: its upload session refused once, 503 Retry-After 20.
    cloud.storage.fail_next(503, kind="upload_session", retry_after="20")
    first.run()
    assert first.attrs()["cache_publish"].startswith("published "), first.attrs()
    sessions = [(c.at, c.status) for c in cloud.storage.calls_of("upload_session")]
    assert [s for _, s in sessions] == [503, 200]
    assert _gap_after(sessions, 503) >= 20 * SCALE
    first.stop()

    node = cloud.node(TPUSERVE_TIME_SCALE=str(SCALE))
    since = time.time()
    # A guest-attribute write throttled (429 Retry-After 20), the secret's access throttled with
    # an HTTP-date two hours ahead (capped), the cache download (503 Retry-After 20).
    cloud.metadata.throttle_guest(retry_after="20", key="state")
    cloud.secrets.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded",
                            retry_after=formatdate(time.time() + 7200, usegmt=True))
    cloud.storage.fail_next(503, kind="download", retry_after="20")
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["cache"].startswith("hit "), attrs
    assert "guest attributes unavailable" not in out

    puts = [(at, s) for at, s in cloud.metadata.guest_puts("state") if at >= since]
    assert [s for _, s in puts][:2] == [429, 200]
    assert _gap_after(puts, 429) >= 20 * SCALE

    access = sorted((c.at, c.status) for c in cloud.secrets.calls if c.at >= since)
    assert [s for _, s in access][:2] == [429, 200]
    gap = _gap_after(access, 429)
    assert gap >= RETRY_AFTER_MAX_S * SCALE
    assert gap < 7200 * SCALE / 2  # capped: not the two hours asked

    downloads = [(c.at, c.status) for c in cloud.storage.calls_of("download") if c.at >= since]
    assert [s for _, s in downloads] == [503, 200]
    assert _gap_after(downloads, 503) >= 20 * SCALE


def test_one_refused_key_is_reported_once_and_every_other_key_is_written(cloud: Cloud) -> None:
    cloud.metadata.refuse_key("image")  # 400 to every value of this key
    node = cloud.node()
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready", attrs
    assert "image" not in attrs
    assert set(BOOT_STORY) - {"image"} <= set(attrs), attrs
    assert out.count("guest attribute image: value refused (HTTP 400)") == 1
    assert "guest attributes unavailable" not in out
    # A second run on the same node writes everything again, the refused key included.
    refused_before = len(cloud.metadata.guest_puts("image"))
    node.run()
    assert len(cloud.metadata.guest_puts("image")) > refused_before
    assert node.attrs()["state"] == "ready"


def test_a_write_throttled_for_good_is_given_up_and_later_writes_still_land(cloud: Cloud) -> None:
    # Every write of `secret` is throttled (429, Retry-After 1): its retries end within their
    # budget, the boot goes on and every later key is written.
    cloud.metadata.refuse_key("secret", 429, "Too Many Requests\n")
    node = cloud.node()
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and "secret" not in attrs, attrs
    assert set(BOOT_STORY) - {"secret"} <= set(attrs), attrs
    assert "guest attribute secret: not written (HTTP 429 after" in out
    assert len(cloud.metadata.guest_puts("secret")) > 1  # retried, not dropped at once


def test_a_cache_download_asked_to_wait_past_its_pause_budget_is_a_miss_at_once(
    cloud: Cloud,
) -> None:
    # api_tries: a restore's pauses stay within 30 s in all (a restore may never cost more than
    # a warm cache saves); a Retry-After of 45 s is not waited for, nor retried sooner.
    first = cloud.node()
    first.run()
    first.stop()
    node = cloud.node()
    since = time.time()
    cloud.storage.fail_next(503, kind="download", retry_after="45")
    node.run()
    attrs = node.attrs()
    assert attrs["cache"] == "miss storage answered HTTP 503", attrs
    assert attrs["state"] == "ready"
    assert [c.status for c in cloud.storage.calls_of("download") if c.at >= since] == [503]


def test_a_metadata_server_failing_every_write_costs_three_retried_values_then_one_try_each(
    cloud: Cloud,
) -> None:
    def guest_put(r: Request) -> bool:
        return r.method == "PUT" and r.path.startswith(GUEST_PREFIX)

    cloud.metadata.faults.add(guest_put, lambda: throttled(code=503), times=10**6)
    node = cloud.node()
    out = node.run()
    assert "state: ready" in out and "guest attributes unavailable" not in out
    assert node.attrs() == {}
    puts = [(at, key) for at, method, key, _ in cloud.metadata.guest_requests if method == "PUT"]
    tries: dict[str, int] = {}
    order: list[str] = []
    for _, key in puts:
        if key not in tries:
            order.append(key)
        tries[key] = tries.get(key, 0) + 1
    # boot, state (booting) and secret are retried and lost; from then on one try a value,
    # and every later phase still tries its write.
    assert order[:3] == ["boot", "state", "secret"], order
    assert all(tries[k] > 1 for k in order[:3]), tries
    assert set(BOOT_STORY) <= set(order), order
    assert out.count("not written (HTTP 503 after 1 tries)") >= len(set(BOOT_STORY)) - 3
