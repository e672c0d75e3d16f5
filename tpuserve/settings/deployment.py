"""One stack of one deployment: every section validated together, and the names derived from it."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    Field,
    model_validator,
)

from tpuserve.facts import FLEX_ZONES_BAD, FLEX_ZONES_GOOD
from tpuserve.settings import string_rules as rules
from tpuserve.settings.base import StrictModel, spec_error
from tpuserve.settings.sections import (
    AccessSettings,
    CacheSettings,
    CapacitySettings,
    GcpSettings,
    PricingSettings,
    StackSettings,
    StateSettings,
    TpuSettings,
)
from tpuserve.settings.string_rules import check
from tpuserve.settings.vllm import VllmSettings


class Deployment(StrictModel):
    """One stack's validated configuration."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,11}$")]
    gcp: GcpSettings
    tpu: TpuSettings = Field(default_factory=TpuSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    state: StateSettings = Field(default_factory=StateSettings)
    stack: StackSettings

    @model_validator(mode="after")
    def _label_values(self) -> Deployment:
        # Derived, but checked: a label value reaches Terraform and the TPU API.
        for key, value in self.labels.items():
            check(f"labels.{key} (derived from the config)", value, rules.LABEL_VALUE)
        return self

    @model_validator(mode="after")
    def _tp_chips(self) -> Deployment:
        if self.vllm.tensor_parallel_size > self.tpu.chips:
            raise spec_error(
                "vllm.tensor_parallel_size", self.vllm.tensor_parallel_size,
                f"must be <= the {self.tpu.chips} chip(s) of {self.tpu.accelerator_type}",
                "SPEC 4: tensor parallelism splits the model across chips",
            )
        return self

    @model_validator(mode="after")
    def _flex_zone(self) -> Deployment:
        zone, accel = self.gcp.zone, self.tpu.accelerator_type
        if self.stack.provisioning_model == "flex" and accel == "v5litepod-1" and (
            zone in FLEX_ZONES_BAD
        ):
            raise spec_error(
                "gcp.zone", zone,
                f"flex-start does not take {accel} there; use {next(iter(FLEX_ZONES_GOOD))} "
                "(set TPUSERVE_ZONE)",
                f"{FLEX_ZONES_BAD[zone]}: the API answered 'FLEX_START provisioning model is "
                f'not supported for accelerator type "{accel}"\'',
            )
        return self

    @property
    def node_name(self) -> str:
        return f"tpuserve-{self.name}"

    @property
    def tpu_parent(self) -> str:
        """Where the TPU API keeps the node (and the flex stack's queued resource)."""
        return f"projects/{self.gcp.project}/locations/{self.gcp.zone}"

    @property
    def queued_resource_name(self) -> str:
        """The flex queued resource is named like its node (`gcloud ... describe tpuserve-flex`)."""
        return f"{self.tpu_parent}/queuedResources/{self.node_name}"

    @property
    def network_tag(self) -> str:
        return f"tpuserve-{self.name}"

    # Long-lived resources are named for the deployment, not the stack: a shared base will
    # hold them (ARCHITECTURE "Conventions").
    @property
    def creates_network(self) -> bool:
        return self.gcp.network is None

    @property
    def network_name(self) -> str:
        return self.gcp.network or f"{self.gcp.deployment}-net"

    @property
    def subnet_name(self) -> str | None:
        """The subnet the project creates; None when the user brings a network."""
        return f"{self.gcp.deployment}-net-{self.gcp.region}" if self.creates_network else None

    @property
    def has_billing_guard(self) -> bool:
        return self.stack.provisioning_model != "flex" and self.stack.max_run_hours > 0

    @property
    def guard_service_account_id(self) -> str:
        return f"{self.gcp.deployment}-guard"

    @property
    def guard_service_account_email(self) -> str:
        return f"{self.guard_service_account_id}@{self.gcp.project}.iam.gserviceaccount.com"

    @property
    def guard_queue(self) -> str:
        """The Cloud Tasks queue holding each node's deletion task (in the zone's region)."""
        return (f"projects/{self.gcp.project}/locations/{self.gcp.region}/queues/"
                f"{self.gcp.deployment}-guard")

    @property
    def node_path(self) -> str:
        return f"projects/{self.gcp.project}/locations/{self.gcp.zone}/nodes/{self.node_name}"

    # Names carry the stack name so the three stacks can live side by side in one project.
    @property
    def service_account_id(self) -> str:
        return f"tpuserve-{self.name}-vm"

    @property
    def service_account_email(self) -> str:
        return f"{self.service_account_id}@{self.gcp.project}.iam.gserviceaccount.com"

    @property
    def hf_token_secret_id(self) -> str:
        return f"tpuserve-{self.name}-hf-token"

    @property
    def api_key_secret_id(self) -> str:
        return f"tpuserve-{self.name}-api-key"

    @property
    def cache_bucket(self) -> str:
        # Bucket names are global: the project id makes it unique.
        return f"{self.gcp.project}-tpuserve-{self.name}-xla-cache"

    @property
    def usd_per_hour(self) -> float:
        return getattr(self.pricing, self.stack.provisioning_model) * self.tpu.chips

    @property
    def labels(self) -> dict[str, str]:
        return {
            "stack": self.name,
            "model": re.sub(r"[^a-z0-9_-]", "-", self.vllm.model.lower())[:63],
            "provisioning-model": self.stack.provisioning_model,
            "managed-by": "tpuserve",
        }


