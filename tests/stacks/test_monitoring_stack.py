"""Synth tests of the deployment's monitoring (stacks/monitoring.py), held by the base: the node
account's metric-writer grant, the dashboard, the alert policies, the email channel and the
opt-in budget; and the [monitoring] settings that drive them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CANARIES
from tpuserve.facts import HOURS_PER_MONTH
from tpuserve.render.alerts import alerts
from tpuserve.settings import ConfigError, from_raw, load_raw

NODE_MEMBER = "serviceAccount:${google_service_account.service_account.email}"
ALERT_KEYS = {f"alert_{a.key}" for a in alerts("tpuserve", idle_hours=2.0)}
MONITORING_KINDS = ("google_monitoring_dashboard", "google_monitoring_alert_policy",
                    "google_monitoring_notification_channel", "google_billing_budget")
EMAIL = "ops@example.com"
BILLING = "012345-6789AB-CDEF01"


def resources(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return doc.get("resource", {}).get(kind, {})


def build(raw: dict[str, Any], outdir: Path) -> dict[str, dict[str, Any]]:
    import main

    with pytest.MonkeyPatch.context() as mp:
        for name, value in CANARIES.items():
            mp.setenv(name, value)
        main.build_app(from_raw(raw).deployments, outdir=str(outdir)).synth()
    return {p.name: json.loads((p / "cdk.tf.json").read_text())
            for p in sorted((outdir / "stacks").iterdir())}


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Deployment `team-b` with an email channel, a budget, alerts off and a 3 h idle window;
    spot and flex only."""
    raw = load_raw(environ={})
    raw["gcp"] = {**raw["gcp"], "deployment": "team-b"}
    raw["monitoring"] = {"email": EMAIL, "billing_account": BILLING, "alerts": False,
                         "idle_hours": 3.0}
    raw["stacks"] = {k: raw["stacks"][k] for k in ("spot", "flex")}
    return build(raw, tmp_path_factory.mktemp("monitoring"))


# ------------------------------------------------------------------ the default config
def test_the_node_account_may_write_metrics(synthesized) -> None:
    grant = resources(synthesized["base"], "google_project_iam_member")["metric_writer"]
    assert grant["role"] == "roles/monitoring.metricWriter"
    assert grant["member"] == NODE_MEMBER
    assert grant["project"] == "tpuserve-placeholder"


def test_default_has_dashboard_and_policies_but_no_channel_or_budget(synthesized) -> None:
    base = synthesized["base"]
    assert set(resources(base, "google_monitoring_dashboard")) == {"dashboard"}
    assert set(resources(base, "google_monitoring_alert_policy")) == ALERT_KEYS
    assert not resources(base, "google_monitoring_notification_channel")
    assert not resources(base, "google_billing_budget")
    assert "data" not in base
    # Without a budget, no request is billed to the project as its quota project.
    assert "user_project_override" not in base["provider"]["google-beta"][0]
    for policy in resources(base, "google_monitoring_alert_policy").values():
        assert policy["enabled"] is True
        assert "notification_channels" not in policy


def test_no_serving_stack_holds_monitoring(synthesized) -> None:
    for name, doc in synthesized.items():
        if name != "base":
            for kind in MONITORING_KINDS:
                assert not resources(doc, kind), (name, kind)


def test_every_policy_is_a_promql_condition_with_its_documentation(synthesized) -> None:
    by_key = {f"alert_{a.key}": a for a in alerts("tpuserve", idle_hours=2.0)}
    for key, policy in resources(synthesized["base"], "google_monitoring_alert_policy").items():
        alert = by_key[key]
        [cond] = policy["conditions"]
        promql = cond["condition_prometheus_query_language"]
        assert promql["query"] == alert.query
        assert promql["duration"] == f"{alert.duration_s}s"
        assert promql["disable_metric_validation"] is True
        assert policy["combiner"] == "OR" and policy["severity"] == alert.severity
        assert policy["documentation"]["mime_type"] == "text/markdown"
        assert "SPEC" in policy["documentation"]["content"] or key == "alert_idle"
        assert policy["alert_strategy"]["auto_close"] == "1800s"
        assert policy["user_labels"]["deployment"] == "tpuserve"


def test_the_dashboard_covers_every_stack(synthesized) -> None:
    board = resources(synthesized["base"], "google_monitoring_dashboard")["dashboard"]
    # The literal pass escapes `${` for Terraform: what the API receives is the unescaped text.
    doc = json.loads(board["dashboard_json"].replace("$${", "${"))
    [cost] = [t for t in doc["mosaicLayout"]["tiles"]
              if t["widget"]["title"].startswith("$ per million")]
    legends = [d["legendTemplate"] for d in cost["widget"]["xyChart"]["dataSets"]]
    assert sorted(legends) == ["fleet", "flex", "ondemand", "spot"]
    assert doc["name"] == "projects/tpuserve-placeholder/dashboards/tpuserve-serving"


def test_every_stack_prints_the_dashboard_url(synthesized) -> None:
    url = ("https://console.cloud.google.com/monitoring/dashboards/custom/tpuserve-serving"
           "?project=tpuserve-placeholder")
    for name, doc in synthesized.items():
        assert doc["output"]["dashboard_url"]["value"] == url, name


def test_teardown_guard_goes_first(synthesized) -> None:
    deps = resources(synthesized["base"], "terraform_data")["teardown_guard"]["depends_on"]
    assert "google_project_iam_member.metric_writer" in deps
    assert "google_monitoring_dashboard.dashboard" in deps
    assert {f"google_monitoring_alert_policy.{k}" for k in ALERT_KEYS} <= set(deps)


def test_no_secret_in_any_monitoring_resource(synthesized, configured) -> None:
    for docs in (synthesized, configured):
        base = docs["base"]
        text = json.dumps({k: resources(base, k) for k in MONITORING_KINDS})
        for canary in CANARIES.values():
            assert canary not in text
        for channel in resources(base, "google_monitoring_notification_channel").values():
            assert "sensitive_labels" not in channel
            assert set(channel["labels"]) == {"email_address"}
        # No reference to a secret, and none of the channel labels that hold one.
        assert "${google_secret_manager" not in text
        for key in ("auth_token", "password", "service_key", "sensitive_labels"):
            assert f'"{key}"' not in text


# ------------------------------------------------------------------ the configured variant
def test_email_channel_reaches_every_policy(configured) -> None:
    base = configured["base"]
    channel = resources(base, "google_monitoring_notification_channel")["alert_email"]
    assert channel["type"] == "email" and channel["labels"] == {"email_address": EMAIL}
    ref = "${google_monitoring_notification_channel.alert_email.id}"
    for policy in resources(base, "google_monitoring_alert_policy").values():
        assert policy["notification_channels"] == [ref]
        assert policy["enabled"] is False  # monitoring.alerts = false keeps them, disabled
        assert 'deployment="team-b"' in (
            policy["conditions"][0]["condition_prometheus_query_language"]["query"])
    idle = resources(base, "google_monitoring_alert_policy")["alert_idle"]
    assert idle["conditions"][0]["condition_prometheus_query_language"]["duration"] == "10800s"


def test_budget_only_when_configured_at_the_stacks_month(configured, deployments) -> None:
    base = configured["base"]
    budget = resources(base, "google_billing_budget")["budget"]
    assert budget["billing_account"] == BILLING
    # SPEC 7: 730 h x (spot 0.5779 + flex 0.6000) $/h = $859.87 -> 860.
    month = (deployments["spot"].usd_per_hour + deployments["flex"].usd_per_hour) \
        * HOURS_PER_MONTH
    assert budget["amount"]["specified_amount"] == {"currency_code": "USD", "units": "860"}
    assert int(budget["amount"]["specified_amount"]["units"]) == -(-month // 1)
    assert budget["budget_filter"] == {
        "projects": ["projects/${data.google_project.project.number}"],
        "calendar_period": "MONTH"}
    rules = {(r["threshold_percent"], r.get("spend_basis")) for r in budget["threshold_rules"]}
    assert rules == {(0.5, "CURRENT_SPEND"), (0.9, "CURRENT_SPEND"), (1.0, "CURRENT_SPEND"),
                     (1.0, "FORECASTED_SPEND")}
    # The Budgets API refuses user credentials without a quota project (403).
    provider = base["provider"]["google-beta"][0]
    assert provider["user_project_override"] is True
    assert provider["billing_project"] == "tpuserve-placeholder"
    assert budget["all_updates_rule"]["monitoring_notification_channels"] == [
        "${google_monitoring_notification_channel.alert_email.id}"]
    assert base["data"]["google_project"]["project"]["project_id"] == "tpuserve-placeholder"


def test_configured_dashboard_has_the_configured_stacks_only(configured) -> None:
    board = resources(configured["base"], "google_monitoring_dashboard")["dashboard"]
    doc = json.loads(board["dashboard_json"].replace("$${", "${"))
    assert doc["name"] == "projects/tpuserve-placeholder/dashboards/team-b-serving"
    text = json.dumps(doc)
    assert 'stack=\\"spot\\"' in text and 'stack=\\"flex\\"' in text
    assert 'stack=\\"ondemand\\"' not in text


# ------------------------------------------------------------------ [monitoring] settings
def monitoring(**table: object) -> Any:
    raw = load_raw(environ={})
    raw["monitoring"] = table
    return from_raw(raw)


def test_settings_default() -> None:
    m = next(iter(from_raw(load_raw(environ={})).deployments.values())).monitoring
    assert (m.email, m.billing_account, m.alerts, m.idle_hours) == (None, None, True, 2.0)


@pytest.mark.parametrize(("table", "message"), [
    ({"email": "not an address"}, "monitoring.email = 'not an address': must be a plain"),
    ({"email": "${file(\"x\")}@example.com"}, "monitoring.email"),
    ({"billing_account": "billingAccounts/012345-6789AB-CDEF01"}, "without billingAccounts/"),
    ({"billing_account": "012345-6789ab-cdef01"}, "monitoring.billing_account"),
    ({"idle_hours": 0}, "monitoring.idle_hours = 0.0: must be above 0 and at most 24"),
    ({"idle_hours": 48.0}, "PromQL alert condition lasts at most 24 h"),
    ({"idle_hours": 1.001}, "whole number of minutes"),
    ({"alerts": "off"}, "monitoring.alerts"),
    ({"emial": EMAIL}, "monitoring.emial"),
])
def test_settings_refused_with_setting_value_and_rule(table, message) -> None:
    with pytest.raises(ConfigError) as err:
        monitoring(**table)
    assert message in str(err.value)


def test_stacks_must_agree_on_monitoring(tmp_path: Path) -> None:
    raw = load_raw(environ={})
    raw["stacks"] = {"spot": raw["stacks"]["spot"],
                     "flex": {**raw["stacks"]["flex"], "monitoring": {"email": EMAIL}}}
    import main

    with pytest.raises(ValueError, match=r"\[flex\] monitoring.email = 'ops@example.com': must "
                                         r"be \[spot\]'s None"):
        main.build_app(from_raw(raw).deployments, outdir=str(tmp_path))
