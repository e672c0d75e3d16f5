"""Programs Terraform runs at plan time through hashicorp/external, and the base preflight.

Every serving stack reads `data.external.base_preflight` before anything else: it runs
`python -m tpuserve.base_check preflight`, which looks up the base's secrets and buckets by name
through the project's Google API edge. A missing base fails the plan with one line naming the
command that creates it, before any resource of the stack exists. (A provider data source
would do too, but cannot be exercised offline; cdktf's cross-stack references would refuse to
deploy a serving stack alone.)
"""

from __future__ import annotations

from tpuserve import contracts
from tpuserve.settings import Deployment

from .cdk import Construct, TerraformDataSource, TerraformProvider, TerraformStack
from .local_exec import python_module, repo_root

# The one provider besides google-beta: hashicorp/external runs our programs at plan time.
EXTERNAL_PROVIDER_SOURCE = "hashicorp/external"
EXTERNAL_PROVIDER_VERSION = "~> 2.3"
BASE_CHECK = python_module(contracts.BASE_CHECK)
FLEET_CHECK = python_module(contracts.FLEET_CHECK)


def external_provider(stack: TerraformStack) -> TerraformProvider:
    """The stack's hashicorp/external provider (declared once per stack)."""
    found = getattr(stack, "_tpuserve_external", None)
    if found is None:
        found = TerraformProvider(
            stack, "external", terraform_resource_type="external",
            terraform_provider_source=EXTERNAL_PROVIDER_SOURCE,
            terraform_generator_metadata={"provider_name": "external",
                                          "provider_version_constraint":
                                              EXTERNAL_PROVIDER_VERSION},
        )
        stack._tpuserve_external = found  # type: ignore[attr-defined]
    return found


def external_program(scope: Construct, id_: str, command: str,
                     query: dict[str, str]) -> TerraformDataSource:
    """`data.external.<id_>`: `command` run from the repo root with `query` on stdin."""
    source = TerraformDataSource(scope, id_, terraform_resource_type="external",
                                 provider=external_provider(TerraformStack.of(scope)))
    source.override_logical_id(id_)
    # `external` runs a program without a shell; sh expands the interpreter variable.
    source.add_override("program", ["sh", "-c", f"exec {command}"])
    source.add_override("working_dir", repo_root())
    source.add_override("query", query)
    return source


def base_preflight(scope: Construct, d: Deployment) -> TerraformDataSource:
    """The plan-time check that the deployment's base exists (by name)."""
    b = d.base
    return external_program(scope, "base_preflight", f"{BASE_CHECK} preflight", {
        "project": b.project,
        "deployment": b.deployment,
        "region": b.region,
        "secrets": ",".join(b.secret_ids),
        "buckets": ",".join(b.buckets),
        "service_accounts": b.node_service_account_email,
        "base_command": "cdktf deploy base",
    })


def fleet_preflight(scope: Construct, d: Deployment, *, machine_type: str,
                    min_master_version: str, apis: list[str]) -> TerraformDataSource:
    """The fleet's plan-time check: its TPU quota, its channel's versions, its APIs."""
    f = d.fleet
    return external_program(scope, "fleet_preflight", f"{FLEET_CHECK} preflight", {
        "project": d.gcp.project,
        "region": d.gcp.region,
        "zone": d.gcp.zone,
        "cluster": d.node_name,
        "release_channel": f.release_channel,
        "min_master_version": min_master_version,
        "machine_type": machine_type,
        "provisioning": ",".join(f.provisioning),
        "min_replicas": str(f.min_replicas),
        "max_replicas": str(f.max_replicas),
        "apis": ",".join(apis),
    })
