"""Queued resources' names (tpuserve.gcp.tpu.queued_resources)."""

from __future__ import annotations

import pytest

from tests.gcp.tpu_support import PROJECT, REF, ZONE
from tpuserve.gcp.tpu.queued_resources import QueuedResourceRef, ref_for
from tpuserve.settings import from_raw, load_raw


def test_names_are_validated() -> None:
    assert QueuedResourceRef.parse(REF.name) == REF
    with pytest.raises(ValueError, match="must look like"):
        QueuedResourceRef.parse("projects/p/zones/z/queuedResources/q")
    with pytest.raises(ValueError, match="lowercase"):
        QueuedResourceRef(PROJECT, ZONE, "Bad_Id")


def test_a_flex_deployments_queued_resource_is_named_like_its_node() -> None:
    d = from_raw(load_raw(environ={})).deployments["flex"]
    assert ref_for(d).name == ("projects/tpuserve-placeholder/locations/us-west4-a/"
                               "queuedResources/tpuserve-flex")
