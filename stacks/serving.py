"""What every serving stack shares: the provider, the base preflight, the firewall, the outputs
(the dashboard's URL among them), and its registration with the base's monitoring.

A serving stack (`spot`, `ondemand`, `flex`) holds only its compute and what is specific to it:
the node (or queued resource), its firewall rules and, for the VM stacks, the arming of its
billing guard. Everything long-lived is the base's (stacks/base.py), found by name, so
`cdktf deploy NAME` and `cdktf destroy NAME` work alone and destroy keeps the compile cache
and the secrets.
"""

from __future__ import annotations

from tpuserve import contracts
from tpuserve.render.boot_script import render_startup
from tpuserve.render.dashboard import stack_dashboard_url
from tpuserve.settings import Deployment
from tpuserve.settings.base_stack import BASE_STACK

from .cdk import Construct, TerraformOutput
from .firewall import Firewall
from .preflight import base_preflight
from .stack import TpuserveStack


class ServingStack(TpuserveStack):
    """A serving stack: `cdktf deploy NAME` and `cdktf destroy NAME` work alone."""

    # The VM stacks' node rules (IAP SSH, and the API port when access.api_source_ranges opens
    # it). The fleet's GKE nodes need neither: it sets this False and opens its own port only.
    VM_FIREWALL = True

    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        d = deployment
        super().__init__(scope, d.name, d.base, zone=d.gcp.zone)
        self.deployment = d
        self.preflight = base_preflight(self, d)
        if self.VM_FIREWALL:
            Firewall(self, "firewall", deployment=d)
        self.startup_script = render_startup(d)
        # The base's monitoring (dashboard line, alerts, budget) covers this stack; found by
        # name in the app, like everything else of the base (no cross-stack reference).
        base = scope.node.try_find_child(BASE_STACK)
        if base is not None and hasattr(base, "add_stack"):
            base.add_stack(d)
        self.output("dashboard_url", stack_dashboard_url(d),
                    "The deployment's Cloud Monitoring dashboard (this stack's lines, its "
                    "alerts' incidents)")

    def output(self, name: str, value: object, description: str) -> None:
        TerraformOutput(self, name, value=value, description=description)

    def common_outputs(self, external_ip: str | None) -> None:
        """external_ip None: Terraform never sees the node (flex: it comes later, by itself)."""
        d = self.deployment
        self.output("node_name", d.node_name, "TPU node name")
        self.output("zone", d.gcp.zone, "TPU zone")
        if external_ip is not None:
            self.output("external_ip", external_ip,
                        "The node's external IP (changes on recreate)")
            scheme = "https" if d.access.tls_on else "http"
            self.output("endpoint", f"{scheme}://{external_ip}:{d.vllm.port}/v1",
                        "OpenAI-compatible base URL (https: pin the node's certificate, "
                        "`tpuserve endpoint`)")
            # SPEC 3: `gcloud compute tpus tpu-vm ssh` fails in some sandboxes; plain ssh works.
            self.output("ssh_command", f"ssh {external_ip}", "SSH to the node by its IP")
        self.output(contracts.USD_PER_HOUR_OUTPUT, round(d.usd_per_hour, 4),
                    f"{d.stack.provisioning_model} price, $/hour (SPEC 2)")

