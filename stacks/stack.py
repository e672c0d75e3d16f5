"""What every tpuserve stack has, base or serving: its state, its provider, its escape pass."""

from __future__ import annotations

from tpuserve.contracts import MANAGED_BY, MANAGED_BY_LABEL
from tpuserve.settings.base_stack import Base

from .cdk import Aspects, Construct, GcsBackend, GoogleBetaProvider, LocalBackend, TerraformStack
from .literals import TerraformLiterals
from .provider_binding import BindGoogleProvider


class TpuserveStack(TerraformStack):
    def __init__(self, scope: Construct, name: str, base: Base, *, zone: str | None = None,
                 ) -> None:
        super().__init__(scope, name)
        # The one Terraform escape pass: every string of this stack is literal unless it is a
        # reference (stacks/literals.py). No construct escapes anything itself.
        Aspects.of(self).add(TerraformLiterals())
        if base.state.gcs_bucket:
            # Shared state: a team and the plan-review workflow see the same resources.
            GcsBackend(self, bucket=base.state.gcs_bucket, prefix=base.gcs_state_prefix(name))
        else:
            # Relative to cdktf.out/stacks/NAME, where terraform runs: state sits at the repo
            # root and synthesized JSON carries no machine path.
            LocalBackend(self, path=f"../../../{base.local_state(name)}")
        provider = GoogleBetaProvider(
            self, "google_beta", project=base.project, region=base.region, zone=zone,
            default_labels={MANAGED_BY_LABEL: MANAGED_BY},
        )
        Aspects.of(self).add(BindGoogleProvider(provider))
        self.provider = provider

    def bill_requests_to_project(self, project: str) -> None:
        """Send the project as every request's quota project. Some APIs (the Budgets API)
        refuse user credentials without one (403); google_billing_budget's documented fix."""
        self.provider.user_project_override = True
        self.provider.billing_project = project
