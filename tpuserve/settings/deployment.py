"""One stack of one deployment: every section validated together, and the names derived from it."""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

import ipaddress
import re
from typing import Annotated, Any

from pydantic import (
    Field,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from tpuserve.contracts import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL, STACK_LABEL
from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR
from tpuserve.kinds import KINDS, STACK_NAMES, Kind, words
from tpuserve.prices import (
    SETTING_SOURCE,
    Price,
    PriceFileError,
    price_of,
    region_of,
    standin_source,
)
from tpuserve.settings import string_rules as rules
from tpuserve.settings.accelerator_rules import settled_vllm
from tpuserve.settings.base import StrictModel, spec_error
from tpuserve.settings.base_stack import Base
from tpuserve.settings.fleet import FleetSettings
from tpuserve.settings.monitoring import MonitoringSettings
from tpuserve.settings.sections import (
    AccessSettings,
    CacheSettings,
    CapacitySettings,
    GcpSettings,
    PricingSettings,
    StateSettings,
    TpuSettings,
)
from tpuserve.settings.stack import GuardedVmStackSettings, StackSettings, of_kind
from tpuserve.settings.string_rules import check
from tpuserve.settings.tune import TuneSettings
from tpuserve.settings.vllm import VllmSettings
from tpuserve.zones import Offer, stack_zones


class Deployment(StrictModel):
    """One stack's validated configuration."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,11}$")]
    gcp: GcpSettings
    # Each absent section is its model's defaults. A lambda, not the class: pydantic reads a
    # default factory's signature, and a model's is built field by field (start-up: bench/cli).
    tpu: TpuSettings = Field(default_factory=lambda: TpuSettings())
    vllm: VllmSettings = Field(default_factory=lambda: VllmSettings())
    access: AccessSettings = Field(default_factory=lambda: AccessSettings())
    pricing: PricingSettings = Field(default_factory=lambda: PricingSettings())
    cache: CacheSettings = Field(default_factory=lambda: CacheSettings())
    capacity: CapacitySettings = Field(default_factory=lambda: CapacitySettings())
    state: StateSettings = Field(default_factory=lambda: StateSettings())
    tune: TuneSettings = Field(default_factory=lambda: TuneSettings())  # `tpuserve tune` only
    # Validated in every stack (the top-level [fleet] fails alike everywhere), kept only by a
    # kind on GKE: None in the others (_fleet_section_is_the_fleets).
    fleet: FleetSettings | None = Field(default_factory=lambda: FleetSettings())
    # The deployment's (the base holds it); every stack must agree on it (stacks/monitoring.py).
    monitoring: MonitoringSettings = Field(default_factory=lambda: MonitoringSettings())
    # Its kind's own settings (settings/stack.py): a discriminated union on provisioning_model.
    stack: SerializeAsAny[StackSettings]

    @field_validator("stack", mode="wrap")
    @classmethod
    def _stack_of_its_kind(cls, v: object, _handler: object) -> StackSettings:
        return of_kind(v)

    @model_validator(mode="after")
    def _fleet_is_its_own_kind(self) -> "Deployment":
        # The stack named `fleet` runs on GKE; no other stack may, and it may run nothing else.
        for k in KINDS:
            if k.name_bound and (self.name == k.name) != (self.kind is k):
                raise spec_error(
                    "stack.provisioning_model", self.stack.provisioning_model,
                    f"the stack named {k.name}, and only it, has provisioning_model = "
                    f"{k.provisioning_model!r} (its node pools' models are [fleet] provisioning)",
                    f"a serving stack's name is what it runs on: {words(STACK_NAMES)}",
                )
        return self

    @model_validator(mode="after")
    def _fleet_ranges_apart_from_the_subnet(self) -> "Deployment":
        if not self.kind.on_gke:
            return self
        subnet = ipaddress.ip_network(self.gcp.subnet_cidr)
        for name in ("pods_cidr", "services_cidr", "proxy_only_cidr"):
            net = ipaddress.ip_network(getattr(self.fleet, name))
            if net.overlaps(subnet):
                raise ValueError(
                    f"fleet.{name} = {str(net)!r} overlaps gcp.subnet_cidr = "
                    f"{self.gcp.subnet_cidr!r}: the cluster's ranges live beside the subnet"
                )
        return self

    @model_validator(mode="after")
    def _label_values(self) -> "Deployment":
        # Derived, but checked: a label value reaches Terraform and the TPU API.
        for key, value in self.labels.items():
            check(f"labels.{key} (derived from the config)", value, rules.LABEL_VALUE)
        return self

    @model_validator(mode="after")
    def _vllm_of_the_slice(self) -> "Deployment":
        # The accelerator derives TP and the memory ceiling, and refuses what cannot serve
        # (settings/accelerator_rules.py); the settings then hold what every stack renders.
        vllm = settled_vllm(self.vllm, self.tpu.accelerator, kind_title=self.kind.title,
                            on_gke=self.kind.on_gke)
        object.__setattr__(self, "vllm", vllm)
        return self

    @model_validator(mode="after")
    def _zone_offers(self) -> "Deployment":
        # A zone measured (or documented) to refuse what the stack asks of it (tpuserve/
        # zones.py: a TPU VM's provisioning model, or each fleet node pool's) fails here,
        # before anything is deployed; an unknown one only warns.
        pools = self.fleet.provisioning if self.fleet is not None else ()
        for need in stack_zones(self.kind, self.tpu.accelerator_type, self.gcp.zone, pools):
            if need.fact.state is not Offer.REFUSED:
                continue
            good = next(iter(need.known_good), None)
            use = f"use {good} (set TPUSERVE_ZONE), or " if good else ""
            drop = (f"drop it from {need.setting}, or " if need.setting != "gcp.zone" else "")
            raise spec_error(
                "gcp.zone", self.gcp.zone,
                f"{need.what} does not take {self.tpu.accelerator_type} there; {use}{drop}set "
                f"[stacks.{self.name}] enabled = false to synthesize the other stacks without it",
                need.fact.source,
            )
        return self

    @model_validator(mode="after")
    def _price_file_reads(self) -> "Deployment":
        # A price file that is named (or present at the default path) and malformed proves
        # nothing: refused here, one line, before anything is deployed; never skipped.
        if self.kind.on_gke and self.fleet is None:
            return self
        try:
            for model in self.price_keys:
                self.book_price(model)
        except PriceFileError as exc:
            named = self.pricing.catalog_file is not None
            raise ValueError(
                f"pricing.catalog_file = {str(exc.path)[:200]!r}"
                f"{'' if named else ' (unset: the default path)'}: {exc.where}: {exc.why}; "
                "rewrite it with `tpuserve prices refresh` or remove it") from None
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _fleet_section_is_the_fleets(cls, data: object, handler: Any) -> "Deployment":
        d: Deployment = handler(data)
        return d if d.kind.on_gke or d.fleet is None else d.model_copy(update={"fleet": None})

    @property
    def base(self) -> Base:
        """The deployment's long-lived base this stack stands on (settings/base_stack.py)."""
        return Base(gcp=self.gcp, cache=self.cache, state=self.state)

    @property
    def node_name(self) -> str:
        return f"{self.gcp.deployment}-{self.name}"

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
        return self.node_name

    @property
    def node_path(self) -> str:
        return f"{self.tpu_parent}/nodes/{self.node_name}"

    @property
    def kind(self) -> Kind:
        """The stack's kind (tpuserve/kinds): what it runs on and how it is run."""
        return self.stack.kind

    @property
    def has_billing_guard(self) -> bool:
        stack = self.stack
        return self.kind.billing_guard and isinstance(stack, GuardedVmStackSettings) and (
            stack.max_run_hours > 0)

    # What the base holds, by name (settings/base_stack.py): one source for every stack.
    @property
    def network_name(self) -> str:
        return self.base.network_name

    @property
    def subnet_name(self) -> str | None:
        return self.base.subnet_name

    @property
    def service_account_email(self) -> str:
        return self.base.node_service_account_email

    @property
    def guard_service_account_email(self) -> str:
        return self.base.guard_service_account_email

    @property
    def guard_queue(self) -> str:
        return self.base.guard_queue

    @property
    def hf_token_secret_id(self) -> str:
        return self.base.hf_token_secret_id

    @property
    def api_key_secret_id(self) -> str:
        return self.base.api_key_secret_id

    @property
    def cache_bucket(self) -> str:
        return self.base.cache_bucket

    @property
    def usd_per_hour(self) -> float:
        """$/hour of one server: for the fleet, one replica in its first-choice pool."""
        return self.price.usd_per_chip_hour * self.tpu.chips

    @property
    def price_key(self) -> str:
        """The [pricing] key of one server: the kind's, or the fleet's first-choice pool's."""
        return self.kind.price_key or self.fleet.provisioning[0]

    @property
    def price_keys(self) -> tuple[str, ...]:
        """Every provisioning model this stack bills under (the fleet: each pool's)."""
        return (self.kind.price_key,) if self.kind.price_key else tuple(self.fleet.provisioning)

    @property
    def region(self) -> str:
        return region_of(self.gcp.zone)

    @property
    def price(self) -> Price:
        """One chip-hour of one server (the price_key's): see price_for."""
        return self.price_for(self.price_key)

    def book_price(self, model: str) -> Price | None:
        """What tpuserve/prices says a chip-hour of this accelerator costs in this region under
        MODEL (refreshed file, snapshot, SPEC 2); None where no source names a price."""
        return price_of(self.tpu.accelerator_type, self.region, model,
                        catalog_file=self.pricing.catalog_path)

    def price_for(self, model: str) -> Price:
        """A [pricing] key the user set; else the book's price for this accelerator in this
        region; else (no source prices it) [pricing]'s default, SPEC 2's v5e us-west4 figure,
        which synth warns about (settings/warnings.py): a stack is still synthesized and its
        guard still bounds it, its price's source a `stand-in: ...` (Price.standin), never
        `SPEC 2`, so no line shows it as SPEC 2's price of this chip here."""
        if model in self.pricing.model_fields_set:
            return Price(getattr(self.pricing, model), SETTING_SOURCE, "")
        return self.book_price(model) or Price(
            getattr(self.pricing, model),
            standin_source(self.tpu.accelerator_type, model, self.region), "")

    def sourced_prices(self) -> dict[str, Price]:
        """Every provisioning model (commitments included) that a source prices for this
        accelerator in this region, with its Price: a [pricing] key the user set, else the
        book. No stand-in: the planner shows no column it would have to price with another
        chip's or region's figure (SPEC 2's commitments are v5e's in us-west4)."""
        out = {}
        for m in PRICES_USD_PER_CHIP_HOUR:
            if m in type(self.pricing).model_fields and m in self.pricing.model_fields_set:
                out[m] = Price(getattr(self.pricing, m), SETTING_SOURCE, "")
            elif (p := self.book_price(m)) is not None:
                out[m] = p
        return out

    def sourced_chip_prices(self) -> dict[str, float]:
        """sourced_prices' $/chip-hour figures (the plan's columns)."""
        return {m: p.usd_per_chip_hour for m, p in self.sourced_prices().items()}

    def chip_prices(self) -> dict[str, float]:
        """$/chip-hour per priced provisioning model, as price_for answers (the planner's)."""
        return {m: self.price_for(m).usd_per_chip_hour
                for m in type(self.pricing).model_fields if m != "catalog_file"}

    @property
    def labels(self) -> dict[str, str]:
        return {
            STACK_LABEL: self.name,
            "model": re.sub(r"[^a-z0-9_-]", "-", self.vllm.model.lower())[:63],
            "provisioning-model": self.stack.provisioning_model,
            MANAGED_BY_LABEL: MANAGED_BY,
            DEPLOYMENT_LABEL: self.gcp.deployment,
        }


