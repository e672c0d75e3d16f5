"""Foundation construct: what every stack's TPU VM stands on.

A dedicated service account with only what the VM needs, the Secret Manager secrets it may
read (HF token, API key), the compile-cache bucket it may read and write, and the firewall
rules on the deployment's network. The node's account holds nothing on the TPU API: the
billing guard lives off the node (stacks/guard.py). No secret VALUE ever passes through here:
versions are added out of band (README), so none lands in state or plans.
"""

from __future__ import annotations

from tpuserve.facts import CLOUD_PLATFORM_SCOPE, IAP_RANGE
from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    GoogleComputeFirewall,
    GoogleComputeFirewallAllow,
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
)
from .network import Network

# Secret Manager accepts only the cloud-platform scope, so IAM (not scopes) is the fence.
VM_SCOPES = [CLOUD_PLATFORM_SCOPE]


class Foundation(Construct):
    """Service account, secrets, cache bucket, IAM and firewall for one stack."""

    def __init__(self, scope: Construct, id_: str, *, deployment: Deployment,
                 network: Network) -> None:
        super().__init__(scope, id_)
        d = deployment
        self.deployment = d
        # Grants the VM needs before it boots (its depends_on list).
        self.grants: list[object] = []

        self.service_account = GoogleServiceAccount(
            self, "service_account",
            account_id=d.service_account_id,
            display_name=f"tpuserve {d.name}: TPU VM serving {d.vllm.model}",
        )
        self.service_account.override_logical_id("service_account")
        member = f"serviceAccount:{self.service_account.email}"

        replication = GoogleSecretManagerSecretReplication(
            user_managed=GoogleSecretManagerSecretReplicationUserManaged(
                replicas=[
                    GoogleSecretManagerSecretReplicationUserManagedReplicas(
                        location=d.gcp.region
                    )
                ]
            )
        )
        self.secrets: dict[str, GoogleSecretManagerSecret] = {}
        for key, secret_id in (("hf_token", d.hf_token_secret_id),
                               ("api_key", d.api_key_secret_id)):
            if key == "api_key" and not d.access.api_key_proxy:
                continue
            secret = GoogleSecretManagerSecret(
                self, f"{key}_secret",
                secret_id=secret_id,
                replication=replication,
                labels=d.labels,
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

        # Writing logs is project-wide by nature; it is the node's only project-level grant.
        logs = GoogleProjectIamMember(
            self, "log_writer", project=d.gcp.project, role="roles/logging.logWriter",
            member=member,
        )
        logs.override_logical_id("log_writer")
        self.grants.append(logs)

        self.cache_bucket: GoogleStorageBucket | None = None
        if d.cache.enabled:
            self._cache_bucket(d, member)
        self._firewall(d, network)

    def _cache_bucket(self, d: Deployment, member: str) -> None:
        bucket = GoogleStorageBucket(
            self, "cache_bucket",
            name=d.cache_bucket,
            location=d.gcp.region.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=True,  # a cache: destroy must not fail on leftover objects
            labels=d.labels,
            # Unused caches expire, not old ones: every healthy boot that restores or publishes
            # a cache sets its object's customTime to now (templates/boot/cache.sh.j2), so a cache
            # in daily use is never deleted (an `age` rule would force a cold boot, SPEC 4's
            # 685 s of compilation, every retention_days).
            lifecycle_rule=[
                GoogleStorageBucketLifecycleRule(
                    action=GoogleStorageBucketLifecycleRuleAction(type="Delete"),
                    condition=GoogleStorageBucketLifecycleRuleCondition(
                        days_since_custom_time=d.cache.retention_days
                    ),
                )
            ],
        )
        bucket.override_logical_id("cache_bucket")
        # objectUser: read, write and list objects of this one bucket; no bucket admin.
        rw = GoogleStorageBucketIamMember(
            self, "cache_bucket_object_user", bucket=bucket.name,
            role="roles/storage.objectUser", member=member,
        )
        rw.override_logical_id("cache_bucket_object_user")
        self.grants.append(rw)
        self.cache_bucket = bucket

    def _firewall(self, d: Deployment, net: Network) -> None:
        network = net.name
        ssh = GoogleComputeFirewall(
            self, "firewall_ssh",
            name=f"tpuserve-{d.name}-allow-ssh",
            network=network,
            direction="INGRESS",
            allow=[GoogleComputeFirewallAllow(protocol="tcp", ports=["22"])],
            source_ranges=[IAP_RANGE, *d.access.ssh_source_ranges],
            target_tags=[d.network_tag],
            description="SSH from Google's IAP range plus access.ssh_source_ranges",
        )
        ssh.override_logical_id("firewall_ssh")
        if d.access.api_source_ranges:  # closed unless a setting opens it
            api = GoogleComputeFirewall(
                self, "firewall_api",
                name=f"tpuserve-{d.name}-allow-api",
                network=network,
                direction="INGRESS",
                allow=[GoogleComputeFirewallAllow(protocol="tcp", ports=[str(d.vllm.port)])],
                source_ranges=list(d.access.api_source_ranges),
                target_tags=[d.network_tag],
                description="The OpenAI-compatible API from access.api_source_ranges",
            )
            api.override_logical_id("firewall_api")
