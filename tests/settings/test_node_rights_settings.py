"""The settings of the node's network and billing guard: defaults, names, and what is refused."""

from __future__ import annotations

import pytest

from tests.settings.test_config import ok, problems
from tpuserve.settings.warnings import deployment_warnings


def test_by_default_the_deployment_names_a_network_and_subnet_of_its_own() -> None:
    for d in ok().values():
        assert d.gcp.network is None and d.base.creates_network
        assert (d.network_name, d.subnet_name) == ("tpuserve-net", "tpuserve-net-us-west4")
        assert d.guard_queue == ("projects/tpuserve-placeholder/locations/us-west4/queues/"
                                 "tpuserve-guard")
        assert not any("gcp.network" in w for w in deployment_warnings(d))
    other = ok(gcp={"deployment": "team-a", "zone": "us-central1-a"})["flex"]
    assert (other.network_name, other.subnet_name) == ("team-a-net", "team-a-net-us-central1")
    assert other.base.guard_service_account_id == "team-a-guard"


def test_a_network_the_user_brings_creates_none_and_default_warns() -> None:
    mine = ok(gcp={"network": "my-vpc"})["spot"]
    assert (mine.network_name, mine.subnet_name, mine.base.creates_network) == (
        "my-vpc", None, False)
    assert not any("gcp.network" in w for w in deployment_warnings(mine))
    default = ok(gcp={"network": "default"})["spot"]
    [warning] = [w for w in deployment_warnings(default) if w.startswith("gcp.network")]
    assert "default-allow-ssh" in warning and "0.0.0.0/0" in warning and "unset" in warning


@pytest.mark.parametrize(("cidr", "why"), [
    ("10.64.0.0/33", "not a CIDR"),
    ("10.64.0.1/20", "not a CIDR"),  # host bits set
    ("203.0.113.0/24", "private IPv4"),
    ("10.0.0.0/30", "/29 smallest"),
    ("fd00::/64", "private IPv4"),
    ("10.0.0.0/7", "private IPv4"),
])
def test_the_subnet_range_is_a_private_ipv4_subnet(cidr: str, why: str) -> None:
    [msg] = problems(gcp={"subnet_cidr": cidr})
    assert msg.startswith("[spot, ondemand, flex, fleet]") and "gcp.subnet_cidr" in msg
    assert repr(cidr) in msg and why in msg
    assert ok(gcp={"subnet_cidr": "192.168.8.0/29"})["spot"].gcp.subnet_cidr == "192.168.8.0/29"


@pytest.mark.parametrize("value", ["Tpuserve", "a", "tpuserve-", "x" * 21, "tpu_serve", "-x"])
def test_the_deployment_name_is_refused_when_it_cannot_name_resources(value: str) -> None:
    [msg] = problems(gcp={"deployment": value})
    assert f"gcp.deployment = {value!r}" in msg and "<deployment>-guard" in msg


@pytest.mark.parametrize("value", ["My-VPC", "vpc_1", "-vpc", "a" * 64, "vpc\nx"])
def test_a_network_name_must_be_a_compute_engine_name(value: str) -> None:
    [msg] = problems(gcp={"network": value})
    assert f"gcp.network = {value!r}" in msg and "unset it" in msg


def test_max_run_hours_is_bounded_by_the_cloud_tasks_schedule() -> None:
    [msg] = problems(stack_spot={"max_run_hours": 721})
    assert msg.startswith("[spot] stack.max_run_hours = 721")
    assert "at most 720" in msg and "30 days ahead" in msg
    assert ok(stack_spot={"max_run_hours": 720})["spot"].stack.max_run_hours == 720


def test_the_default_network_warns_by_name_or_by_path() -> None:
    from tpuserve.settings import from_raw, load_raw
    from tpuserve.settings.warnings import deployment_warnings

    for network in ("default", "projects/my-proj-1/global/networks/default"):
        raw = load_raw(environ={})
        raw["gcp"] = {**raw.get("gcp", {}), "network": network}
        d = from_raw(raw).deployments["spot"]
        assert any("default" in w and "0.0.0.0/0" in w for w in deployment_warnings(d)), network


@pytest.mark.parametrize("value", [
    "http://tpu-guard.p.googleapis.com/", "https://tpu.googleapis.com/", "https://p.googleapis.com/",
    "https://tpu-guard.p.googleapis.com.evil.example/", "https://127.0.0.1:8443/",
    "https://tpu-guard.p.googleapis.com:8443/", "https://u@tpu-guard.p.googleapis.com/",
    "https://tpu-guard.p.googleapis.com/v2/", "https://TPU-guard.p.googleapis.com/",
    "https://tpu-guard.p.googleapis.com/?x=1", "tpu-guard.p.googleapis.com", "",
])
def test_the_guard_tpu_endpoint_is_a_private_service_connect_root(value: str) -> None:
    [msg] = problems(gcp={"tpu_api_endpoint": value})
    assert f"gcp.tpu_api_endpoint = {value!r}" in msg and "\n" not in msg
    assert "https://NAME.p.googleapis.com/" in msg and "unset" in msg


def test_the_guard_tpu_endpoint_defaults_to_google_and_takes_a_psc_root() -> None:
    assert ok()["spot"].gcp.tpu_api_endpoint is None
    ds = ok(gcp={"tpu_api_endpoint": "https://tpu-guard.p.googleapis.com"})
    d = ds["spot"]
    assert d.gcp.tpu_api_endpoint == "https://tpu-guard.p.googleapis.com/"
    # Said at synth: that Cloud Tasks reaches a PSC endpoint is not verified (public IPs only).
    [warning] = [w for w in deployment_warnings(d) if w.startswith("gcp.tpu_api_endpoint")]
    assert "public IP address" in warning and "not verified here" in warning
    assert not any(w.startswith("gcp.tpu_api_endpoint") for w in deployment_warnings(ds["flex"]))
    assert not any(w.startswith("gcp.tpu_api_endpoint") for w in deployment_warnings(ok()["spot"]))
