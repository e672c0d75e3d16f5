"""The billing guard of the spot and on-demand stacks, off the node.

Spot and on-demand TPU VMs bill until deleted, and the TPU API has no Google-side end time for
them: a Node's `SchedulingConfig` holds preemptible, spot and reserved (v2alpha1 adds a
provisioning model and a reservation name), no end time; a queued resource's `runDuration` is
accepted for flex-start only (SPEC 2). So the deadline is a one-shot Cloud Tasks task: at the
node's `createTime + max_run_hours` it calls the TPU API's `DELETE projects/P/locations/Z/
nodes/N` with an OAuth token of a guard service account.

- The guard service account holds `tpu.nodes.delete` (and `get`) through a project custom
  role: TPU nodes have no per-node IAM, so the narrowest grant is project-wide. No node runs
  as it, and no node may act as it: the node's service account is granted nothing on it, on
  the queue, or on Cloud Tasks. A compromised node can no longer delete any node.
- The task is created after the node exists, by a `terraform_data` provisioner running
  `python -m tpuserve.billing_guard arm` (as the flex stack drives its queued resource), which
  reads the node's createTime from the TPU API: no Terraform-side timestamp, so a plan of an
  unchanged stack is empty. `tpuserve recover` re-arms it; destroy disarms it.
- The task calls https://tpu.googleapis.com/, or the Private Service Connect endpoint set as
  `[gcp] tpu_api_endpoint`; never an endpoint override of the deploying shell, which would
  get the guard account's token and never the delete.
- Why Cloud Tasks and not Cloud Scheduler: a task fires once at an exact time; a Scheduler job
  is a cron schedule that would fire again a year later, against whatever node then has the
  name. Cloud Tasks schedules at most 30 days ahead, hence stack.max_run_hours <= 720.

The queue and the guard identity are named for the deployment and live in the base stack
(stacks/base.py); each VM stack arms and disarms its own node's task.
"""

from __future__ import annotations

from tpuserve.settings.base_stack import Base

from .cdk import (
    Construct,
    GoogleCloudTasksQueue,
    GoogleCloudTasksQueueRateLimits,
    GoogleCloudTasksQueueRetryConfig,
    GoogleCloudTasksQueueStackdriverLoggingConfig,
    GoogleProjectIamCustomRole,
    GoogleProjectIamMember,
    GoogleServiceAccount,
)

# What the guard's task needs: delete the node (and read it, to tell a retry it is gone).
GUARD_PERMISSIONS = ["tpu.nodes.delete", "tpu.nodes.get"]


class BillingGuard(Construct):
    """The guard's service account, its one role, and the queue its tasks wait in."""

    def __init__(self, scope: Construct, id_: str, *, base: Base) -> None:
        super().__init__(scope, id_)
        d = base
        self.service_account = GoogleServiceAccount(
            self, "guard_service_account",
            account_id=d.guard_service_account_id,
            display_name=f"tpuserve {d.deployment}: billing guard (deletes expired nodes)",
            description="Cloud Tasks calls the TPU API's node delete as this account; no TPU "
                        "node runs as it or may act as it",
        )
        self.service_account.override_logical_id("guard_service_account")
        role = GoogleProjectIamCustomRole(
            self, "guard_role",
            role_id=d.guard_role_id,
            title=f"tpuserve {d.deployment} billing guard",
            description="Delete a TPU node at its deadline (TPU has no per-node IAM)",
            permissions=GUARD_PERMISSIONS,
        )
        role.override_logical_id("guard_role")
        grant = GoogleProjectIamMember(
            self, "guard_grant", project=d.project, role=role.name,
            member=f"serviceAccount:{self.service_account.email}",
        )
        grant.override_logical_id("guard_grant")
        self.queue = GoogleCloudTasksQueue(
            self, "guard_queue",
            name=d.guard_queue.rsplit("/", 1)[1],
            location=d.region,
            # One delete at a time; a failed one (a node being created, an API hiccup) is
            # retried with backoff for a day. A 404 (already gone) also ends in the retries.
            rate_limits=GoogleCloudTasksQueueRateLimits(max_concurrent_dispatches=1),
            retry_config=GoogleCloudTasksQueueRetryConfig(
                max_attempts=50, max_retry_duration="86400s", min_backoff="30s",
                max_backoff="1800s", max_doublings=5,
            ),
            # Every attempt in Cloud Logging: the audit trail of what the guard deleted.
            stackdriver_logging_config=GoogleCloudTasksQueueStackdriverLoggingConfig(
                sampling_ratio=1.0
            ),
        )
        self.queue.override_logical_id("guard_queue")
        # What an armed task needs to exist before it is created.
        self.resources: list[object] = [self.service_account, grant, self.queue]
