"""Listing the TPU API over REST (through the Google API edge, tpuserve.gcp.api): locations
(zones) of a project, nodes (v2) and queued resources (v2alpha1) of a location, every page
followed (`nextPageToken`). Raw JSON objects, labels included; no google-cloud-tpu import.

A list is complete only as the documented ListNodesResponse / ListQueuedResourcesResponse
shape proves it (tpu v2, v2alpha1 discovery documents): an `unreachable` location, an item
that is not an object, a `nextPageToken` that is not a string, or (for a region) no zone at all
raise UnprovenAnswer: an absence nothing proves is not an absence. A missing list field is an
empty list (proto3 JSON omits empty repeated fields) only in an answer that is a list answer:
`{}`, or one with another of its fields (api.not_a_list_answer).

Any GoogleApi for the "tpu" service works, tpuserve.gcp.tpu.client.TpuClient included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer, json_kind, not_a_list_answer
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.queued_resources import API_VERSION as QR_API_VERSION

NODE_API_VERSION = "v2"
PAGE_SIZE = 100
MAX_PAGES = 1000  # a server that keeps answering the same token must not loop forever


def pages(api: GoogleApi, path: str, key: str, *, action: str,
          page_size: int | None = None) -> Iterator[dict[str, Any]]:
    """Every item under `key` of a List method's answers, following nextPageToken."""
    page_size = page_size or PAGE_SIZE
    token = ""
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        params: dict[str, Any] = {"pageSize": page_size}
        if token:
            params["pageToken"] = token
        answer = api.request("GET", path, params=params, action=action)
        odd_answer = not_a_list_answer(answer, (key, "nextPageToken", "unreachable"))
        if odd_answer:
            raise UnprovenAnswer(200, odd_answer, action=action, service=api.service)
        unreachable = answer.get("unreachable", [])
        if unreachable != []:  # anything but none (an empty string included) is not "none"
            named = (", ".join(map(str, unreachable)) if isinstance(unreachable, list)
                     else json_kind(unreachable))
            raise UnprovenAnswer(200, f"the answer names unreachable location(s) {named}: the "
                                 "list may be incomplete", action=action, service=api.service)
        items = answer.get(key, [])
        if not isinstance(items, list):
            raise UnprovenAnswer(200, f"the answer's {key!r} is {json_kind(items)}, not a list",
                                 action=action, service=api.service)
        odd = [json_kind(item) for item in items if not isinstance(item, dict)]
        if odd:
            raise UnprovenAnswer(200, f"the answer's {key!r} holds {odd[0]}, not an object",
                                 action=action, service=api.service)
        yield from items
        raw_token = answer.get("nextPageToken", "")
        if not isinstance(raw_token, str):
            raise UnprovenAnswer(200, f"the answer's nextPageToken is {json_kind(raw_token)}, "
                                 "not a string", action=action, service=api.service)
        token = raw_token
        if not token:
            return
        if token in seen:
            raise ApiError(0, "UNKNOWN", f"the API repeated page token {token!r}",
                           action=action, service=api.service, hint="")
        seen.add(token)
    raise ApiError(0, "UNKNOWN", f"more than {MAX_PAGES} pages", action=action,
                   service=api.service, hint="")


def list_locations(api: GoogleApi, project: str) -> list[dict[str, Any]]:
    """The TPU API's locations of the project: [{"name", "locationId", ...}]."""
    return list(pages(api, f"{NODE_API_VERSION}/projects/{project}/locations", "locations",
                      action=f"list TPU locations of project {project}"))


def zones_in_region(api: GoogleApi, project: str, region: str) -> list[str]:
    """The location ids of `region`'s zones (us-west4 -> us-west4-a, us-west4-b ...), sorted.

    None is not an answer: a region whose TPU locations the API does not name proves nothing
    about what runs there (UnprovenAnswer)."""
    action = f"list TPU locations of project {project}"
    ids = set()
    for loc in list_locations(api, project):
        # Location.locationId is what names a zone: one without it could be any zone, this
        # region's included, whose nodes would then never be listed.
        location_id = loc.get("locationId")
        if not (isinstance(location_id, str) and location_id):
            raise UnprovenAnswer(
                200, f"the answer lists a location without a locationId "
                f"({str(loc.get('name', 'no name'))[:80]!r}): its zone is unknown",
                action=action, service=api.service)
        ids.add(location_id)
    zones = sorted(i for i in ids if i.startswith(f"{region}-"))
    if not zones:
        raise UnprovenAnswer(
            200, f"the TPU API's locations of project {project} name no zone of region "
            f"{region}: nothing proves what runs there", action=action, service=api.service)
    return zones


def list_nodes(api: GoogleApi, project: str, zone: str) -> list[dict[str, Any]]:
    parent = f"projects/{project}/locations/{zone}"
    return list(pages(api, f"{NODE_API_VERSION}/{parent}/nodes", "nodes",
                      action=f"list nodes in {parent}"))


def list_queued_resources(api: GoogleApi, project: str, zone: str) -> list[dict[str, Any]]:
    parent = f"projects/{project}/locations/{zone}"
    return list(pages(api, f"{QR_API_VERSION}/{parent}/queuedResources", "queuedResources",
                      action=f"list queued resources in {parent}"))


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    labels = node.get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def queued_resource_labels(qr: Mapping[str, Any]) -> dict[str, str]:
    """A QR's labels: those of its node specs (what this project sets), and its own if any."""
    out: dict[str, str] = {}
    tpu = qr.get("tpu")
    specs = tpu.get("nodeSpec") if isinstance(tpu, dict) else None
    for spec in specs if isinstance(specs, list) else []:
        node = spec.get("node") if isinstance(spec, dict) else None
        if isinstance(node, dict):
            out.update(node_labels(node))
    out.update(node_labels(qr))
    return out
