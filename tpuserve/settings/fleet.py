"""The `[fleet]` section: N replicas of the one-chip server on GKE (the `fleet` stack).

More chips never mean tensor parallelism here (one KV head: TP=4 pays 4x the KV memory,
SPEC 4); they mean replicas of the measured one-chip server that GKE schedules, heals and
load-balances. Every figure a rule cites is SPEC's.
"""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tpuserve.kinds import POOL_MODELS
from tpuserve.settings import measured_rules
from tpuserve.settings.base import StrictModel, parse_duration, spec_error
from tpuserve.settings.string_rules import DURATION, check

# The node pools' models: the kinds that can be a GKE pool (tpuserve/kinds), flex first.
PoolModel = Literal[POOL_MODELS]  # type: ignore[valid-type]
# GKE: a flex-start node lives at most 7 days (max_run_duration of the node pool).
MAX_FLEX_NODE_SECONDS = 7 * 86400
# A placeholder digest the default config carries: synth accepts it (offline, no registry), the
# deploy step refuses it (tpuserve.gcp.kubectl): the fleet needs the image's real digest.
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
# The fleet's third-party images, each at the one tag whose manifest and flags the bundle is
# rendered from (templates/fleet/epp.yaml.j2, vendor/; the flags: vendor/upstream_flags.json).
# Neither upstream records the digest (the picker's v1.5.0 tree and release, k8s-stackdriver's
# manifests at af49d863 name only the tag), and no registry is reachable offline: the defaults
# carry the placeholder, which plan (data.external.image_preflight) and deploy refuse until the
# setting holds the tag's real digest.
PICKER_IMAGE_TAG = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
ADAPTER_IMAGE_TAG = "gcr.io/gke-release/custom-metrics-stackdriver-adapter:v0.16.9-gke.0"
_PINNED = {"fleet.picker_image": PICKER_IMAGE_TAG, "fleet.adapter_image": ADAPTER_IMAGE_TAG}
_PRIVATE_V4 = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def _private_range(setting: str, value: str, smallest: int, largest: int) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{setting} = {value!r}: not a CIDR ({exc})") from None
    if not (isinstance(net, ipaddress.IPv4Network) and largest <= net.prefixlen <= smallest
            and any(net.subnet_of(p) for p in _PRIVATE_V4)):
        raise ValueError(
            f"{setting} = {value!r}: must be a private IPv4 range (10/8, 172.16/12 or "
            f"192.168/16) from /{largest} to /{smallest}"
        )
    return value


class FleetSettings(StrictModel):
    """Replicas, where they run, how they scale, and the cluster's address ranges."""

    min_replicas: Annotated[int, Field(ge=1, le=256)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=256)] = 4
    # One TPU node pool per entry, tried in this order (a ComputeClass's priorities).
    provisioning: list[PoolModel] = Field(default_factory=lambda: ["flex", "spot"])
    # How long a flex-start node lives before GKE replaces it (at most 7 days).
    flex_max_run_duration: str = "7d"
    # HPA target: vLLM's `vllm:num_requests_waiting` per replica, on average.
    queue_target: Annotated[int, Field(ge=1, le=4096)] = 8
    # Add at most one replica per this many seconds, and keep a replica at least this long
    # after load falls: both from the measured boot (SPEC 4).
    # Kubernetes caps an HPA policy's periodSeconds at 1800 and a stabilization window at 3600.
    scale_up_period_s: Annotated[int, Field(ge=1, le=1800)] = 900
    scale_down_window_s: Annotated[int, Field(ge=0, le=3600)] = 900
    # The cluster's pods and services (secondary ranges of the base's subnet) and the
    # proxy-only subnet a regional Gateway needs.
    pods_cidr: str = "10.96.0.0/14"
    services_cidr: str = "10.100.0.0/20"
    proxy_only_cidr: str = "10.129.0.0/23"
    system_machine_type: str = "e2-standard-4"
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    # The endpoint picker (gateway-api-inference-extension v1.5.0's epp) and the custom-metrics
    # adapter, each `<PICKER|ADAPTER>_IMAGE_TAG@sha256:<digest>`: the tag is fixed (the bundle's
    # args and manifest are that tag's), the digest is the user's to set.
    picker_image: str = PICKER_IMAGE_TAG + "@" + PLACEHOLDER_DIGEST
    adapter_image: str = ADAPTER_IMAGE_TAG + "@" + PLACEHOLDER_DIGEST
    # A domain for a Google-managed certificate (Certificate Manager): HTTPS on 443. Unset:
    # plain HTTP on the Gateway's address (synth warns).
    domain: str | None = None

    @field_validator("provisioning")
    @classmethod
    def _order(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError(
                f"fleet.provisioning = {v!r}: an ordered list of distinct provisioning models "
                f"from {', '.join(POOL_MODELS)} (one TPU node pool each, tried in this order)"
            )
        return v

    @field_validator("flex_max_run_duration")
    @classmethod
    def _flex_duration(cls, v: str) -> str:
        check("fleet.flex_max_run_duration", v, DURATION)
        if not 0 < parse_duration(v) <= MAX_FLEX_NODE_SECONDS:
            raise spec_error("fleet.flex_max_run_duration", v, "must be more than 0 and at most 7d",
                             "GKE flex-start nodes run at most 7 days")
        return v

    @field_validator(*measured_rules.checked_fields("fleet", before=False))
    @classmethod
    def _measured(cls, v: object, info: ValidationInfo) -> object:
        # scale_up_period_s, scale_down_window_s: SPEC 4's boot times (settings/measured_rules)
        return measured_rules.enforce(f"fleet.{info.field_name}", v, info.data)

    @field_validator("pods_cidr")
    @classmethod
    def _pods(cls, v: str) -> str:
        return _private_range("fleet.pods_cidr", v, 21, 9)

    @field_validator("services_cidr")
    @classmethod
    def _services(cls, v: str) -> str:
        return _private_range("fleet.services_cidr", v, 27, 16)

    @field_validator("proxy_only_cidr")
    @classmethod
    def _proxy_only(cls, v: str) -> str:
        # Google: a proxy-only subnet of /26 at least; /23 recommended.
        return _private_range("fleet.proxy_only_cidr", v, 26, 8)

    @field_validator("system_machine_type")
    @classmethod
    def _machine(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]{1,10}-[a-z]+(?:-[0-9]{1,3})?", v):
            raise ValueError(f"fleet.system_machine_type = {v!r}: a Compute Engine machine type "
                             "like e2-standard-4")
        return v

    @field_validator("picker_image", "adapter_image")
    @classmethod
    def _pinned_image(cls, v: str, info: ValidationInfo) -> str:
        setting = f"fleet.{info.field_name}"
        tag = _PINNED[setting]
        if not re.fullmatch(re.escape(tag) + r"@sha256:[0-9a-f]{64}", v):
            raise ValueError(
                f"{setting} = {v[:160]!r}: must be {tag}@sha256:<64 hex> (the bundle's args "
                f"and manifest are that tag's, templates/fleet/vendor/upstream_flags.json; "
                f"the digest: "
                f"`crane digest {tag}`)")
        return v

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(
            r"(?=.{4,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}", v
        ):
            raise ValueError(f"fleet.domain = {v!r}: a lowercase DNS name like "
                             "llm.example.com (the managed certificate's name)")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> "FleetSettings":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"fleet.min_replicas = {self.min_replicas}: must be <= fleet.max_replicas "
                f"({self.max_replicas})"
            )
        nets = {name: ipaddress.ip_network(getattr(self, name))
                for name in ("pods_cidr", "services_cidr", "proxy_only_cidr")}
        names = list(nets)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if nets[a].overlaps(nets[b]):
                    raise ValueError(f"fleet.{a} = {str(nets[a])!r} overlaps fleet.{b} = "
                                     f"{str(nets[b])!r}: each range must be its own")
        return self

    @property
    def flex_max_run_seconds(self) -> int:
        return parse_duration(self.flex_max_run_duration)
