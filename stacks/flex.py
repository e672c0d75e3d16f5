"""The flex-start stack: the foundation plus a queued resource whose lifecycle Terraform drives.

No provider resource can express a flex-start queued resource (issue 3), so a `terraform_data`
resource holds the QR's whole spec and its provisioners call the project's own client:

- create: `python -m tpuserve.queued_resource create`, which returns once the QR is ACCEPTED
  (ACTIVE can take long: `tpuserve wait flex` waits for it and prints the endpoint);
- destroy: `python -m tpuserve.queued_resource delete`, with force, waiting until it is gone.
  A destroy provisioner may only reference `self`, so every input it needs lives in the
  resource's own `input`.

Any change of the body replaces the resource (its sha256 is in triggers_replace). A QR that
went SUSPENDED (run duration over) or FAILED, or was deleted by hand, is detected at plan
time: `data.external.qr_probe` runs `python -m tpuserve.queued_resource probe`, which answers
with the generation label the live QR was created with, or a fresh token when it is dead or
missing. The token is in triggers_replace too, so the plan replaces the QR exactly when it is
dead and is a no-op otherwise; the create provisioner writes the token into the node labels.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tpuserve.gcp.provisioner import ENV_BODY, ENV_GENERATION, ENV_NAME
from tpuserve.render.queued_resource_body import build_body
from tpuserve.settings import Deployment

from .base import ServingStack
from .cdk import (
    Construct,
    DataResource,
    LocalExecProvisioner,
    TerraformDataSource,
    TerraformProvider,
)
from .literals import tf_ref
from .local_exec import python_module, repo_root

# The one provider besides google-beta: hashicorp/external runs the probe at plan time.
EXTERNAL_PROVIDER_SOURCE = "hashicorp/external"
EXTERNAL_PROVIDER_VERSION = "~> 2.3"
CLIENT = python_module("tpuserve.queued_resource")
# The body reaches the create step as one environment string; Linux caps one at 128 KiB
# (MAX_ARG_STRLEN), and Terraform's jsonencode escapes <, > and & to six characters each.
MAX_BODY_CHARS = 100_000


def spec_sha256(name: str, body: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps({"name": name, "body": body}, sort_keys=True).encode()
    ).hexdigest()


class FlexStack(ServingStack):
    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
        d = deployment
        root = repo_root()
        body = build_body(d, self.startup_script)
        size = len(json.dumps(body))
        if size > MAX_BODY_CHARS:
            raise ValueError(
                f"the flex queued-resource body is {size:,} characters: at most "
                f"{MAX_BODY_CHARS:,} fit the create step's environment (Linux caps one "
                "variable at 128 KiB); shorten the boot script (templates/boot/)"
            )

        external = TerraformProvider(
            self, "external", terraform_resource_type="external",
            terraform_provider_source=EXTERNAL_PROVIDER_SOURCE,
            terraform_generator_metadata={"provider_name": "external",
                                          "provider_version_constraint":
                                              EXTERNAL_PROVIDER_VERSION},
        )
        probe = TerraformDataSource(self, "qr_probe", terraform_resource_type="external",
                                    provider=external)
        probe.override_logical_id("qr_probe")
        # `external` runs a program without a shell; sh expands the interpreter variable.
        probe.add_override("program", ["sh", "-c", f"exec {CLIENT} probe"])
        probe.add_override("working_dir", root)
        probe.add_override("query", {"name": d.queued_resource_name})

        self.queued_resource = DataResource(
            self, "queued_resource",
            # Everything the destroy provisioner needs, since it may only read `self`.
            input={"name": d.queued_resource_name, "body": body},
            triggers_replace={
                "spec_sha256": spec_sha256(d.queued_resource_name, body),
                "generation": tf_ref("data.external.qr_probe.result.generation"),
            },
            provisioners=[
                LocalExecProvisioner(
                    type="local-exec", command=f"{CLIENT} create", working_dir=root,
                    # The body holds no secret: the startup script fetches them at boot.
                    environment={
                        ENV_NAME: tf_ref("self.input.name"),
                        ENV_BODY: tf_ref("jsonencode(self.input.body)"),
                        ENV_GENERATION: tf_ref("self.triggers_replace.generation"),
                    },
                ),
                LocalExecProvisioner(
                    type="local-exec", when="destroy", command=f"{CLIENT} delete",
                    working_dir=root, environment={ENV_NAME: tf_ref("self.input.name")},
                ),
            ],
            # The node must not boot before it may read its secrets and write its cache, nor
            # before its network exists.
            depends_on=[self.foundation.service_account, *self.foundation.grants,
                        *self.network.resources],
        )
        self.queued_resource.override_logical_id("queued_resource")

        self.common_outputs(None)
        hours = d.stack.max_run_seconds / 3600
        self.output("queued_resource_id", d.node_name,
                    "The flex-start queued resource (TPU API v2alpha1)")
        self.output("max_run_duration", d.stack.max_run_duration,
                    "The node deletes itself after this long (SPEC 2)")
        self.output("max_run_cost_usd", round(d.usd_per_hour * hours, 4),
                    "The most one run can cost: flex-start stops billing by itself (SPEC 7)")
        self.output("endpoint_command", f"tpuserve wait {d.name}",
                    "Waits for ACTIVE and prints the endpoint (the IP is known only then); "
                    f"later: tpuserve endpoint {d.name}")
