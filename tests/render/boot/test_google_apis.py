"""The lib part: guest attributes switched off, transient faults of every Google API."""

from __future__ import annotations

import time

from tests.render.boot.support import (
    Cloud,
)


def test_a_boot_goes_on_when_guest_attributes_are_disabled(cloud: Cloud) -> None:
    cloud.metadata.guest_attributes_enabled = False  # GCE's default without the metadata key
    d = cloud.deployment
    node = cloud.node(d.model_copy(update={"stack": d.stack.model_copy(
        update={"max_run_hours": 0})}))
    out = node.run()
    assert out.count("guest attributes unavailable (HTTP 403;") == 1
    assert "state: ready" in out and "cache_publish: published" in out
    assert cloud.metadata.guest_attributes == {}


def test_transient_faults_of_every_google_api_the_boot_calls_are_retried(cloud: Cloud) -> None:
    d = cloud.deployment
    first = cloud.node()
    first.run()  # publishes the cache the next node restores
    first.stop()
    node = cloud.node()
    cloud.secrets.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded", retry_after="2")
    cloud.secrets.faults.html(lambda r: ":access" in r.path, 502)
    cloud.secrets.faults.drop(lambda r: ":access" in r.path)
    cloud.metadata.faults.drop(lambda r: r.path.endswith("/service-accounts/default/token"))
    cloud.storage.fail_next(503, kind="download", retry_after="1")
    cloud.storage.fail_next(0, kind="download", drop=True)
    since = time.time()
    node.run()
    attrs = node.attrs()
    assert attrs["state"] == "ready" and attrs["secret"].startswith("fetched api_key_sha256=")
    assert attrs["cache"].startswith("hit "), attrs["cache"]
    statuses = [c.status for c in cloud.secrets.calls_for(d.hf_token_secret_id)
                if c.at >= since]
    assert statuses[:4] == [429, 502, 500, 200]  # 500: the dropped one, as recorded
    downloads = [c.status for c in cloud.storage.calls_of("download") if c.at >= since]
    assert downloads == [503, 500, 200]
