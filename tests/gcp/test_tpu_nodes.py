"""The TPU client's node calls (google-cloud-tpu on its REST transport) against the fake TPU
API: a node's state and external IP, and its guest attributes by namespace."""

from __future__ import annotations

from tests.gcp.tpu_support import PROJECT, QR_ID, ZONE, body, flex_here
from tpuserve.settings import from_raw, load_raw


def test_a_queued_resources_node_its_external_ip_and_guest_attributes(api, client) -> None:
    d = flex_here()
    assert client.get_node(d) is None
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    node = client.get_node(d)
    assert node is not None and node.state == "READY"
    assert node.name == f"projects/{PROJECT}/locations/{ZONE}/nodes/{QR_ID}"
    assert node.external_ip and node.external_ip.startswith("203.0.113.")
    assert client.guest_attributes(d, "tpuserve") == {}  # none written yet
    api.set_guest_attribute(QR_ID, "phase", "serving")
    api.set_guest_attribute(QR_ID, "boot", "857", namespace="timing")
    assert client.guest_attributes(d, "tpuserve") == {"phase": "serving"}
    assert client.guest_attributes(d, "timing") == {"boot": "857"}
    assert client.guest_attributes(d, "none") == {}


def test_a_node_without_an_external_ip(api, client) -> None:
    spot = from_raw(load_raw(environ={"TPUSERVE_PROJECT": PROJECT,
                                               "TPUSERVE_ZONE": ZONE})).deployments["spot"]
    api.seed_node(PROJECT, ZONE, spot.node_name, external_ip=None)
    node = client.get_node(spot)
    assert node is not None and node.external_ip is None


def test_delete_node(api, client) -> None:
    spot = from_raw(load_raw(environ={"TPUSERVE_PROJECT": PROJECT,
                                               "TPUSERVE_ZONE": ZONE})).deployments["spot"]
    assert client.delete_node(spot) is False  # already gone
    api.seed_node(PROJECT, ZONE, spot.node_name)
    assert client.delete_node(spot) is True
    missing, deleted = api.calls("DELETE")  # the first one found nothing (404)
    assert deleted.path == missing.path == (
        f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/{spot.node_name}")


def test_node_metadata_and_its_in_place_update(api, client) -> None:
    name = f"projects/{PROJECT}/locations/{ZONE}/nodes/{QR_ID}"
    assert client.node_metadata(name) is None
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script="old"))
    assert client.node_metadata(name) == {"startup-script": "old"}
    client.update_node_metadata(name, {"startup-script": "new", "k": "v"})
    assert client.node_metadata(name) == {"startup-script": "new", "k": "v"}
    [patch] = api.calls("PATCH")
    assert patch.path == f"/v2/{name}" and patch.query["updateMask"] == "metadata"
    assert patch.body == {"metadata": {"startup-script": "new", "k": "v"}}
