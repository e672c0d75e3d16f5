"""[monitoring]: where the deployment's alerts go, the opt-in budget, and the alert switches.

The base holds the monitoring of the whole deployment (stacks/monitoring.py): the node account's
metric-writer grant, one dashboard, the alert policies, an email channel and, opt-in, a budget.
So [monitoring] is the deployment's, like [gcp]: every stack must agree on it (a [stacks.NAME]
table that changes it is refused at synth).
"""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

import math

from pydantic import field_validator

from tpuserve.facts import PROMQL_ALERT_MAX_DURATION_S
from tpuserve.settings.base import StrictModel, image_reference, spec_error
from tpuserve.settings.string_rules import Rule, check

# An address Cloud Monitoring can mail: a plain addr-spec, no display name, no quoting, and
# none of the characters Terraform or a shell would read ($ { } % quotes, spaces).
EMAIL = Rule(
    r"[A-Za-z0-9._+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+",
    "a plain address like ops@example.com (letters, digits, . _ + - before the @; a dotted "
    "domain after it)",
    254,
)
# Cloud Billing account ids: three groups of six upper-case hexadecimal digits
# (`gcloud billing accounts list`, column ACCOUNT_ID).
BILLING_ACCOUNT = Rule(
    r"[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}",
    "a billing account id like 012345-6789AB-CDEF01 (`gcloud billing accounts list`), "
    "without the billingAccounts/ prefix",
    20,
)


class MonitoringSettings(StrictModel):
    # Unset: no notification channel; the policies still exist and open incidents in the
    # console, and synth warns. An address is no secret: it may sit in Terraform state.
    email: str | None = None
    # Unset: no budget. Creating one needs billing.budgets.create on the billing account
    # (Billing Account Administrator or Costs Manager), which a project owner rarely holds.
    billing_account: str | None = None
    # false: the policies stay, disabled (turning them back on is an update, not a create).
    alerts: bool = True
    # "Idle but billing": vLLM up and not one token generated for this long.
    idle_hours: float = 2.0
    # The metrics collector on every node (templates/boot/metrics.sh.j2): false, none runs
    # (and a running one is removed), and the dashboard and alerts see nothing of that node.
    metrics: bool = True
    # Pinned: a moving tag would change what every node runs without a config change.
    collector_image: str = "otel/opentelemetry-collector-contrib:0.160.0"

    @field_validator("collector_image")
    @classmethod
    def _collector_image(cls, v: str) -> str:
        image_reference("monitoring.collector_image", v)
        tag = v.split("@")[0].rsplit("/", 1)[-1].partition(":")[2]
        if "@sha256:" not in v and tag in ("", "latest"):
            raise spec_error("monitoring.collector_image", v, "pin a version tag or a digest",
                             "a moving tag changes what every node runs with no config change")
        return v

    @field_validator("email")
    @classmethod
    def _email(cls, v: str | None) -> str | None:
        return None if v is None else check("monitoring.email", v, EMAIL)

    @field_validator("billing_account")
    @classmethod
    def _billing_account(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if v.startswith("billingAccounts/"):
            raise spec_error("monitoring.billing_account", v, "give the id alone, without "
                             "billingAccounts/", "the budget names the account itself")
        return check("monitoring.billing_account", v, BILLING_ACCOUNT)

    @field_validator("idle_hours")
    @classmethod
    def _idle_hours(cls, v: float) -> float:
        limit_h = PROMQL_ALERT_MAX_DURATION_S / 3600
        if not (math.isfinite(v) and 0 < v <= limit_h):
            raise spec_error(
                "monitoring.idle_hours", v, f"must be above 0 and at most {limit_h:g}",
                "Cloud Monitoring: a PromQL alert condition lasts at most 24 h",
            )
        if round(v * 3600) % 60:
            raise spec_error(
                "monitoring.idle_hours", v, "must be a whole number of minutes",
                "an alert condition's duration is given in whole seconds; minutes keep it "
                "readable",
            )
        return v
