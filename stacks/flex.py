"""The flex-start stack: the foundation plus a queued resource whose lifecycle Terraform drives.

No provider resource can express a flex-start queued resource, so a `terraform_data`
resource holds the QR's whole spec and its provisioners call the project's own client:

- create: `python -m tpuserve.queued_resource create`, which returns once the QR is ACCEPTED
  (ACTIVE can take long: `tpuserve wait flex` waits for it and prints the endpoint);
- destroy: `python -m tpuserve.queued_resource delete`, with force, waiting until it is gone.
  A destroy provisioner may only reference `self`, so every input it needs lives in the
  resource's own `input`.

A change of the body's node metadata (the boot script: vLLM flags, proxy, cache) does NOT
replace the QR, which would give up its capacity: `spec_sha256` hashes the body without it, and
`terraform_data.node_metadata` (replaced when the metadata or the QR changes) runs
`python -m tpuserve.queued_resource converge`, which patches the running node's metadata
through the TPU API (its watcher then re-runs the boot script in place), or re-queues a QR
that is still waiting (only its place in the queue is lost). Any other change of the body
replaces the QR. A QR that
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

from tpuserve import contracts
from tpuserve.contracts import MAX_ENV_CHARS
from tpuserve.contracts import QR_BODY_GZ_ENV as ENV_BODY_GZ
from tpuserve.contracts import QR_GENERATION_ENV as ENV_GENERATION
from tpuserve.contracts import QR_NAME_ENV as ENV_NAME
from tpuserve.render.queued_resource_body import (
    body_metadata,
    body_without_metadata,
    build_body,
)
from tpuserve.settings import Deployment

from .cdk import Construct, DataResource, LocalExecProvisioner
from .literals import tf_ref
from .local_exec import base64gzip_chars, python_module, repo_root
from .preflight import external_program
from .serving import ServingStack

CLIENT = python_module(contracts.QUEUED_RESOURCE)
# The body reaches the create and converge steps as one environment string, gzipped and
# base64-coded (the boot script alone is over 100 KB of text; it compresses about 2.3x).
MAX_BODY_GZ_CHARS = MAX_ENV_CHARS


def _sha256(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def spec_sha256(name: str, body: dict[str, Any]) -> str:
    """What replaces the QR when it changes: the whole body but the node's metadata."""
    return _sha256({"name": name, "body": body_without_metadata(body)})


def metadata_sha256(body: dict[str, Any]) -> str:
    """What re-converges the running node in place when it changes."""
    return _sha256(body_metadata(body))


class FlexStack(ServingStack):
    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
        d = deployment
        root = repo_root()
        body = build_body(d, self.startup_script)
        size = base64gzip_chars(json.dumps(body))
        if size > MAX_BODY_GZ_CHARS:
            raise ValueError(
                f"the flex queued-resource body is {size:,} characters gzipped and "
                f"base64-coded: at most {MAX_BODY_GZ_CHARS:,} fit the create step's environment "
                "(Linux caps one variable at 128 KiB); shorten the boot script (templates/boot/)"
            )

        probe = external_program(self, "qr_probe", f"{CLIENT} probe",
                                 {"name": d.queued_resource_name})
        generation = tf_ref("data.external.qr_probe.result.generation")
        self.queued_resource = DataResource(
            self, contracts.QUEUED_RESOURCE_ID,
            # Everything the destroy provisioner needs, since it may only read `self`. An
            # input change alone (new metadata) is an in-place update: no provisioner runs.
            input={"name": d.queued_resource_name, "body": body},
            triggers_replace={
                "spec_sha256": spec_sha256(d.queued_resource_name, body),
                "generation": generation,
            },
            provisioners=[
                LocalExecProvisioner(
                    type="local-exec", command=f"{CLIENT} create", working_dir=root,
                    # The body holds no secret: the startup script fetches them at boot.
                    environment={
                        ENV_NAME: tf_ref("self.input.name"),
                        ENV_BODY_GZ: tf_ref("base64gzip(jsonencode(self.input.body))"),
                        ENV_GENERATION: tf_ref("self.triggers_replace.generation"),
                    },
                ),
                LocalExecProvisioner(
                    type="local-exec", when="destroy", command=f"{CLIENT} delete",
                    working_dir=root, environment={ENV_NAME: tf_ref("self.input.name")},
                ),
            ],
            # Read at plan time: a missing base stops the plan before anything is created.
            depends_on=[self.preflight, probe],
        )
        self.queued_resource.override_logical_id(contracts.QUEUED_RESOURCE_ID)

        node_metadata = DataResource(
            self, contracts.NODE_METADATA_ID,
            input={"name": d.queued_resource_name, "body": body, "generation": generation},
            # New metadata, or a new QR (whose node already boots with it: converge finds
            # nothing to do), re-runs the provisioner; nothing else does.
            triggers_replace={"metadata_sha256": metadata_sha256(body),
                              "queued_resource": self.queued_resource.id},
            provisioners=[LocalExecProvisioner(
                type="local-exec", command=f"{CLIENT} converge", working_dir=root,
                environment={
                    ENV_NAME: tf_ref("self.input.name"),
                    ENV_BODY_GZ: tf_ref("base64gzip(jsonencode(self.input.body))"),
                    ENV_GENERATION: tf_ref("self.input.generation"),
                },
            )],
        )
        node_metadata.override_logical_id(contracts.NODE_METADATA_ID)

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
