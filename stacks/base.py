"""The base stack: the long-lived half of a deployment, deployed once per project and region.

It holds what must outlive a node: the network (stacks/network.py), the node service account
with its grants, the two secrets and the two buckets (stacks/foundation.py), and the billing
guard's account, role and queue (stacks/guard.py), and the deployment's monitoring: the node
account's metric-writer grant, dashboard, alert policies, email channel and opt-in budget
(stacks/monitoring.py; each serving stack registers with it, `add_stack`). Serving stacks find
all of it by name (tpuserve/settings/base_stack.py) and check it exists at plan time
(stacks/preflight.py).

Tearing it down is on purpose only:
- its buckets and secrets carry `lifecycle.prevent_destroy`, so `cdktf destroy base` (or any
  plan that would replace one) stops with Terraform's error naming the resource. Synthesized
  with TPUSERVE_TEARDOWN=<deployment>, the guard is off and destroy may go ahead;
- even then, `terraform_data.teardown_guard`, which depends on every other resource of the
  base and so is destroyed first, runs `python -m tpuserve.base_check teardown`: while a node
  or queued resource of this deployment exists in the region it fails, naming each and the
  `cdktf destroy STACK` that removes it, and nothing else of the base is destroyed
  (TPUSERVE_BASE_FORCE=1 at destroy lists them and goes ahead).
"""

from __future__ import annotations

from tpuserve import contracts
from tpuserve.planner.base_cost import dormant_base
from tpuserve.settings import Deployment
from tpuserve.settings.base_stack import BASE_STACK, Base

from .cdk import Construct, DataResource, LocalExecProvisioner, TerraformOutput
from .foundation import Foundation
from .guard import BillingGuard
from .literals import tf_ref
from .local_exec import python_module, repo_root
from .monitoring import Monitoring
from .network import Network
from .stack import TpuserveStack

BASE_CHECK = python_module(contracts.BASE_CHECK)


class BaseStack(TpuserveStack):
    def __init__(self, scope: Construct, base: Base, *, teardown: bool = False) -> None:
        super().__init__(scope, BASE_STACK, base)
        b = base
        self.base = b
        self.network = Network(self, "network", base=b)
        self.foundation = Foundation(self, "foundation", base=b, protect=not teardown)
        self.guard = BillingGuard(self, "billing_guard_identity", base=b)
        self.monitoring = Monitoring(
            self, "monitoring", base=b,
            node_member=f"serviceAccount:{self.foundation.service_account.email}")
        guard = DataResource(
            self, contracts.TEARDOWN_GUARD_ID,
            # The destroy provisioner may read only `self`.
            input={"project": b.project, "deployment": b.deployment, "region": b.region},
            provisioners=[LocalExecProvisioner(
                type="local-exec", when="destroy", command=f"{BASE_CHECK} teardown",
                working_dir=repo_root(),
                environment={
                    contracts.BASE_PROJECT_ENV: tf_ref("self.input.project"),
                    contracts.BASE_DEPLOYMENT_ENV: tf_ref("self.input.deployment"),
                    contracts.BASE_REGION_ENV: tf_ref("self.input.region"),
                },
            )],
            # Destroyed first (it depends on everything): a refusal stops the whole teardown.
            depends_on=[*self.network.resources, *self.foundation.resources,
                        *self.guard.resources, *self.monitoring.resources],
        )
        guard.override_logical_id(contracts.TEARDOWN_GUARD_ID)
        self.teardown_guard = guard
        self._outputs(b)

    def add_stack(self, d: Deployment) -> None:
        """A serving stack of this deployment: the monitoring covers it (stacks/serving.py)."""
        created = self.monitoring.add_stack(d)
        if created:  # the teardown guard is still destroyed first
            self.teardown_guard.depends_on = [
                *(self.teardown_guard.depends_on or []),
                *(f"{r.terraform_resource_type}.{r.friendly_unique_id}" for r in created)]

    def _outputs(self, b: Base) -> None:
        def out(name: str, value: object, description: str) -> None:
            TerraformOutput(self, name, value=value, description=description)

        out("deployment", b.deployment, "The deployment every serving stack's names start with")
        out("node_service_account", b.node_service_account_email,
            "Every TPU node of the deployment runs as this account")
        out("hf_token_secret", b.hf_token_secret_id,
            "Add the Hugging Face token once: gcloud secrets versions add "
            f"{b.hf_token_secret_id} --data-file=-")
        out("api_key_secret", b.api_key_secret_id,
            f"Add the API key once: gcloud secrets versions add {b.api_key_secret_id} "
            "--data-file=-")
        out("cache_bucket", b.cache_bucket,
            "The XLA compile cache every stack shares (a same-key node boots warm)")
        out("weights_bucket", b.weights_bucket, "Where the fleet stages the model's weights")
        dormant = dormant_base()
        out(contracts.DORMANT_OUTPUT, round(dormant.usd_per_month, 4),
            "What the base costs with no serving stack: one compile cache and two secret "
            "versions at list prices (more caches or staged weights add storage; "
            "`tpuserve plan`)")
