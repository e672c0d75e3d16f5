"""The long-lived base of one deployment: what must outlive every node, and the names of it all.

One base per deployment (`gcp.deployment`, default `tpuserve`), project and region holds the
network, the node and billing-guard service accounts with their grants, the two Secret Manager
secrets, the compile-cache bucket and the weights bucket. Serving stacks (`spot`, `ondemand`,
`flex`) hold only their compute and find the base by these deterministic names: no cross-stack
reference, so `cdktf deploy flex` and `cdktf destroy flex` work alone and keep the cache and the
secrets.

Every name starts with the deployment name, so two deployments (say `dev` and `prod`, one config
file each) live side by side in one project. The default deployment keeps the state paths and
the node names that stacks had before the base existed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve.contracts import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from tpuserve.settings.sections import CacheSettings, GcpSettings, StateSettings

BASE_STACK = "base"
DEFAULT_DEPLOYMENT = "tpuserve"


@dataclass(frozen=True, eq=False)
class Base:
    """The base's settings (the top-level [gcp], [cache] and [state] of the config). Two are
    the same base when their `identity` is: the zone within the region does not matter."""

    gcp: GcpSettings
    cache: CacheSettings
    state: StateSettings

    # The settings a serving stack must share with its base; a [stacks.NAME] table that
    # changes one is refused (loader): the stack would look for a base that is not there.
    @property
    def identity(self) -> dict[str, object]:
        return {
            "gcp.project": self.gcp.project,
            "gcp.deployment": self.gcp.deployment,
            "region of gcp.zone": self.gcp.region,
            "gcp.network": self.gcp.network,
            "gcp.subnet_cidr": self.gcp.subnet_cidr,
            "cache.retention_days": self.cache.retention_days,
            "state.gcs_bucket": self.state.gcs_bucket,
            "state.gcs_prefix": self.state.gcs_prefix,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Base) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(tuple(self.identity.items()))

    @property
    def deployment(self) -> str:
        return self.gcp.deployment

    @property
    def project(self) -> str:
        return self.gcp.project

    @property
    def region(self) -> str:
        return self.gcp.region

    # --- state: one file (or GCS prefix) per stack and deployment
    def local_state(self, stack: str) -> str:
        """The local state file, relative to the repo root."""
        if self.deployment == DEFAULT_DEPLOYMENT:
            return f"terraform.{stack}.tfstate"
        return f"terraform.{self.deployment}.{stack}.tfstate"

    def gcs_state_prefix(self, stack: str) -> str:
        if self.deployment == DEFAULT_DEPLOYMENT:
            return f"{self.state.gcs_prefix}/{stack}"
        return f"{self.state.gcs_prefix}/{self.deployment}/{stack}"

    # --- network
    @property
    def creates_network(self) -> bool:
        return self.gcp.network is None

    @property
    def network_name(self) -> str:
        return self.gcp.network or f"{self.deployment}-net"

    @property
    def subnet_name(self) -> str | None:
        """The subnet the base creates; None when the user brings a network."""
        return f"{self.deployment}-net-{self.region}" if self.creates_network else None

    # --- identities
    @property
    def node_service_account_id(self) -> str:
        """Every node of the deployment runs as this account (no stack needs another)."""
        return f"{self.deployment}-node"

    @property
    def node_service_account_email(self) -> str:
        return f"{self.node_service_account_id}@{self.project}.iam.gserviceaccount.com"

    @property
    def guard_service_account_id(self) -> str:
        return f"{self.deployment}-guard"

    @property
    def guard_service_account_email(self) -> str:
        return f"{self.guard_service_account_id}@{self.project}.iam.gserviceaccount.com"

    @property
    def guard_role_id(self) -> str:
        return f"{self.deployment.replace('-', '_')}_billing_guard"

    @property
    def guard_queue(self) -> str:
        """The Cloud Tasks queue holding each node's deletion task (in the base's region)."""
        return f"projects/{self.project}/locations/{self.region}/queues/{self.deployment}-guard"

    # --- secrets and buckets
    @property
    def hf_token_secret_id(self) -> str:
        return f"{self.deployment}-hf-token"

    @property
    def api_key_secret_id(self) -> str:
        return f"{self.deployment}-api-key"

    @property
    def secret_ids(self) -> tuple[str, str]:
        return (self.hf_token_secret_id, self.api_key_secret_id)

    @property
    def cache_bucket(self) -> str:
        # Bucket names are global: the project id makes it unique. One bucket for every stack:
        # the cache key (not the stack) says when two nodes compile the same programs.
        return f"{self.project}-{self.deployment}-xla-cache"

    @property
    def weights_bucket(self) -> str:
        """Where the fleet stages the model's weights once (empty until then)."""
        return f"{self.project}-{self.deployment}-weights"

    @property
    def buckets(self) -> tuple[str, str]:
        return (self.cache_bucket, self.weights_bucket)

    @property
    def labels(self) -> dict[str, str]:
        return {DEPLOYMENT_LABEL: self.deployment, MANAGED_BY_LABEL: MANAGED_BY}
