"""The provider-expander table (tests/gcloud/provider_requests.py) and the field comparison
(tests/gcloud/field_diff.py) that the gcloud comparison rests on: no gcloud needed."""

from __future__ import annotations

from typing import Any

from tests.gcloud import provider_requests as pr
from tests.gcloud.field_diff import compare


def _vm(synthesized: dict[str, dict[str, Any]], stack: str) -> dict[str, Any]:
    return synthesized[stack]["resource"]["google_tpu_v2_vm"]["tpu_node"]


def test_every_attribute_the_stacks_set_is_mapped(
        synthesized: dict[str, dict[str, Any]]) -> None:
    """A new attribute on a node or a pool fails here until the table maps it (and the
    gcloud comparison then sees it)."""
    for stack in ("spot", "ondemand"):
        assert pr.unmapped(_vm(synthesized, stack), pr.TPU_V2_VM) == set(), stack
    pools = synthesized["fleet"]["resource"]["google_container_node_pool"]
    assert {"system_pool", "tpu_pool_spot", "tpu_pool_flex"} <= set(pools)
    for name, pool in pools.items():
        assert pr.unmapped(pool, pr.NODE_POOL) == set(), name


def test_unmapped_names_an_attribute_no_row_maps(
        synthesized: dict[str, dict[str, Any]]) -> None:
    vm = {**_vm(synthesized, "spot"), "data_disks": [{"source_disk": "d"}],
          "network_config": {**_vm(synthesized, "spot")["network_config"], "queue_count": 2}}
    assert pr.unmapped(vm, pr.TPU_V2_VM) == {"data_disks.source_disk",
                                             "network_config.queue_count"}


def test_terraform_string_escapes_reach_the_provider_as_literals() -> None:
    assert pr.unescape({"a": ["$${X} %%{ if }", 1]}) == {"a": ["${X} %{ if }", 1]}


def test_vm_body_follows_the_expanders(synthesized: dict[str, dict[str, Any]]) -> None:
    resource = _vm(synthesized, "spot")
    provider = synthesized["spot"]["provider"]["google-beta"][0]
    req = pr.tpu_v2_vm_request(resource, provider)
    assert req.path == (f"/v2alpha1/projects/{provider['project']}/locations/"
                        f"{resource['zone']}/nodes")
    assert req.query == {"nodeId": resource["name"]}
    # expandTpuV2VmSchedulingConfig sends preemptible and reserved always, spot when true.
    assert req.body["schedulingConfig"] == {"preemptible": False, "reserved": False,
                                            "spot": True}
    assert req.body["networkConfig"]["canIpForward"] is False
    assert req.body["labels"]["managed_by"] == "tpuserve"
    assert req.body["labels"][pr.ATTRIBUTION_LABEL[0]] == "true"
    script = req.body["metadata"]["startup-script"]
    assert "$${" in resource["metadata"]["startup-script"] and "$${" not in script
    ondemand = pr.tpu_v2_vm_request(_vm(synthesized, "ondemand"), provider)
    assert ondemand.body["schedulingConfig"] == {"preemptible": False, "reserved": False}


def test_pool_body_follows_the_expanders(synthesized: dict[str, dict[str, Any]]) -> None:
    fleet = synthesized["fleet"]
    pool = fleet["resource"]["google_container_node_pool"]["tpu_pool_flex"]
    req = pr.node_pool_request(pool, fleet["provider"]["google-beta"][0], "c")
    np = req.body["nodePool"]
    assert req.path.endswith(f"/locations/{pool['location']}/clusters/c/nodePools")
    # ForceSendFields: the four counts go out even at zero; InitialNodeCount 0 does not.
    assert set(np["autoscaling"]) == {"enabled", "minNodeCount", "maxNodeCount",
                                      "totalMinNodeCount", "totalMaxNodeCount",
                                      "locationPolicy"}
    assert "initialNodeCount" not in np
    assert np["management"] == {"autoUpgrade": True}  # autoRepair false: omitempty
    assert np["config"]["flexStart"] is True
    assert np["config"]["taints"][0]["effect"] == "NO_SCHEDULE"


def test_compare_passes_equal_and_zero_valued_fields() -> None:
    out = compare({"a": 1, "b": {"c": False}, "l": [{"x": 1}]},
                  {"a": 1, "z": 0, "l": [{"x": 1}]}, differs={}, ours_only={})
    assert out.unexplained == [] and out.stale == []
    assert out.equal == ["a", "l.0.x"] and out.zero_default == ["b.c", "z"]


def test_compare_fails_an_unexplained_difference_and_a_stale_reason() -> None:
    out = compare({"a": 1, "g": 2, "l": [{"x": 1}]}, {"a": 2, "o": 3, "l": [{"x": 2}]},
                  differs={"g": "why", "gone": "no longer sent"}, ours_only={})
    assert out.unexplained == ["a: gcloud 1, ours 2", "l.0.x: gcloud 1, ours 2",
                               "o: gcloud: absent, ours 3"]
    assert out.explained == {"g": "gcloud 2, ours absent: why"}
    assert out.stale == ["gone"]


def test_compare_reason_for_an_object_covers_its_fields() -> None:
    out = compare({}, {"labels": {"k": "v"}}, differs={}, ours_only={"labels": "ours"})
    assert out.explained == {"labels.k": 'gcloud absent, ours "v": ours'}
    assert out.unexplained == [] and out.stale == []
