"""Foundation construct: what every node of a deployment stands on, held by the base stack.

One service account that every node of the deployment runs as, with only what a node needs:
the two Secret Manager secrets (HF token, API key) it may read, the compile-cache bucket it may
read and write (one bucket for every stack: the cache key, not the stack, says when two nodes
compile the same programs), and log writing. The weights bucket the fleet stages the model into
is here too; no node account may touch it. The node's account holds nothing on the TPU API: the
billing guard lives off the node (stacks/guard.py). No secret VALUE ever passes through here:
versions are added out of band (README), so none lands in state or plans.

Buckets and secrets are what a lost state would orphan and a careless destroy would lose
(the compile cache: SPEC 4's 685 s of compilation per cold boot): `lifecycle.prevent_destroy`
holds them unless the base is synthesized for a teardown on purpose (stacks/base.py).
"""

from __future__ import annotations

from tpuserve.facts import CLOUD_PLATFORM_SCOPE
from tpuserve.settings.base_stack import Base

from .cdk import (
    Construct,
    GoogleProjectIamMember,
    GoogleSecretManagerSecret,
    GoogleSecretManagerSecretIamMember,
    GoogleSecretManagerSecretReplication,
    GoogleSecretManagerSecretReplicationUserManaged,
    GoogleSecretManagerSecretReplicationUserManagedReplicas,
    GoogleServiceAccount,
    GoogleStorageBucket,
    GoogleStorageBucketIamMember,
    GoogleStorageBucketLifecycleRule,
    GoogleStorageBucketLifecycleRuleAction,
    GoogleStorageBucketLifecycleRuleCondition,
    TerraformResourceLifecycle,
)

# Secret Manager accepts only the cloud-platform scope, so IAM (not scopes) is the fence.
VM_SCOPES = [CLOUD_PLATFORM_SCOPE]


class Foundation(Construct):
    """The node service account, the secrets, the two buckets, and the node's grants on them."""

    def __init__(self, scope: Construct, id_: str, *, base: Base, protect: bool) -> None:
        super().__init__(scope, id_)
        b = base
        self.base = b
        # prevent_destroy: Terraform refuses a plan that would delete (or replace) the resource.
        self._lifecycle = TerraformResourceLifecycle(prevent_destroy=protect)
        self.grants: list[object] = []

        self.service_account = GoogleServiceAccount(
            self, "service_account",
            account_id=b.node_service_account_id,
            display_name=f"tpuserve {b.deployment}: the TPU nodes (every serving stack)",
        )
        self.service_account.override_logical_id("service_account")
        member = f"serviceAccount:{self.service_account.email}"

        replication = GoogleSecretManagerSecretReplication(
            user_managed=GoogleSecretManagerSecretReplicationUserManaged(
                replicas=[
                    GoogleSecretManagerSecretReplicationUserManagedReplicas(location=b.region)
                ]
            )
        )
        self.secrets: dict[str, GoogleSecretManagerSecret] = {}
        # Both, always: a stack that turns the API-key proxy on later finds its secret.
        for key, secret_id in (("hf_token", b.hf_token_secret_id),
                               ("api_key", b.api_key_secret_id)):
            secret = GoogleSecretManagerSecret(
                self, f"{key}_secret",
                secret_id=secret_id,
                replication=replication,
                labels=b.labels,
                lifecycle=self._lifecycle,
            )
            secret.override_logical_id(f"{key}_secret")
            access = GoogleSecretManagerSecretIamMember(
                self, f"{key}_secret_accessor",
                secret_id=secret.id,
                role="roles/secretmanager.secretAccessor",
                member=member,
            )
            access.override_logical_id(f"{key}_secret_accessor")
            self.grants.append(access)
            self.secrets[key] = secret

        # Writing logs (and metrics: stacks/monitoring.py) is project-wide by nature; these are
        # the node's only project-level grants.
        logs = GoogleProjectIamMember(
            self, "log_writer", project=b.project, role="roles/logging.logWriter",
            member=member,
        )
        logs.override_logical_id("log_writer")
        self.grants.append(logs)

        self.cache_bucket = self._cache_bucket(b, member)
        self.weights_bucket = self._bucket(
            "weights_bucket", b.weights_bucket,
            # Re-staging the weights is minutes of download: deleting them by accident costs
            # little, but keeping them forever costs the bytes; they are replaced, not aged.
            lifecycle_rule=None,
        )

    def _bucket(self, id_: str, name: str, *,
                lifecycle_rule: list[GoogleStorageBucketLifecycleRule] | None,
                ) -> GoogleStorageBucket:
        b = self.base
        bucket = GoogleStorageBucket(
            self, id_,
            name=name,
            location=b.region.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            # Destroy empties it: only a teardown on purpose gets that far (prevent_destroy).
            force_destroy=True,
            labels=b.labels,
            lifecycle_rule=lifecycle_rule,
            lifecycle=self._lifecycle,
        )
        bucket.override_logical_id(id_)
        return bucket

    def _cache_bucket(self, b: Base, member: str) -> GoogleStorageBucket:
        # Unused caches expire, not old ones: every healthy boot that restores or publishes
        # a cache sets its object's customTime to now (templates/boot/cache.sh.j2), so a cache
        # in daily use is never deleted (an `age` rule would force a cold boot, SPEC 4's
        # 685 s of compilation, every retention_days).
        bucket = self._bucket("cache_bucket", b.cache_bucket, lifecycle_rule=[
            GoogleStorageBucketLifecycleRule(
                action=GoogleStorageBucketLifecycleRuleAction(type="Delete"),
                condition=GoogleStorageBucketLifecycleRuleCondition(
                    days_since_custom_time=b.cache.retention_days
                ),
            )
        ])
        # objectUser: read, write and list objects of this one bucket; no bucket admin.
        rw = GoogleStorageBucketIamMember(
            self, "cache_bucket_object_user", bucket=bucket.name,
            role="roles/storage.objectUser", member=member,
        )
        rw.override_logical_id("cache_bucket_object_user")
        self.grants.append(rw)
        return bucket

    @property
    def resources(self) -> list[object]:
        return [self.service_account, *self.secrets.values(), self.cache_bucket,
                self.weights_bucket, *self.grants]
