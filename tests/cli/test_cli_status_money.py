"""`tpuserve status --json`'s money keys every kind has: `price_usd_per_hour` (one
server at the stack's list price) and `spend_usd_per_hour` (what bills now), after today's
keys, which keep their order and meaning (`usd_per_hour`: a VM's price, the fleet's spend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_fleet import CAPACITY_EVENT, Fleet, _status, fleet  # noqa: F401
from tests.cli_support import Env, invoke
from tpuserve.facts import GKE_CLUSTER_USD_PER_HOUR, MACHINE_USD_PER_HOUR
from tpuserve.gcp import kube

# Today's keys, in today's order (tpuserve/ops/stack_status.py, fleet_status.py before the money
# keys).
VM_KEYS = [
    "stack", "provisioning_model", "project", "zone", "node_name", "deployed",
    "queued_resource_state", "queued_resource_failure", "node_state", "node_health",
    "external_ip", "endpoint", "health", "boot", "created_at", "running_s", "usd_per_hour",
    "spent_usd", "ends_at", "ends_in_s", "end_rule", "recoverable", "problems", "config",
    "reconverge", "dashboard_url",
]
FLEET_KEYS = [
    "stack", "provisioning_model", "project", "zone", "cluster", "kube_context", "deployed",
    "replicas", "autoscaler", "gateway", "picker", "endpoint", "health", "pods", "pending",
    "billed_replicas", "usd_per_replica_hour", "usd_per_hour", "truncated", "problems",
    "dashboard_url",
]
MONEY = ["price_usd_per_hour", "spend_usd_per_hour"]



@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Fleet:
    """tests/cli/test_cli_fleet.py's `fleet`: the fleet's config and a fake cluster."""
    return request.getfixturevalue("fleet")


def _vm(stack: str) -> dict:
    result = invoke("status", stack, "--json")
    assert "Traceback" not in result.stdout + result.stderr
    (s,) = json.loads(result.stdout)["stacks"]
    return s


@pytest.mark.parametrize(("stack", "price"), [("spot", 0.5779), ("ondemand", 1.2),
                                              ("flex", 0.6)])
def test_a_running_vm_spends_its_price(cli_env: Env, stack: str, price: float) -> None:
    cli_env.seed_ready(stack)
    s = _vm(stack)
    assert list(s) == VM_KEYS + MONEY  # the old keys first, as they were
    assert s["usd_per_hour"] == s["price_usd_per_hour"] == s["spend_usd_per_hour"] == price


@pytest.mark.parametrize("lost", ["PREEMPTED", "STOPPED"])
def test_a_lost_node_spends_nothing_and_keeps_its_price(cli_env: Env, lost: str) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, lost)
    s = _vm("spot")
    assert s["spend_usd_per_hour"] == 0.0
    assert s["usd_per_hour"] == s["price_usd_per_hour"] == 0.5779  # a price, as before


def test_a_flex_stack_not_deployed_spends_nothing(cli_env: Env) -> None:
    s = _vm("flex")
    assert (s["deployed"], s["price_usd_per_hour"], s["spend_usd_per_hour"]) == (False, 0.6, 0.0)


def test_the_fleet_spends_its_replicas_on_tpu_nodes(cluster: Fleet) -> None:
    cluster.seed(["ready", "ready", "unschedulable"],
               events={2: ("FailedScaleUp", CAPACITY_EVENT)})
    doc = _status()
    doc.pop("exit_code")
    assert list(doc) == FLEET_KEYS + MONEY
    price = round(cluster.d.usd_per_hour, 4)
    assert doc["price_usd_per_hour"] == doc["usd_per_replica_hour"] == price
    # Two replicas hold a chip; the one waiting for capacity costs nothing. The cluster that
    # answered bills its fee and its system node (list prices, tpuserve/facts.py) on top.
    assert doc["usd_per_hour"] == round(2 * price, 4)
    overhead = GKE_CLUSTER_USD_PER_HOUR + MACHINE_USD_PER_HOUR["e2-standard-4"]
    assert doc["spend_usd_per_hour"] == round(2 * cluster.d.usd_per_hour + overhead, 4)


def test_the_fleet_spend_is_unknown_when_not_every_pod_was_read(
        cluster: Fleet) -> None:
    cluster.seed(["ready"] * (kube.MAX_LIST_ITEMS + 1))
    doc = _status()
    assert doc["truncated"] and doc["billed_replicas"] == kube.MAX_LIST_ITEMS
    # As before: the replicas read, times the price.
    assert doc["usd_per_hour"] == round(kube.MAX_LIST_ITEMS * cluster.d.usd_per_hour, 4)
    assert doc["spend_usd_per_hour"] is None  # 500 of at least 501 proves nothing


def test_the_fleet_spend_is_unknown_when_its_cluster_cannot_be_read(
        cluster: Fleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster.seed(["ready"])
    cluster.kube.forbidden = True
    docs = {s["stack"]: s for s in json.loads(invoke("status", "--json").stdout)["stacks"]}
    assert docs["fleet"]["problems"] and docs["fleet"]["usd_per_hour"] == 0.0  # as before
    assert docs["fleet"]["spend_usd_per_hour"] is None
    assert docs["fleet"]["price_usd_per_hour"] == round(cluster.d.usd_per_hour, 4)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # no credentials
    docs = {s["stack"]: s for s in json.loads(invoke("status", "--json").stdout)["stacks"]}
    assert docs["fleet"]["spend_usd_per_hour"] is None


def test_the_table_is_unchanged_by_the_money_keys(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    table = invoke("status", "spot").stdout
    assert "spent" in table and "price" not in table and "spend" not in table
