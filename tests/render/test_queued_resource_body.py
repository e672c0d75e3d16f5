"""The flex queued resource's request body: built from the config, labelled, checked and
compared, with no I/O (tpuserve.render.queued_resource_body)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.gcp.tpu_support import REF, body
from tpuserve.render.queued_resource_body import (
    GENERATION_LABEL,
    BodyError,
    body_metadata,
    body_without_metadata,
    build_body,
    check_body,
    spec_differences,
    with_generation,
)
from tpuserve.settings import Deployment, from_raw, load_raw

SCRIPT = '#!/bin/bash\nset -euo pipefail\necho "${HOME:-/root}" %{x}\n'


def flex_deployment(**stack: Any) -> Deployment:
    raw = load_raw(environ={})
    raw["stacks"] = {"flex": {**raw["stacks"]["flex"], **stack}}
    return from_raw(raw).deployments["flex"]

def test_build_body_is_the_documented_flex_start_shape() -> None:
    d = flex_deployment()
    assert build_body(d, SCRIPT) == {
        "provisioningModel": "FLEX_START",
        "runDuration": {"maxRunDuration": "14400s"},
        "tpu": {"nodeSpec": [{
            "parent": "projects/tpuserve-placeholder/locations/us-west4-a",
            "nodeId": "tpuserve-flex",
            "node": {
                "acceleratorType": "v5litepod-1",
                "runtimeVersion": "v2-alpha-tpuv5-lite",
                # The deployment's own network and subnet.
                "networkConfig": {"network": "tpuserve-net",
                                  "subnetwork": "tpuserve-net-us-west4",
                                  "enableExternalIps": True},
                "shieldedInstanceConfig": {"enableSecureBoot": True},
                "metadata": {"startup-script": SCRIPT, "enable-guest-attributes": "TRUE",
                             "enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"},
                "serviceAccount": {
                    "email": "tpuserve-node@tpuserve-placeholder.iam.gserviceaccount.com",
                    "scope": ["https://www.googleapis.com/auth/cloud-platform"],
                },
                "tags": ["tpuserve-flex"],
                "labels": {"stack": "flex", "model": "google-gemma-4-e2b-it",
                           "provisioning-model": "flex", "managed-by": "tpuserve",
                           "deployment": "tpuserve"},
            },
        }]},
    }

def test_build_body_durations_and_queueing_policy() -> None:
    d = flex_deployment(max_run_duration="1h30m", valid_until_duration="2h")
    out = build_body(d, SCRIPT)
    assert out["runDuration"] == {"maxRunDuration": "5400s"}
    assert out["queueingPolicy"] == {"validUntilDuration": "7200s"}

def test_build_body_refuses_other_stacks() -> None:
    spot = from_raw(load_raw(environ={})).deployments["spot"]
    with pytest.raises(ValueError, match="flex stack only"):
        build_body(spot, SCRIPT)

def test_generation_label() -> None:
    token = "19700101-000000-abcd"
    labelled = with_generation(body(), token)
    assert labelled["tpu"]["nodeSpec"][0]["node"]["labels"][GENERATION_LABEL] == token
    assert GENERATION_LABEL not in body()["tpu"]["nodeSpec"][0]["node"]["labels"]  # a copy
    with pytest.raises(ValueError, match="label value"):
        with_generation(body(), "Not A Label")

@pytest.mark.parametrize(("mutate", "match"), [
    (lambda b: b.pop("tpu"), "nodeSpec must be a non-empty list"),
    (lambda b: b["tpu"]["nodeSpec"][0].pop("nodeId"), "nodeId is required"),
    (lambda b: b["tpu"]["nodeSpec"][0].update(parent="projects/x/locations/y"),
     "must be 'projects/proj-test-1/locations/us-west4-a'"),
])
def test_check_body_rejects_bad_input(mutate: Callable[[dict], Any], match: str) -> None:
    b = body()
    mutate(b)
    with pytest.raises(BodyError, match=match):
        check_body(REF.parent, b)

def test_spec_differences() -> None:
    live = body()
    live["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["network"] = (
        "projects/proj-test-1/global/networks/default")  # the API may answer with the URL
    live["state"] = {"state": "ACTIVE"}  # output-only fields are ignored
    assert spec_differences(body(), live) == []
    mine = flex_deployment()
    wanted = build_body(mine, SCRIPT)
    answered = build_body(mine, SCRIPT)
    answered["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["subnetwork"] = (
        "projects/tpuserve-placeholder/regions/us-west4/subnetworks/tpuserve-net-us-west4")
    assert spec_differences(wanted, answered) == []
    other = body(max_run_duration="7200s", startup_script="#!/bin/bash\n" + "x" * 100)
    diffs = spec_differences(body(), other)
    assert diffs[0] == "runDuration.maxRunDuration: '7200s', want '14400s'"
    assert diffs[1].startswith("tpu.nodeSpec[0].node.metadata.startup-script: <112 chars, sha256")


def test_body_metadata_and_the_rest_split_the_body() -> None:
    b = body(startup_script="#!/bin/bash\necho v2\n")
    assert body_metadata(b) == {"startup-script": "#!/bin/bash\necho v2\n"}
    rest = body_without_metadata(b)
    assert "metadata" not in rest["tpu"]["nodeSpec"][0]["node"]
    assert b["tpu"]["nodeSpec"][0]["node"]["metadata"]  # a copy: the body is untouched
    rest["tpu"]["nodeSpec"][0]["node"]["metadata"] = body_metadata(b)
    assert rest == b  # nothing else was taken out
    # A new boot script changes the metadata only; any other change shows in the rest.
    assert body_without_metadata(body(startup_script="other")) == body_without_metadata(b)
    assert body_without_metadata(body(max_run_duration="3600s")) != body_without_metadata(b)
    del b["tpu"]["nodeSpec"][0]["node"]["metadata"]
    assert body_metadata(b) == {} and body_without_metadata(b) == b
