"""What every stack shares: the provider, the foundation and the common outputs."""

from __future__ import annotations

from tpuserve.render.boot_script import render_startup
from tpuserve.settings import Deployment

from .cdk import (
    Aspects,
    Construct,
    GcsBackend,
    GoogleBetaProvider,
    LocalBackend,
    TerraformOutput,
    TerraformStack,
)
from .foundation import Foundation
from .literals import TerraformLiterals
from .network import Network
from .provider_binding import BindGoogleProvider


class ServingStack(TerraformStack):
    """A self-contained stack: `cdktf deploy NAME` and `cdktf destroy NAME` work alone."""

    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment.name)
        # The one Terraform escape pass: every string of this stack is literal unless it is a
        # reference (stacks/literals.py). No construct escapes anything itself.
        Aspects.of(self).add(TerraformLiterals())
        d = deployment
        self.deployment = d
        if d.state.gcs_bucket:
            # Shared state: a team and the plan-review workflow see the same resources.
            GcsBackend(self, bucket=d.state.gcs_bucket, prefix=f"{d.state.gcs_prefix}/{d.name}")
        else:
            # Relative to cdktf.out/stacks/NAME, where terraform runs: state sits at the repo
            # root and synthesized JSON carries no machine path.
            LocalBackend(self, path=f"../../../terraform.{d.name}.tfstate")
        provider = GoogleBetaProvider(
            self, "google_beta", project=d.gcp.project, region=d.gcp.region, zone=d.gcp.zone,
            default_labels={"managed-by": "tpuserve"},
        )
        Aspects.of(self).add(BindGoogleProvider(provider))
        self.network = Network(self, "network", deployment=d)
        self.foundation = Foundation(self, "foundation", deployment=d, network=self.network)
        self.startup_script = render_startup(d)

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
        self.output("usd_per_hour", round(d.usd_per_hour, 4),
                    f"{d.stack.provisioning_model} price, $/hour (SPEC 2)")
