"""The config's sections other than [vllm]: gcp, tpu, access, pricing, cache, capacity and state
(each stack's own table: settings/stack.py). Every measured rule is a validator that names the
setting, the value, the rule and the measurement."""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from tpuserve.accelerators import ACCELERATORS, FAMILIES, Accelerator
from tpuserve.facts import (
    E2B_WEIGHTS_GIB,
    PRICES_USD_PER_CHIP_HOUR,
)
from tpuserve.gcp.endpoints import psc_root
from tpuserve.kinds import PRICE_KEYS
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.settings import measured_rules
from tpuserve.settings import string_rules as rules
from tpuserve.settings.base import (
    StrictModel,
    image_reference,
    spec_error,
)
from tpuserve.settings.measured_rules import MAX_USD_PER_CHIP_HOUR
from tpuserve.settings.string_rules import check, shown

# Subnets the project creates for itself: private IPv4 (RFC 1918) only, /8 to /29 (the
# smallest subnet Compute Engine accepts).
PRIVATE_V4 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                      "192.168.0.0/16"))


class GcpSettings(StrictModel):
    # config/default.toml's placeholder synthesizes offline; TPUSERVE_PROJECT sets a real one.
    project: str
    # SPEC 1: the only zone that accepted flex-start for v5litepod-1 where it was measured.
    # A zone measured to refuse a stack's accelerator and provisioning model is an error; one
    # no source names is a warning (tpuserve/zones.py: the table below).
    zone: str = "us-west4-a"
    # Unset: the project creates a network and subnet of its own (`<deployment>-net`), so the
    # firewall rules are the only ones that apply. Set: bring your own (nothing is created).
    network: str | None = None
    # Names the long-lived resources every stack of one deployment shares (the network).
    deployment: str = "tpuserve"
    # The subnet tpuserve creates in the zone's region (private IPv4; unused with a network).
    subnet_cidr: str = "10.64.0.0/20"
    # Where the billing guard's Cloud Tasks task calls the TPU API: unset, Google's production
    # root; set, a Private Service Connect endpoint (https://NAME.p.googleapis.com/). Never the
    # caller's CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU: the task runs in Google's cloud with the
    # guard account's token.
    tpu_api_endpoint: str | None = None

    @field_validator("tpu_api_endpoint")
    @classmethod
    def _tpu_api_endpoint(cls, v: str | None) -> str | None:
        return None if v is None else psc_root("gcp.tpu_api_endpoint", v)

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        # The guard's service account id is `<deployment>-guard`: 6-30 characters in all.
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,18}[a-z0-9]", v):
            raise ValueError(
                f"gcp.deployment = {v!r}: 2-20 lowercase letters, digits or hyphens, starting "
                "with a letter and not ending with a hyphen (it prefixes resource names such "
                "as the service account <deployment>-guard, at most 30 characters)"
            )
        return v

    @field_validator("subnet_cidr")
    @classmethod
    def _subnet_cidr(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError as exc:
            raise ValueError(f"gcp.subnet_cidr = {v!r}: not a CIDR ({exc})") from None
        if not (isinstance(net, ipaddress.IPv4Network) and 8 <= net.prefixlen <= 29
                and any(net.subnet_of(p) for p in PRIVATE_V4)):
            raise ValueError(
                f"gcp.subnet_cidr = {v!r}: must be a private IPv4 range (10/8, 172.16/12 or "
                "192.168/16) from /8 to /29 (Compute Engine subnets: RFC 1918, /29 smallest)"
            )
        return v

    @field_validator("project")
    @classmethod
    def _project_id(cls, v: str) -> str:
        return check("gcp.project", v, rules.PROJECT)

    @field_validator("zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        return check("gcp.zone", v, rules.ZONE)

    @field_validator("network")
    @classmethod
    def _network(cls, v: str | None) -> str | None:
        # None: tpuserve creates the deployment's network.
        return None if v is None else check("gcp.network", v, rules.NETWORK)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


class TpuSettings(StrictModel):
    # SPEC 1: the TPU API's spelling; "v5e-1" is prose only. The slices served are
    # tpuserve/accelerators.py's table.
    accelerator_type: str = "v5litepod-1"
    # Unset: the accelerator's own runtime (docs/accelerators.md: v5e's v2-alpha-tpuv5-lite is
    # SPEC 1's, measured; v6e's v2-alpha-tpuv6e is vendor).
    runtime_version: str | None = None

    @field_validator("runtime_version")
    @classmethod
    def _runtime(cls, v: str | None) -> str | None:
        return None if v is None else check("tpu.runtime_version", v, rules.RUNTIME_VERSION)

    @field_validator(*measured_rules.checked_fields("tpu", before=False))
    @classmethod
    def _measured(cls, v: object, info: ValidationInfo) -> object:
        return measured_rules.enforce(f"tpu.{info.field_name}", v, info.data)

    @model_validator(mode="after")
    def _runtime_of_the_accelerator(self) -> "TpuSettings":
        family = self.accelerator.family
        if self.runtime_version is None:
            # Derived from the accelerator: the settings hold what every stack renders.
            object.__setattr__(self, "runtime_version", family.runtime_version)
        else:
            other = next((f for f in FAMILIES if f is not family
                          and f.runtime_version == self.runtime_version), None)
            if other is not None:
                raise ValueError(
                    f"tpu.runtime_version = {self.runtime_version!r}: the {other.name} "
                    f"runtime cannot boot {self.accelerator_type} ({family.name}); unset it for "
                    f"{family.runtime_version!r} ({family.runtime_source})")
        return self

    @property
    def accelerator(self) -> Accelerator:
        """The accelerator table's row (tpuserve/accelerators.py)."""
        return ACCELERATORS[self.accelerator_type]

    @property
    def chips(self) -> int:
        return self.accelerator.chips


PROXY_IMAGE = ("nginx:1.30.5-alpine"
               "@sha256:0985e772fb9f729e6fa0980da05fca5d9c468e870eed43071545afa9d2e27d94")


def _no_ranges() -> list[str]:
    # A function, not the `list` builtin: pydantic reads a default factory's signature, and a
    # builtin's is parsed from its text by the tokenizer, whose first use compiles its
    # patterns (measured: ~5 ms of every start that loads the settings, on the 2-core dev VM).
    return []


class AccessSettings(StrictModel):
    # The API port is closed unless ranges are listed here.
    api_source_ranges: list[str] = Field(default_factory=_no_ranges)
    # SSH is open to Google's IAP range (tpuserve/facts.py IAP_RANGE) and to these ranges.
    ssh_source_ranges: list[str] = Field(default_factory=_no_ranges)
    # vLLM's --api-key guards only /v1; the proxy checks the key on every path but /health.
    api_key_proxy: bool = True
    # The official image, by tag and digest (the same for every stack): the digest is the one
    # docker-library/repo-info records for this tag, repos/nginx/remote/1.30.5-alpine.md at
    # commit 35d0d2e1b83352ed6b2de8c0784080e1784106bc (the multi-platform index; 1.30 is
    # nginx's stable line).
    proxy_image: str = PROXY_IMAGE
    # TLS on the public port, terminated by the proxy: "self-signed" makes a certificate on
    # the node (its key never leaves it) that the tpuserve CLI pins; "off" sends the key and
    # every prompt in clear text.
    tls: Literal["self-signed", "off"] = "self-signed"

    @property
    def tls_on(self) -> bool:
        """The proxy terminates TLS: with the proxy off, port 8000 is vLLM's plain HTTP."""
        return self.api_key_proxy and self.tls == "self-signed"

    @field_validator("proxy_image")
    @classmethod
    def _proxy_image(cls, v: str) -> str:
        return image_reference("access.proxy_image", v)

    @field_validator("api_source_ranges", "ssh_source_ranges")
    @classmethod
    def _cidrs(cls, v: list[str], info: ValidationInfo) -> list[str]:
        setting = f"access.{info.field_name}"
        if len(v) > 256:
            raise ValueError(f"{setting}: {len(v)} ranges; a firewall rule takes at most 256")
        for cidr in v:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                # ipaddress repeats the value: only a short printable one is worth its words.
                why = f" ({exc})" if re.fullmatch(r"[ -~]{1,64}", cidr) else ""
                raise ValueError(
                    f"{setting} = [{shown(cidr)}]: not a CIDR like 203.0.113.0/24{why}"
                ) from None
            if str(net) != cidr:  # a CIDR in its one canonical spelling, nothing around it
                raise ValueError(
                    f"{setting} = [{shown(cidr)}]: not a CIDR in canonical form (write {net})"
                )
        return v


Price = Annotated[float, Field(gt=0, le=MAX_USD_PER_CHIP_HOUR)]


class _Prices(StrictModel):
    """$/chip-hour of the deployment's accelerator in its region: a key set here stands; else
    the refreshed Catalog file, the shipped snapshot, then SPEC 2 (tpuserve/prices, docs/
    prices.md). catalog_file: the file `tpuserve prices refresh` writes, relative to the file
    that names it; unset, ~/.cache/tpuserve/prices.json where it exists; used while younger
    than 30 days."""

    # The file `tpuserve prices refresh` writes (relative to the file that names it); unset:
    # ~/.cache/tpuserve/prices.json where it exists. Used while younger than 30 days.
    catalog_file: str | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _measured_before(cls, v: object, info: ValidationInfo) -> object:
        return measured_rules.enforce(f"pricing.{info.field_name}", v, info.data)

    @field_validator("catalog_file")
    @classmethod
    def _catalog_file(cls, v: str | None) -> str | None:
        return None if v is None else check("pricing.catalog_file", v, rules.GEOMETRY_PATH)

    @property
    def catalog_path(self) -> Path | None:
        """catalog_file resolved (the default config's names are relative to config/)."""
        if self.catalog_file is None:
            return None
        return (DEFAULT_CONFIG.parent / self.catalog_file).resolve()

    def set_prices(self) -> dict[str, float]:
        """The $/chip-hour keys the user set: they stand over every other source."""
        return {k: getattr(self, k) for k in self.model_fields_set if k in PRICE_KEYS}


# One key per priced kind (tpuserve/kinds), in facts.py's order (spot, flex, ondemand: the
# order of every price table), defaulting to its measured list price.
PricingSettings = create_model(
    "PricingSettings", __base__=_Prices, __module__=__name__, __doc__=_Prices.__doc__,
    **{k: (Price, v) for k, v in PRICES_USD_PER_CHIP_HOUR.items() if k in PRICE_KEYS},
)


class CacheSettings(StrictModel):
    """The XLA compile cache in a per-stack Cloud Storage bucket (SPEC 4: a warm boot is faster)."""

    # The base's bucket holds one cache per configuration: a new node restarts warm (SPEC 4).
    enabled: bool = True
    # Days a cache may go unused before the bucket deletes it: every healthy boot that restores
    # or publishes it renews its object's customTime (lifecycle days_since_custom_time).
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class CapacitySettings(StrictModel):
    """Inputs of the capacity planner (SPEC 5-6) that synth checks against the KV pool."""

    # A Hugging Face config.json, relative to the file that names it (the default config's
    # names are relative to config/). Unset: the model's file in config/models/ (the default
    # model's is the measured one); another model without either is refused (model_inputs.py).
    model_geometry: str = "models/gemma-4-E2B-it.json"
    # SPEC 5: resident bf16 weights measured on the chip (vision and audio towers included),
    # Gemma 4 E2B's only: another model must set this or weights_index.
    weights_gib: Annotated[float, Field(gt=0, le=1024)] = E2B_WEIGHTS_GIB
    # A model.safetensors.index.json (same path rule): weights = its metadata.total_size, a
    # derived upper bound (towers and the checkpoint's dtype included).
    weights_index: str | None = None
    # A directory of your own measured profiles (`tpuserve tune` records its runs there, one
    # TOML file per model, accelerator and image digest: settings/learned_profiles.py), beside
    # the shipped ones, relative to the file that names it; unset: none. Its refusals are
    # validators; `plan` uses its measurements where vllm.image pins that digest and the flags
    # are the measured ones (docs/tune.md).
    profiles_dir: str | None = None
    # The load you plan for; synth warns when clients x context passes the KV wall (SPEC 6).
    expected_clients: Annotated[int, Field(ge=1, le=1_000_000)] | None = 16
    expected_context: Annotated[int, Field(ge=1, le=1 << 24)] | None = 1024

    @field_validator("model_geometry")
    @classmethod
    def _geometry(cls, v: str) -> str:
        return check("capacity.model_geometry", v, rules.GEOMETRY_PATH)

    @field_validator("weights_index")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        return None if v is None else check("capacity.weights_index", v, rules.GEOMETRY_PATH)

    @field_validator("profiles_dir")
    @classmethod
    def _profiles_dir(cls, v: str | None) -> str | None:
        return None if v is None else check("capacity.profiles_dir", v, rules.PROFILES_DIR)

    @model_validator(mode="after")
    def _one_weights_figure(self) -> "CapacitySettings":
        if self.weights_index is not None and "weights_gib" in self.model_fields_set:
            raise ValueError(
                f"capacity.weights_gib = {self.weights_gib} and capacity.weights_index = "
                f"{self.weights_index!r}: set one weights figure, not both (weights_index's "
                "metadata.total_size is derived, weights_gib is yours)")
        return self

    @model_validator(mode="after")
    def _both_or_neither(self) -> "CapacitySettings":
        if (self.expected_clients is None) != (self.expected_context is None):
            raise ValueError(
                "capacity.expected_clients and capacity.expected_context go together: "
                "set both or neither"
            )
        return self

    @property
    def geometry_path(self) -> Path:
        return (DEFAULT_CONFIG.parent / self.model_geometry).resolve()

    @property
    def profiles_dir_path(self) -> Path | None:
        if self.profiles_dir is None:
            return None
        return (DEFAULT_CONFIG.parent / self.profiles_dir).resolve()

    @property
    def weights_index_path(self) -> Path | None:
        if self.weights_index is None:
            return None
        return (DEFAULT_CONFIG.parent / self.weights_index).resolve()


class StateSettings(StrictModel):
    """Where Terraform keeps each stack's state: local files, or a GCS bucket for teams/CI."""

    # Unset: terraform.<stack>.tfstate files; a bucket for a team, and for the plan-review
    # workflow's `cdktf diff` to see what is deployed.
    gcs_bucket: str | None = None
    gcs_prefix: str = "tpuserve"

    @field_validator("gcs_bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is not None:
            check("state.gcs_bucket", v, rules.GCS_BUCKET)
            if len(v) < 3 or any(len(part) > 63 for part in v.split(".")):
                raise spec_error("state.gcs_bucket", v, "3-222 characters, 63 at most a part",
                                  "Cloud Storage bucket naming rules")
        return v

    @field_validator("gcs_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        return check("state.gcs_prefix", v, rules.GCS_PREFIX)
