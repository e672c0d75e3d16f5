"""Listing a project's GKE clusters over REST (Container API v1, through the Google API edge):
`projects.locations.clusters.list` with location "-", which "matches all zones and all
regions" (container.v1 discovery document, revision 20261027), so one call covers a region and
each of its zones. GKE's TPU nodes are Compute Engine instances the TPU API never lists: a
fleet stack is found here, by its cluster's `resourceLabels` (stacks/fleet.py: the
deployment's labels).

The answer (ListClustersResponse: `clusters`, `missingZones`; no paging) is complete for a
region only when no zone of it is in `missingZones` ("the list of clusters returned may be
missing those zones"); anything else that is not the documented shape raises UnprovenAnswer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer, json_kind, not_a_list_answer

CONTAINER_API = "https://container.googleapis.com/"  # CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER
CONTAINER_SERVICE = "container"


@dataclass(frozen=True)
class ClusterRecord:
    """One cluster of the answer: its resource name, location, status and labels."""

    name: str  # projects/P/locations/L/clusters/N
    location: str  # a zone (zonal cluster) or a region (regional); "" when the answer has none
    status: str
    labels: dict[str, str]


def in_region(location: str, region: str) -> bool:
    """The region itself (a regional cluster) or one of its zones (us-west4 -> us-west4-a)."""
    return location == region or location.startswith(f"{region}-")


def clusters_in_region(api: GoogleApi, project: str, region: str) -> list[ClusterRecord]:
    """Every cluster of `project` located in `region` or one of its zones (and every cluster
    whose answer names no location: it cannot be placed elsewhere), sorted by name."""
    action = f"list GKE clusters of project {project}"
    answer = api.request("GET", f"v1/projects/{project}/locations/-/clusters", action=action)

    def unproven(message: str) -> UnprovenAnswer:
        return UnprovenAnswer(200, message, action=action, service=api.service)

    missing = answer.get("missingZones", [])
    if not isinstance(missing, list) or not all(isinstance(z, str) for z in missing):
        raise unproven(f"the answer's missingZones is {json_kind(missing)} of something else "
                       "than zone names")
    here = [z for z in missing if in_region(z, region)]
    if here:
        raise unproven(f"the answer says zone(s) {', '.join(here)} of {region} did not answer "
                       "(missingZones): the list may be missing their clusters")
    if answer.get("nextPageToken"):  # ListClustersResponse is not paged: a page is not all
        raise unproven("the answer is paged (nextPageToken), which clusters.list does not "
                       "document: the other pages are unknown")
    odd_answer = not_a_list_answer(answer, ("clusters", "missingZones"))
    if odd_answer:
        raise unproven(odd_answer)
    items = answer.get("clusters", [])
    if not isinstance(items, list):
        raise unproven(f"the answer's 'clusters' is {json_kind(items)}, not a list")
    found = []
    for item in items:
        if not isinstance(item, dict):
            raise unproven(f"the answer's 'clusters' holds {json_kind(item)}, not an object")
        location = _text(item.get("location")) or _text(item.get("zone"))
        if location and not in_region(location, region):
            continue
        short = _text(item.get("name"))
        found.append(ClusterRecord(
            f"projects/{project}/locations/{location or '?'}/clusters/{short or '?'}",
            location, _text(item.get("status")) or "STATUS_UNSPECIFIED",
            _labels(item.get("resourceLabels"))))
    return sorted(found, key=lambda c: c.name)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}
