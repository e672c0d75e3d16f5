"""The containers part: image pulls, local builds, a server that dies."""

from __future__ import annotations

import hashlib
import json

from tests.render.boot.support import (
    FAST,
    IMAGE,
    Cloud,
    cache_object,
)
from tpuserve.settings.sections import PROXY_IMAGE


def test_image_pulls_are_retried_and_a_local_build_is_a_fallback_keyed_on_its_id(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    (node.docker_state / "pull_failures").write_text("2")
    node.run()
    assert len(node.docker_commands("pull")) == 4  # 2 failures, then vllm and nginx
    assert node.attrs()["image"] == \
        f"pulled vllm/vllm-tpu:nightly {PROXY_IMAGE} digest={cloud.digest()}"

    node.stop()
    (node.root / "run/tpuserve/secrets/hf_token").unlink()  # as after a reboot: start afresh
    (node.docker_state / "pull_failures").write_text("100000")
    # The local copy is a build of its own (docker build -t): no repo digest, only an id.
    images_file = node.docker_state / "images.json"
    images = json.loads(images_file.read_text())
    image_id = "sha256:" + hashlib.sha256(b"a local build").hexdigest()
    images[IMAGE] = {"Id": image_id, "RepoTags": [IMAGE], "RepoDigests": []}
    images_file.write_text(json.dumps(images))
    node.env.update(FAST)
    out = node.run()
    attrs = node.attrs()
    assert attrs["image"] == \
        f"local vllm/vllm-tpu:nightly {PROXY_IMAGE} id={image_id} (no repo digest)"
    assert f"has no repo digest (built locally?): keying the compile cache on its id {image_id}" \
        in out
    assert attrs["state"] == "ready"
    assert node.container("vllm-gemma4")["image"] == image_id
    # Another build, another cache: nothing restored from the pulled build's object.
    own_object = cache_object(node.cache_key, image_id)
    assert attrs["cache"] == f"miss no object gs://{cloud.deployment.cache_bucket}/{own_object}"
    assert own_object in cloud.storage.objects


def test_an_image_that_cannot_be_pulled_fails_the_boot(cloud: Cloud) -> None:
    node = cloud.node(**FAST)
    (node.docker_state / "pull_failures").write_text("100000")
    node.run(expect_rc=1)
    assert node.attrs()["state"] == "failed could not pull vllm/vllm-tpu:nightly"


def test_a_server_that_dies_ends_failed_with_the_reason(cloud: Cloud) -> None:
    node = cloud.node(FAKE_VLLM_CRASH="1")
    node.run(expect_rc=1)
    attrs = node.attrs()
    assert attrs["state"].startswith("failed vLLM exited: ERROR [core.py] "
                                     "RuntimeProgramAllocationFailure")
    assert "memory" in attrs and "health" not in attrs and "cache_publish" not in attrs
