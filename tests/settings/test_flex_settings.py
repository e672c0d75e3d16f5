"""The flex stack's config rules: where a queued resource may be created and how long it may
queue."""

from __future__ import annotations

import pytest

from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings.warnings import deployment_warnings


def test_flex_zone_rules() -> None:
    raw = load_raw(environ={"TPUSERVE_ZONE": "europe-west4-a"})
    with pytest.raises(ConfigError) as err:
        from_raw(raw)
    [problem] = err.value.problems
    assert problem.startswith("[flex] gcp.zone = 'europe-west4-a': flex-start does not take")
    assert "FLEX_START provisioning model is not supported" in problem
    del raw["stacks"]["flex"]
    assert from_raw(raw).deployments["spot"].gcp.zone == "europe-west4-a"  # spot: no such rule
    known = from_raw(load_raw(environ={"TPUSERVE_ZONE": "us-central1-a"})).deployments["flex"]
    # No source prices flex-start outside SPEC 2's us-west4: that price is a stand-in, said so.
    [stand_in] = deployment_warnings(known)
    assert stand_in.startswith("pricing.flex = 0.6: no source prices v5litepod-1 flex in "
                               "us-central1")
    unknown = from_raw(load_raw(environ={"TPUSERVE_ZONE": "asia-east1-c"})).deployments["flex"]
    [warning] = [w for w in deployment_warnings(unknown) if not w.startswith("pricing.flex")]
    assert warning.startswith("gcp.zone = 'asia-east1-c': flex-start acceptance")


def test_valid_until_duration_must_be_positive() -> None:
    raw = load_raw(environ={})
    raw["stacks"]["flex"]["valid_until_duration"] = "0s"
    with pytest.raises(ConfigError, match="valid_until_duration = '0s': must be more than 0"):
        from_raw(raw)
