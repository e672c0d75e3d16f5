"""The spot and on-demand stacks: one google_tpu_v2_vm each; only scheduling differs.

Both bill until deleted, so each carries the billing guard (stacks/guard.py; its account and
queue are the base's): after the node exists, `terraform_data.billing_guard` arms a Cloud Tasks
task that deletes it at createTime + stack.max_run_hours, and disarms it on destroy.

A settings change that only changes the node's metadata (the boot script: vLLM flags, the
proxy, the cache) is an in-place update of `metadata` (google-beta 6.50.0: not ForceNew), and
the node's watcher re-runs the changed boot script in place (templates/boot/): the node, its
capacity and its IP stay; vLLM restarts, warm when the compile-cache key is unchanged.
"""

from __future__ import annotations

from tpuserve import contracts
from tpuserve.contracts import GUARD_NODE_ENV as ENV_NODE
from tpuserve.contracts import GUARD_QUEUE_ENV as ENV_QUEUE
from tpuserve.contracts import GUARD_SECONDS_ENV as ENV_SECONDS
from tpuserve.contracts import GUARD_SERVICE_ACCOUNT_ENV as ENV_SERVICE_ACCOUNT
from tpuserve.contracts import GUARD_TPU_ENDPOINT_ENV as ENV_TPU_ENDPOINT
from tpuserve.render.guard_task import guard_target
from tpuserve.render.node_metadata import node_metadata
from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    DataResource,
    GoogleTpuV2Vm,
    GoogleTpuV2VmNetworkConfig,
    GoogleTpuV2VmSchedulingConfig,
    GoogleTpuV2VmServiceAccount,
    GoogleTpuV2VmShieldedInstanceConfig,
    LocalExecProvisioner,
)
from .foundation import VM_SCOPES
from .literals import tf_ref
from .local_exec import python_module, repo_root
from .serving import ServingStack

GUARD_CLIENT = python_module(contracts.BILLING_GUARD)


class TpuVmStack(ServingStack):
    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
        d = deployment
        self.tpu_node = GoogleTpuV2Vm(
            self, contracts.TPU_NODE_ID,
            name=d.node_name,
            zone=d.gcp.zone,
            # Explicit: the provider silently defaults to v2-8.
            accelerator_type=d.tpu.accelerator_type,
            runtime_version=d.tpu.runtime_version,
            scheduling_config=GoogleTpuV2VmSchedulingConfig(
                spot=d.kind.spot
            ),
            network_config=GoogleTpuV2VmNetworkConfig(
                network=d.network_name, subnetwork=d.subnet_name,
                enable_external_ips=True,
            ),
            shielded_instance_config=GoogleTpuV2VmShieldedInstanceConfig(enable_secure_boot=True),
            service_account=GoogleTpuV2VmServiceAccount(email=d.service_account_email,
                                                        scope=VM_SCOPES),
            tags=[d.network_tag],
            labels=d.labels,
            # Plain text: the stack's one escape pass (stacks/literals.py) escapes it.
            metadata=node_metadata(self.startup_script),
            # Read at plan time: a missing base stops the plan before anything is created.
            depends_on=[self.preflight],
        )
        self.tpu_node.override_logical_id(contracts.TPU_NODE_ID)
        self._billing_guard(d)
        ip = self.tpu_node.network_endpoints.get(0).access_config.get(0).external_ip
        self.common_outputs(ip)

    def _billing_guard(self, d: Deployment) -> None:
        target = guard_target(d)
        if target is None:
            return
        spec = {"node": target.node, "queue": target.queue,
                "service_account": target.service_account,
                "max_run_seconds": str(target.max_run_seconds),
                # The root the task calls, from [gcp] tpu_api_endpoint (validated): always set,
                # so no TPUSERVE_GUARD_TPU_ENDPOINT of the deploying shell reaches the task.
                "tpu_endpoint": target.tpu_endpoint}
        env = {ENV_NODE: tf_ref("self.input.node"), ENV_QUEUE: tf_ref("self.input.queue"),
               ENV_SERVICE_ACCOUNT: tf_ref("self.input.service_account"),
               ENV_SECONDS: tf_ref("self.input.max_run_seconds")}
        # Disarm builds no task, and a state armed before the endpoint existed has no
        # input.tpu_endpoint for its destroy provisioner to read.
        arm_env = {**env, ENV_TPU_ENDPOINT: tf_ref("self.input.tpu_endpoint")}
        arming = DataResource(
            self, contracts.BILLING_GUARD_ID,
            # Everything the destroy provisioner needs, since it may only read `self`.
            input=spec,
            # A new node (its id is unknown until it is created, so any create or replace of
            # the node replaces this) or a new guard setting re-arms; an unchanged stack plans
            # nothing. The deadline itself comes from the node's createTime, read at arming.
            triggers_replace={**spec, "node_id": self.tpu_node.id},
            provisioners=[
                LocalExecProvisioner(type="local-exec", command=f"{GUARD_CLIENT} arm",
                                     working_dir=repo_root(), environment=arm_env),
                LocalExecProvisioner(type="local-exec", when="destroy",
                                     command=f"{GUARD_CLIENT} disarm", working_dir=repo_root(),
                                     environment=env),
            ],
            depends_on=[self.tpu_node],
        )
        arming.override_logical_id(contracts.BILLING_GUARD_ID)
