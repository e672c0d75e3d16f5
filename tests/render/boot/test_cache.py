"""The compile-cache part: warm restore, damaged objects, outages, stalls, lost publish races."""

from __future__ import annotations

import gzip
import os
import re
import tarfile
from io import BytesIO

import pytest

from tests.render.boot.support import (
    FAST,
    NAMESPACE,
    Cloud,
    archive,
)


def test_a_warm_boot_on_a_new_node_restores_before_start_and_does_not_publish(
    cloud: Cloud,
) -> None:
    first = cloud.node()
    first.run()
    first.stop()
    object_name = cloud.cache_object(first)
    published = cloud.storage.objects[object_name].generation
    published_custom_time = cloud.custom_time(object_name)

    node = cloud.node()  # a new node (preemption, recreate): empty disk, same bucket
    node.run()
    attrs = node.attrs()
    assert re.fullmatch(r"hit object_bytes=\d+ files=6 bytes=\d+", attrs["cache"])
    hits = [c for c in cloud.storage.calls_of("download") if c.status == 200]
    assert len(hits) == 1 and hits[0].at < node.run_time("vllm-gemma4")
    vllm_log = (node.docker_state / "containers/vllm-gemma4.log").read_text()
    assert "Loaded 6 compiled programs" in vllm_log
    touched = cloud.custom_time(object_name)
    assert attrs["cache_publish"] == \
        f"unchanged {attrs['cache'].split(' ', 2)[2]} custom_time={touched}"
    assert len(cloud.storage.calls_of("upload")) == 1  # the first node's only
    assert cloud.storage.objects[object_name].generation == published
    # The hit restarted the object's expiry clock, once /health answered.
    [patch] = [c for c in cloud.storage.calls_of("patch") if c.at > hits[0].at]
    health = next(w.at for w in cloud.metadata.writes_in(NAMESPACE) if w.key == "health")
    assert patch.name == object_name and patch.status == 200 and patch.at > health
    assert touched > published_custom_time


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "not a tar"])
def test_a_damaged_cache_object_is_a_miss_and_the_boot_goes_on(cloud: Cloud, damage: str) -> None:
    node = cloud.node()
    good = archive({"xla_cache/jit_a-cache": os.urandom(4096)})
    data = {
        "corrupt": os.urandom(3000),
        "truncated": good[: len(good) // 2],
        "not a tar": gzip.compress(b"plain text, not an archive"),
    }[damage]
    cloud.storage.put(cloud.cache_object(node), data)
    node.run()
    attrs = node.attrs()
    reason = {"corrupt": "corrupt or partial object", "truncated": "corrupt or partial object",
              "not a tar": "is not a tar archive of the cache"}[damage]
    assert attrs["cache"].startswith("miss ") and reason in attrs["cache"], attrs["cache"]
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith("published")  # the cold compile replaced it
    stored = cloud.storage.objects[cloud.cache_object(node)]
    with tarfile.open(fileobj=BytesIO(stored.data)) as tar:
        assert len(tar.getmembers()) > 6
    assert stored.custom_time is not None  # the new generation started without one


def test_a_storage_outage_is_a_miss(cloud: Cloud) -> None:
    cloud.storage.outage = True
    node = cloud.node(**FAST)  # the upload's 600 s retry budget
    node.run()
    attrs = node.attrs()
    assert attrs["cache"] == "miss storage answered HTTP 503"
    assert attrs["state"] == "ready"
    # Nothing in the bucket to keep alive: no customTime to set.
    assert attrs["cache_publish"] == "failed upload: HTTP 503 backendError"
    assert len(cloud.storage.calls_of("other")) > 2  # retried with backoff, then gave up


def test_a_storage_timeout_is_a_miss_and_the_boot_goes_on(cloud: Cloud) -> None:
    cloud.storage.download_delay = 1.3  # beyond the 1 s floor of every scaled timeout
    node = cloud.node()
    node.run()
    attrs = node.attrs()
    assert attrs["cache"].startswith("miss download stalled or timed out (under 1048576 B/s")
    assert len(cloud.storage.calls_of("download")) == 1  # a timeout is a miss, not retried
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith("published")


def test_a_stalled_download_is_abandoned_as_a_miss_and_the_publish_replaces_that_generation(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    name = cloud.cache_object(node)
    cloud.storage.put(name, archive({"xla_cache/jit_a-cache": os.urandom(256 * 1024)}))
    stalled_generation = cloud.storage.objects[name].generation
    cloud.storage.download_stall = 30  # half the bytes, then nothing: far beyond the window
    out = node.run()
    attrs = node.attrs()
    assert attrs["cache"].startswith("miss download stalled or timed out"), attrs["cache"]
    assert len(cloud.storage.calls_of("download")) == 1  # a stall is not waited out again
    assert attrs["state"] == "ready"
    # The boot knew which generation it failed to read, and published over exactly that one.
    assert attrs["cache_publish"].startswith("published ")
    assert cloud.storage.objects[name].generation > stalled_generation
    assert "cache: cache:" not in out and "cache: miss download stalled" in out


def test_a_node_never_replaces_a_cache_another_node_published_meanwhile(cloud: Cloud) -> None:
    node = cloud.node()
    name = cloud.cache_object(node)
    theirs = archive({"xla_cache/jit_theirs-cache": b"compiled elsewhere"})
    # Another node finishes its publish just before this one's upload is finalized.
    cloud.storage.before_finalize.append(lambda: cloud.storage.put(name, theirs))
    out = node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready"
    assert attrs["cache_publish"].startswith(
        f"superseded another node published gs://{cloud.deployment.cache_bucket}/{name} "
        "meanwhile custom_time="), attrs["cache_publish"]
    assert cloud.storage.objects[name].data == theirs  # kept, not silently replaced
    assert [c.status for c in cloud.storage.calls_of("upload")] == [412]
    assert "(another node published meanwhile): kept theirs, not replaced" in out


def test_a_failed_upload_reads_as_one_clean_guest_attribute(cloud: Cloud) -> None:
    # The front end's HTML page (no JSON error, no status word) on every upload try.
    cloud.storage.fail_next(502, kind="upload_session", times=10_000, html=True)
    node = cloud.node()
    node.run()
    attrs = node.attrs()
    assert attrs["cache_publish"] == "failed upload: HTTP 502"  # no trailing space
    assert len(cloud.storage.calls_of("upload_session")) > 1  # retried, then given up
