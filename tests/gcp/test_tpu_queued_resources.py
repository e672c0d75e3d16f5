"""Queued resources' names, and the flex stack's config rules about where and how long one
may queue (tpuserve.gcp.tpu.queued_resources)."""

from __future__ import annotations

import pytest

from tests.gcp.tpu_support import PROJECT, REF, ZONE
from tpuserve.gcp.tpu.queued_resources import QueuedResourceRef, ref_for
from tpuserve.settings.models import (
    ConfigError,
    build_deployments,
    deployment_warnings,
    load_raw,
)


def test_names_are_validated() -> None:
    assert QueuedResourceRef.parse(REF.name) == REF
    with pytest.raises(ValueError, match="must look like"):
        QueuedResourceRef.parse("projects/p/zones/z/queuedResources/q")
    with pytest.raises(ValueError, match="lowercase"):
        QueuedResourceRef(PROJECT, ZONE, "Bad_Id")


def test_a_flex_deployments_queued_resource_is_named_like_its_node() -> None:
    d = build_deployments(load_raw(environ={}))["flex"]
    assert ref_for(d).name == ("projects/tpuserve-placeholder/locations/us-west4-a/"
                               "queuedResources/tpuserve-flex")


# ---------------------------------------------------------------- zone rules (config)


def test_flex_zone_rules() -> None:
    raw = load_raw(environ={"TPUSERVE_ZONE": "europe-west4-a"})
    with pytest.raises(ConfigError) as err:
        build_deployments(raw)
    [problem] = err.value.problems
    assert problem.startswith("[flex] gcp.zone = 'europe-west4-a': flex-start does not take")
    assert "FLEX_START provisioning model is not supported" in problem
    del raw["stacks"]["flex"]
    assert build_deployments(raw)["spot"].gcp.zone == "europe-west4-a"  # spot: no such rule
    known = build_deployments(load_raw(environ={"TPUSERVE_ZONE": "us-central1-a"}))["flex"]
    assert deployment_warnings(known) == []
    unknown = build_deployments(load_raw(environ={"TPUSERVE_ZONE": "asia-east1-c"}))["flex"]
    [warning] = deployment_warnings(unknown)
    assert warning.startswith("gcp.zone = 'asia-east1-c': flex-start acceptance")

def test_valid_until_duration_must_be_positive() -> None:
    raw = load_raw(environ={})
    raw["stacks"]["flex"]["valid_until_duration"] = "0s"
    with pytest.raises(ConfigError, match="valid_until_duration = '0s': must be more than 0"):
        build_deployments(raw)
