"""The spot and on-demand stacks: one google_tpu_v2_vm each; only scheduling differs."""

from __future__ import annotations

from tpuserve.config import Deployment
from tpuserve.node_metadata import node_metadata

from .base import ServingStack
from .cdk import (
    Construct,
    GoogleTpuV2Vm,
    GoogleTpuV2VmNetworkConfig,
    GoogleTpuV2VmSchedulingConfig,
    GoogleTpuV2VmServiceAccount,
)
from .foundation import VM_SCOPES


class TpuVmStack(ServingStack):
    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
        d = deployment
        sa = self.foundation.service_account
        self.tpu_node = GoogleTpuV2Vm(
            self, "tpu_node",
            name=d.node_name,
            zone=d.gcp.zone,
            # Explicit: the provider silently defaults to v2-8.
            accelerator_type=d.tpu.accelerator_type,
            runtime_version=d.tpu.runtime_version,
            scheduling_config=GoogleTpuV2VmSchedulingConfig(
                spot=d.stack.provisioning_model == "spot"
            ),
            network_config=GoogleTpuV2VmNetworkConfig(
                network=d.gcp.network, enable_external_ips=True
            ),
            service_account=GoogleTpuV2VmServiceAccount(email=sa.email, scope=VM_SCOPES),
            tags=[d.network_tag],
            labels=d.labels,
            # Plain text: the stack's one escape pass (stacks/literals.py) escapes it.
            metadata=node_metadata(self.startup_script),
            # The VM must not boot before it may read its secrets and write its cache.
            depends_on=self.foundation.grants,
        )
        self.tpu_node.override_logical_id("tpu_node")
        ip = self.tpu_node.network_endpoints.get(0).access_config.get(0).external_ip
        self.common_outputs(ip)
