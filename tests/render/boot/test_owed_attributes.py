"""A guest-attribute value given up after its retries is owed, and written once the metadata
server takes writes again (templates/boot/lib.sh.j2: ga, ga_owe, ga_flush; boot_helper.py:
Watcher.flush_owed). Before, a throttle outlasting GA_RETRY_S at the end of a boot lost `state
ready` for good: the node served while `state` said `booting` until its next boot."""

from __future__ import annotations

import time
from itertools import pairwise

from werkzeug import Request

from tests.fakes.metadata import GUEST_PREFIX, throttled
from tests.render.boot.support import Cloud, wait_for

OWED = "run/tpuserve/ga-owed"


def test_a_ready_state_lost_to_a_throttle_outlasting_the_boot_is_written_by_the_watcher(
    cloud: Cloud,
) -> None:
    # From the boot's `health` report on, every guest-attribute write is throttled (429,
    # Retry-After 1) until the boot has ended: far longer than GA_RETRY_S, so `health`,
    # `state ready` and `cache_publish` are given up. `image` is refused (400) throughout.
    storm = {"on": False, "over": False}

    def throttled_put(r: Request) -> bool:
        if r.method != "PUT" or not r.path.startswith(GUEST_PREFIX):
            return False
        if r.path.endswith("/health") and not storm["over"]:
            storm["on"] = True
        return storm["on"]

    cloud.metadata.faults.add(throttled_put, lambda: throttled("1"), times=10**6)
    cloud.metadata.refuse_key("image")
    node = cloud.node()
    out = node.run()
    assert storm["on"], "the storm never started"
    assert "state: ready" in out
    assert "guest attribute state: not written (HTTP 429" in out
    assert node.attrs()["state"] == "booting", node.attrs()  # what main left for good
    assert (node.root / OWED / "state").read_text().endswith(" ready")
    # The watcher runs on meanwhile, its flushes (oldest first: `health`) throttled too; then
    # the storm passes.
    wait_for(lambda: "guest attribute health: owed value not written (HTTP 429)"
             in node.watch_log.read_text(), "the watcher to try the owed values", timeout=60)
    ended = time.time()
    storm["on"], storm["over"] = False, True

    wait_for(lambda: node.attrs().get("state") == "ready", "the owed state to land", timeout=60)
    # The rest owed lands too (one flush writes them one after another, oldest first).
    wait_for(lambda: node.attrs().get("cache_publish", "").startswith("published "),
             "the owed cache_publish to land", timeout=60)
    attrs = node.attrs()
    assert "health" in attrs, attrs
    landed = [at for at, status in cloud.metadata.guest_puts("state") if status == 200]
    assert landed[-1] > ended  # written after the boot: by the watcher
    assert "guest attribute state: owed value written" in node.watch_log.read_text()
    wait_for(lambda: not any((node.root / OWED).iterdir()), "every owed value to be settled")

    # The refused key is reported once and never owed: nothing writes it again after the boot.
    assert out.count("guest attribute image: value refused (HTTP 400)") == 1
    assert "image" not in attrs
    assert not [at for at, _ in cloud.metadata.guest_puts("image") if at > ended]
    assert "guest attribute image" not in node.watch_log.read_text()


def test_the_watcher_spaces_its_owed_writes_by_the_retry_after_it_was_given(cloud: Cloud) -> None:
    # Every write from `health` on is throttled with Retry-After 50 s, longer than the watcher's
    # own backoff (at most 30 s): each try of the watcher after a 429 waits at least 50 s
    # (scaled); an ask of two hours is capped at 60 s.
    scale = 0.001  # the node's TPUSERVE_TIME_SCALE (support.Node)
    asked = {"retry_after": "50"}
    storm = {"on": False, "over": False}

    def throttled_put(r: Request) -> bool:
        if r.method != "PUT" or not r.path.startswith(GUEST_PREFIX):
            return False
        if r.path.endswith("/health") and not storm["over"]:
            storm["on"] = True
        return storm["on"]

    cloud.metadata.faults.add(throttled_put, lambda: throttled(asked["retry_after"]),
                              times=10**6)
    node = cloud.node()
    node.run()
    booted = time.time()

    def watcher_puts() -> list[tuple[float, int]]:
        return [(at, status) for at, method, _, status in cloud.metadata.guest_requests
                if method == "PUT" and at > booted]

    wait_for(lambda: len(watcher_puts()) >= 4, "four throttled tries of the watcher", timeout=60)
    asked["retry_after"] = "7200"
    capped_from = len(watcher_puts())
    wait_for(lambda: len(watcher_puts()) >= capped_from + 3, "three more tries", timeout=60)
    storm["on"], storm["over"] = False, True
    wait_for(lambda: node.attrs().get("state") == "ready", "the owed state to land", timeout=60)

    puts = watcher_puts()
    gaps = [b[0] - a[0] for a, b in pairwise(puts) if a[1] == 429]
    assert all(g >= 50 * scale for g in gaps[: capped_from - 1]), gaps
    assert all(g < 7200 * scale / 2 for g in gaps), gaps  # capped: not the two hours asked
