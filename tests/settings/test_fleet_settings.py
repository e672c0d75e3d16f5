"""The [fleet] section: what the fleet stack may be given, and the rules it is refused by."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR, WARM_START_S
from tpuserve.settings import ConfigError, Deployment, from_raw, load_raw
from tpuserve.settings.fleet import PLACEHOLDER_DIGEST
from tpuserve.settings.warnings import deployment_warnings

DIGEST = "sha256:" + "ab" * 32


def raw_fleet(fleet: dict[str, Any] | None = None, **stack: Any) -> dict[str, Any]:
    raw = load_raw(environ={})
    raw["stacks"] = {"fleet": {"provisioning_model": "fleet",
                               "vllm": {"image": f"vllm/vllm-tpu:nightly@{DIGEST}"}, **stack}}
    if fleet is not None:
        raw["fleet"] = {**raw.get("fleet", {}), **fleet}
    return raw


def fleet(fleet: dict[str, Any] | None = None, **stack: Any) -> Deployment:
    return from_raw(raw_fleet(fleet, **stack)).deployments["fleet"]


def refused(fleet_: dict[str, Any] | None = None, **stack: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        from_raw(raw_fleet(fleet_, **stack))
    [problem] = exc.value.problems
    return problem


def test_the_defaults() -> None:
    d = fleet()
    assert (d.fleet.min_replicas, d.fleet.max_replicas) == (1, 4)
    assert d.fleet.provisioning == ["flex", "spot"]
    assert d.fleet.flex_max_run_seconds == 7 * 86400
    # One replica in the first-choice pool; no billing guard (GKE's autoscaler owns nodes).
    assert d.usd_per_hour == PRICES_USD_PER_CHIP_HOUR["flex"]
    assert d.kind.on_gke and not d.has_billing_guard


@pytest.mark.parametrize(("over", "words"), [
    ({"min_replicas": 5, "max_replicas": 4},
     "fleet.min_replicas = 5: must be <= fleet.max_replicas"),
    ({"min_replicas": 0}, "min_replicas"),
    ({"provisioning": []}, "fleet.provisioning = []"),
    ({"provisioning": ["flex", "flex"]}, "distinct provisioning models"),
    ({"provisioning": ["preemptible"]}, "provisioning"),
    ({"flex_max_run_duration": "8d"}, "GKE flex-start nodes run at most 7 days"),
    ({"flex_max_run_duration": "7 days"}, "fleet.flex_max_run_duration"),
    ({"scale_up_period_s": 60}, f"must be at least {WARM_START_S:.0f}"),
    ({"scale_down_window_s": 30}, "a shorter window flaps"),
    ({"proxy_only_cidr": "10.129.0.0/28"}, "fleet.proxy_only_cidr = '10.129.0.0/28'"),
    ({"pods_cidr": "8.8.0.0/14"}, "private IPv4"),
    ({"services_cidr": "10.96.0.0/20"}, "overlaps"),
    ({"proxy_only_cidr": "10.64.0.0/23"}, "overlaps gcp.subnet_cidr"),
    ({"system_machine_type": "e2 standard"}, "fleet.system_machine_type"),
    ({"domain": "LLM.Example.com"}, "fleet.domain"),
    ({"release_channel": "NIGHTLY"}, "release_channel"),
])
def test_bad_fleet_values_are_refused_before_deploy(over: dict[str, Any], words: str) -> None:
    problem = refused(over)
    assert problem.startswith("[fleet] ") and words in problem


def test_only_the_fleet_stack_runs_on_gke() -> None:
    raw = load_raw(environ={})
    raw["stacks"]["spot"] = {**raw["stacks"]["spot"], "provisioning_model": "fleet"}
    with pytest.raises(ConfigError) as exc:
        from_raw(raw)
    assert any("the stack named fleet, and only it" in p for p in exc.value.problems)
    assert "the stack named fleet" in refused(provisioning_model="flex")


def test_the_fleet_warns_about_a_placeholder_digest_and_plain_http() -> None:
    placeholder = fleet(vllm={"image": f"vllm/vllm-tpu:nightly@{PLACEHOLDER_DIGEST}"})
    image, http = deployment_warnings(placeholder)
    assert "refuses it until you set one" in image and "fleet.domain is unset" in http
    pinned = fleet({"domain": "llm.example.com"})
    assert deployment_warnings(pinned) == []
    tag_only = fleet(vllm={"image": "vllm/vllm-tpu:nightly"})
    assert any("pinned by its real digest" in w for w in deployment_warnings(tag_only))
