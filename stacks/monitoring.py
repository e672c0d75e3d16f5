"""Monitoring construct: the deployment's dashboard, alert policies, email channel and budget.

Held by the base (one per deployment), so it outlives every node and a serving stack still holds
only its compute:
- `roles/monitoring.metricWriter` for the node service account: the only grant the node's
  collector needs to write to Google Managed Prometheus (always; it is the base's own);
- one `google_monitoring_dashboard` (tpuserve/render/dashboard.py) with a line per stack;
- one `google_monitoring_alert_policy` per kind (tpuserve/render/alerts.py), grouped by stack;
- `google_monitoring_notification_channel` of type email when [monitoring] email is set. Only
  email: a channel that needs a token (Slack, PagerDuty, webhooks with basic auth) would put
  the token into Terraform state, and no secret passes through Terraform here;
- `google_billing_budget` when [monitoring] billing_account is set: the configured stacks'
  24/7 month (SPEC 7: 730 h x $/h), with 50/90/100% of actual and 100% of forecast spend.

The base is built from the [gcp]/[cache]/[state] tables alone (settings/base_stack.py), before
the serving stacks: each serving stack registers with it (`add_stack`, from
stacks/serving.py), and the dashboard's lines and the budget's amount are rewritten to cover
every stack registered before synthesis. [monitoring] is the deployment's: stacks that disagree
on it are refused.
"""

from __future__ import annotations

import math
import sys

from tpuserve.contracts import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from tpuserve.facts import HOURS_PER_MONTH
from tpuserve.render.alerts import AUTO_CLOSE_S, EVALUATION_INTERVAL_S, alerts
from tpuserve.render.dashboard import StackPrice, dashboard_json, dashboard_url
from tpuserve.settings import Deployment
from tpuserve.settings.base_stack import Base
from tpuserve.settings.monitoring import MonitoringSettings

from .cdk import (
    Construct,
    DataGoogleProject,
    GoogleBillingBudget,
    GoogleBillingBudgetAllUpdatesRule,
    GoogleBillingBudgetAmount,
    GoogleBillingBudgetAmountSpecifiedAmount,
    GoogleBillingBudgetBudgetFilter,
    GoogleBillingBudgetThresholdRules,
    GoogleMonitoringAlertPolicy,
    GoogleMonitoringAlertPolicyAlertStrategy,
    GoogleMonitoringAlertPolicyConditions,
    GoogleMonitoringAlertPolicyConditionsConditionPrometheusQueryLanguage,
    GoogleMonitoringAlertPolicyDocumentation,
    GoogleMonitoringDashboard,
    GoogleMonitoringNotificationChannel,
    GoogleProjectIamMember,
    TerraformOutput,
    TerraformStack,
)
from .stack import TpuserveStack

METRIC_WRITER = "roles/monitoring.metricWriter"
# Fractions of the budget that notify: actual spend at 50/90/100%, and a forecast past 100%
# (it warns early in the month when the trend is already over).
BUDGET_THRESHOLDS = ((0.5, "CURRENT_SPEND"), (0.9, "CURRENT_SPEND"), (1.0, "CURRENT_SPEND"),
                     (1.0, "FORECASTED_SPEND"))


def budget_units(stacks: list[StackPrice]) -> int:
    """SPEC 7: the configured stacks' 24/7 month, whole dollars (rounded up)."""
    return math.ceil(round(sum(s.usd_per_hour for s in stacks) * HOURS_PER_MONTH, 6))


class Monitoring(Construct):
    def __init__(self, scope: Construct, id_: str, *, base: Base, node_member: str) -> None:
        super().__init__(scope, id_)
        self.base = base
        writer = GoogleProjectIamMember(
            self, "metric_writer", project=base.project, role=METRIC_WRITER, member=node_member)
        writer.override_logical_id("metric_writer")
        self.resources: list[object] = [writer]
        self.settings: MonitoringSettings | None = None
        self._stacks: dict[str, StackPrice] = {}
        self._settings_of: dict[str, MonitoringSettings] = {}
        self.dashboard: GoogleMonitoringDashboard | None = None
        self.budget: GoogleBillingBudget | None = None
        TerraformOutput(scope, "dashboard_url", value=dashboard_url(base.project, base.deployment),
                        description="The deployment's Cloud Monitoring dashboard (every stack)")

    # ------------------------------------------------------------------ registration
    def add_stack(self, d: Deployment) -> list[object]:
        """Cover one more serving stack; returns the resources created by this call."""
        if d.base != self.base:
            return []  # a stack of another base (never built together by main.build_app)
        self._agree(d)
        self._stacks[d.name] = StackPrice(d.name, round(d.usd_per_hour, 4))
        created: list[object] = []
        if self.dashboard is None:
            created = self._create(d.monitoring)
            self.resources.extend(created)
        stacks = list(self._stacks.values())
        self.dashboard.dashboard_json = dashboard_json(
            self.base.project, self.base.deployment, stacks)
        if self.budget is not None:
            self.budget.put_amount(specified_amount=_amount(stacks).specified_amount)
        return created

    def _agree(self, d: Deployment) -> None:
        self._settings_of[d.name] = d.monitoring
        first_name, first = next(iter(self._settings_of.items()))
        if d.monitoring != first:
            diff = [k for k in MonitoringSettings.model_fields
                    if getattr(d.monitoring, k) != getattr(first, k)]
            raise ValueError(
                f"[{d.name}] monitoring.{diff[0]} = {getattr(d.monitoring, diff[0])!r}: must "
                f"be [{first_name}]'s {getattr(first, diff[0])!r} (one dashboard, one set of "
                f"alerts and one budget per deployment, held by the base: set [monitoring] at "
                "the top level for every stack)"
            )

    # ------------------------------------------------------------------ resources
    def _create(self, m: MonitoringSettings) -> list[object]:
        b = self.base
        self.settings = m
        created: list[object] = []
        labels = {DEPLOYMENT_LABEL: b.deployment, MANAGED_BY_LABEL: MANAGED_BY}
        channels: list[str] = []
        channel = None
        if m.email is not None:
            channel = GoogleMonitoringNotificationChannel(
                self, "alert_email",
                type="email",
                display_name=f"tpuserve {b.deployment}: {m.email}",
                labels={"email_address": m.email},
                user_labels=labels,
            )
            channel.override_logical_id("alert_email")
            channels = [channel.id]
            created.append(channel)
        else:
            print(f"tpuserve: warning: monitoring.email is unset: the {b.deployment} alert "
                  "policies open incidents in the console only (set [monitoring] email to be "
                  "mailed)", file=sys.stderr)

        self.dashboard = GoogleMonitoringDashboard(
            self, "dashboard", project=b.project,
            dashboard_json=dashboard_json(b.project, b.deployment, []))
        self.dashboard.override_logical_id("dashboard")
        created.append(self.dashboard)

        for alert in alerts(b.deployment, idle_hours=m.idle_hours):
            policy = GoogleMonitoringAlertPolicy(
                self, f"alert_{alert.key}",
                project=b.project,
                display_name=f"tpuserve {b.deployment}: {alert.display_name}",
                combiner="OR",
                enabled=m.alerts,
                severity=alert.severity,
                notification_channels=channels or None,
                conditions=[GoogleMonitoringAlertPolicyConditions(
                    display_name=alert.display_name,
                    condition_prometheus_query_language=(
                        GoogleMonitoringAlertPolicyConditionsConditionPrometheusQueryLanguage(
                            query=alert.query,
                            duration=f"{alert.duration_s}s",
                            evaluation_interval=f"{EVALUATION_INTERVAL_S}s",
                            alert_rule=alert.key,
                            rule_group=f"tpuserve-{b.deployment}",
                            # The vLLM series exist only after a node's first scrape; the
                            # policies are created before any node boots.
                            disable_metric_validation=True,
                        )),
                )],
                documentation=GoogleMonitoringAlertPolicyDocumentation(
                    content=alert.documentation, mime_type="text/markdown",
                    subject=f"tpuserve {b.deployment}: {alert.display_name}"),
                alert_strategy=GoogleMonitoringAlertPolicyAlertStrategy(
                    auto_close=f"{AUTO_CLOSE_S}s"),
                user_labels=labels | {"alert": alert.key.replace("_", "-")},
            )
            policy.override_logical_id(f"alert_{alert.key}")
            created.append(policy)

        if m.billing_account is not None:
            stack = TerraformStack.of(self)
            assert isinstance(stack, TpuserveStack)
            stack.bill_requests_to_project(b.project)
            project = DataGoogleProject(self, "project", project_id=b.project)
            project.override_logical_id("project")
            self.budget = GoogleBillingBudget(
                self, "budget",
                billing_account=m.billing_account,
                display_name=f"tpuserve {b.deployment}"[:60],
                amount=_amount([]),
                # The number: the API reports projects by number, so an id would diff forever.
                budget_filter=GoogleBillingBudgetBudgetFilter(
                    projects=[f"projects/{project.number}"], calendar_period="MONTH"),
                threshold_rules=[GoogleBillingBudgetThresholdRules(
                    threshold_percent=p, spend_basis=basis) for p, basis in BUDGET_THRESHOLDS],
                all_updates_rule=GoogleBillingBudgetAllUpdatesRule(
                    monitoring_notification_channels=channels) if channels else None,
            )
            self.budget.override_logical_id("budget")
            created.append(self.budget)
        return created


def _amount(stacks: list[StackPrice]) -> GoogleBillingBudgetAmount:
    return GoogleBillingBudgetAmount(specified_amount=GoogleBillingBudgetAmountSpecifiedAmount(
        currency_code="USD", units=str(budget_units(stacks))))
